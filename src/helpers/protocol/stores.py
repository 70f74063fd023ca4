"""A chapter's results stores: one file per part of a run, named by the code and data that compute
it and the numerics that round it, with a sidecar of the models' revisions (`open_store`)."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Callable, Sequence

from .. import packing, paths, provenance, registry, runner
from ..errors import StaleResults, StoreError
from ..sweep import Store, os_error, writable
from ..sweep import lock as store_lock


def numerics_tag(loaded: list) -> str:
    """What decides a store's rounding, for its file name: the models' dtypes ("bfloat16-"; ""
    without models) and the batch budget where `GA_BATCH_TOKENS` sets one ("b128-"), so that a
    rerun in another dtype (`GA_DTYPE`) or batch shape neither reads nor mixes in the other's
    results."""
    modules = [getattr(m, "model", m) for m in loaded]
    weights = [next(m.parameters(), None) for m in modules if hasattr(m, "parameters")]
    dtypes = sorted({str(w.dtype).removeprefix("torch.") for w in weights if w is not None})
    budget = packing.batch_tokens_set()
    return "".join(f"{d}-" for d in dtypes) + (f"b{budget}-" if budget and dtypes else "")


def open_store(
    chapter: str, profile: str, part: str, loaded: list, reads: Callable | Sequence = ()
) -> Store:
    """The results store of one part of a chapter's run, filled by the measurement functions
    `reads` (one, or several; a closure counts as the function it is defined in).

    Its file name carries what rounds its numbers (`numerics_tag`: the models' dtype and the
    batch budget `GA_BATCH_TOKENS` sets) and the version of the code and data
    that `reads` compute with (`provenance.measurement_version`: their own module as far as they
    reach it, and every module it imports), so results of other code are never mixed in, and
    editing a figure, a table, a verdict rule or a chapter's prose recomputes nothing. `sweep`
    refuses to fill the store with a function that is not among `reads`. Without `reads`, or
    with functions from outside the package (a test, a notebook that may call anything), the
    version is the whole package's (`provenance.code_version`). A cell's key is its settings, so
    what a measurement reads from a setting must be in its cell. A sidecar
    (`<part>.models.json`) records the models' revisions, and a store written with other weights
    under the same names stops the run with the fix. The sidecar is checked and written holding
    the store's lock, swapped in whole (a full disk leaves the old one) and only when it changes.
    A store without its sidecar is not trusted: nothing says which weights computed it. The
    page's record lists the stores a chapter opened (`record`'s "stores")."""
    owners = sorted({runner.owner(r) for r in ([reads] if callable(reads) else reads)})
    modules = {o.partition(":")[0] for o in owners}
    inside = bool(modules) and all(m.partition(".")[0] == provenance.TOP for m in modules)
    if inside and len(modules) > 1:
        raise ValueError(f"a store's measurements come from one module, got {', '.join(owners)}")
    version = (
        provenance.measurement_version(
            modules.pop(), reads=tuple(o.partition(":")[2] for o in owners)
        )
        if inside
        else provenance.code_version()
    )
    try:
        folder = paths.results_dir(chapter)
    except OSError as e:
        raise os_error(
            Path(os.environ.get("GA_RESULTS", "results")) / chapter, "create the results folder", e
        ) from None
    path = folder / f"{part}-{profile}-{numerics_tag(loaded)}{version}.jsonl"
    meta = path.with_suffix(".models.json")
    revisions = {m.name: m.revision for m in loaded}
    with store_lock(path):
        # a sidecar write killed before its rename left its temporary file (nothing writes one now)
        if writable(path):
            for stale in folder.glob(f"{glob.escape(meta.name)}.*.tmp"):
                stale.unlink(missing_ok=True)
        recorded = _recorded_revisions(meta, path)
        if recorded is None and path.exists() and path.stat().st_size > 0:
            raise StaleResults(
                f"{path} holds results but its sidecar {meta} is missing, so nothing says which weights "
                f"computed them: delete {path} to compute them again, or set GA_RESULTS to a fresh folder"
            )
        recorded = recorded or {}
        store = Store(path, reads=owners)
        # This run's models whose results the store holds must be in the sidecar already: else
        # writing their revisions now would certify results of unknown weights.
        # usually none: the records are read only when there are
        new = set(revisions) - set(recorded)
        if new and (unnamed := sorted(models_named(store.cells()) & new)):
            raise StaleResults(
                f"{path} holds results of {', '.join(unnamed)} but its sidecar {meta} does not say which "
                f"weights computed them: delete {path} and {meta} to compute them again, or set "
                f"GA_RESULTS to a fresh folder"
            )
        changed = {
            k: (recorded[k], v) for k, v in revisions.items() if k in recorded and recorded[k] != v
        }
        if changed:
            raise StaleResults(
                f"{path} holds results of other weights ({', '.join(f'{k}: {a} -> now {b}' for k, (a, b) in changed.items())}): "
                f"delete {path} and {meta} to compute them again, or set GA_RESULTS to a fresh folder"
            )
        if {**recorded, **revisions} != recorded or not meta.exists():
            _replace(meta, json.dumps({**recorded, **revisions}, indent=1))
        _opened.setdefault(chapter, {})[path.name] = None
        return store


def models_named(cells) -> set[str]:
    """The registered models the cells name anywhere in their settings: the ones whose weights
    computed their results."""

    def strings(value):
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    return {s for cell in cells for s in strings(cell) if s in registry.MODELS}


# chapter -> the store files (names) this process opened, in order
_opened: dict[str, dict[str, None]] = {}


def opened(chapter: str) -> list[str]:
    """The names of the store files of `chapter` this process opened, in order (a page links them:
    `book.run_stores`)."""
    return list(_opened.get(chapter, {}))


def _recorded_revisions(meta: Path, path: Path) -> dict[str, str] | None:
    """The sidecar's {model name: revision}, None if there is none; unreadable: the fix."""
    try:
        text = meta.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise os_error(meta, "read the store's sidecar", e) from None
    try:
        recorded = json.loads(text)
    except ValueError as e:
        recorded = e
    if not isinstance(recorded, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in recorded.items()
    ):
        what = (
            f"not JSON ({recorded})"
            if isinstance(recorded, ValueError)
            else f"not a mapping of model names to revisions ({type(recorded).__name__})"
        )
        raise StoreError(
            f"{meta}, the record of which weights computed {path}, is {what} (a write cut short, e.g. "
            f"by a full disk): delete both files to compute the results again, or set GA_RESULTS to a "
            f"fresh folder"
        )
    return recorded


def _replace(target: Path, text: str) -> None:
    """Write `target` whole or not at all: a temporary file beside it, synced, then renamed over it."""
    fresh = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        with open(fresh, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(fresh, target)
    except OSError as e:
        fresh.unlink(missing_ok=True)
        raise os_error(target, "write the store's sidecar", e) from None
