"""Resumable sweeps: every finished cell of a sweep is appended to a JSON-lines file at once,
so an interrupted sweep, run again, computes only what is missing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterable

from .progress import bar


ROOT = Path(__file__).resolve().parents[2]


def results_dir(chapter: str) -> Path:
    """Where a chapter keeps its results store and figures (`$GA_RESULTS` or ./results)."""
    path = Path(os.environ.get("GA_RESULTS", ROOT / "results")) / chapter
    path.mkdir(parents=True, exist_ok=True)
    return path


def _key(cell: dict) -> str:
    return json.dumps(cell, sort_keys=True)


class Store:
    """A dict from a sweep cell (a JSON-able dict of its settings) to its result, backed by an
    append-only JSON-lines file."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._done: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by an interruption
                    continue
                self._done[_key(row["cell"])] = row["result"]

    def __contains__(self, cell: dict) -> bool:
        return _key(cell) in self._done

    def __getitem__(self, cell: dict) -> dict:
        return self._done[_key(cell)]

    def __len__(self) -> int:
        return len(self._done)

    def put(self, cell: dict, result: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"cell": cell, "result": result}) + "\n")
        self._done[_key(cell)] = result


def sweep(store: Store, cells: Iterable[dict], run: Callable[[dict], dict], desc: str = "sweep") -> list[dict]:
    """Results for every cell, in order, computing (with a progress bar) only the missing ones.
    Each returned row is the cell's settings merged with its result."""
    cells = list(cells)
    todo = [c for c in cells if c not in store]
    for cell in bar(todo, desc=f"{desc} ({len(cells) - len(todo)} cached)", disable=not todo):
        store.put(cell, run(cell))
    return [{**c, **store[c]} for c in cells]
