"""Where things are: the companion's data, the results stores, and the repository checkout.

`data/` ships with the package as `helpers.data` (pyproject maps it), so it is found the same way
in an editable checkout and in an installed wheel; `GA_DATA` points elsewhere (e.g. a zoo rebuilt
into another folder). Results go to `GA_RESULTS`, else `./results`. Imports nothing heavy.
"""

from __future__ import annotations

import os
from functools import cache
from importlib.resources import files
from pathlib import Path


def data() -> Path:
    """The data folder: fixtures, reference numbers, paper configs, the toy zoo."""
    override = os.environ.get("GA_DATA")
    return Path(override) if override else Path(str(files("helpers.data")))


def results_dir(chapter: str) -> Path:
    """Where a chapter keeps its results stores (`$GA_RESULTS/<chapter>`, else ./results)."""
    path = Path(os.environ.get("GA_RESULTS", "results")) / chapter
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_dir() -> Path:
    """Where large files assembled from packages go (`GA_CACHE`, else ~/.cache/ga-companion)."""
    path = Path(os.environ.get("GA_CACHE") or Path.home() / ".cache" / "ga-companion")
    path.mkdir(parents=True, exist_ok=True)
    return path


@cache
def repository() -> Path:
    """The checkout the book is built from: the folder above the working directory that holds
    `_toc.yml` (`make` runs from there), else the one above the installed data folder."""
    for start in (Path.cwd(), data()):
        for folder in (start, *start.parents):
            if (folder / "_toc.yml").exists() and (folder / "pyproject.toml").exists():
                return folder
    raise FileNotFoundError(
        "no book checkout found (a folder with _toc.yml and pyproject.toml): "
        "run from the repository's root"
    )


@cache
def _revisions() -> dict:
    import json

    return json.loads((data() / "configs" / "revisions.json").read_text())


def pinned_revision(kind: str, repo: str) -> str | None:
    """The hub commit `data/configs/revisions.json` pins for a model or dataset repo (`kind`:
    "models" or "datasets"), or None where it pins none (the hub's main is loaded)."""
    revision = _revisions()[kind].get(repo)
    if revision is not None and not (
        len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)
    ):
        raise ValueError(
            f"data/configs/revisions.json pins {repo} to {revision!r}: write the 40-hex commit, or null"
        )
    return revision
