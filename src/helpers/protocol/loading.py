"""The models a run and its measurements use: loaded once per process where they are small, held
by name so that a measurement (a module-level function of a cell) finds the chapter's own model,
and kept one paper model at a time in a Ray worker."""

from __future__ import annotations

import weakref
from functools import lru_cache
from typing import Any

from .. import registry


@lru_cache(maxsize=None)
def _small(name: str):
    from ..models import load

    return load(name)


def load(name: str):
    """A model for a run: the CPU tier's small models are loaded once per process (every
    intervention leaves them as it found them); a paper model is loaded afresh, so that a chapter
    that goes through several 8B models holds one at a time."""
    from ..models import load as load_model

    return hold(_small(name) if registry.spec(name).profile == "cpu" else load_model(name))


# name -> the model this process runs
_held_models: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
# the paper model a Ray worker loaded for its measurements (one at a time)
_kept: dict[str, Any] = {}


def hold(loaded):
    """Make `loaded` the model that a measurement asking for its name gets in this process
    (`model_for`), as long as something else holds it; returns it."""
    _held_models[loaded.name] = loaded
    return loaded


def model_for(name: str):
    """The model a measurement (a module-level function of a cell, `runner`) runs, by name: the
    one this process already holds (the chapter's own in process, so nothing loads twice), else
    loaded here and kept, so that a Ray worker loads each model once; a worker keeps one paper
    model at a time (the next one's load lets go of it)."""
    return models_for(name)[0]


def models_for(*names: str) -> list:
    """`model_for` of a measurement that runs several models together (a student and its
    teacher): a worker keeps all of them, and lets go of any other paper model it kept."""
    found = [_held_models.get(n) for n in names]
    if any(f is None for f in found):
        for other in [k for k in _kept if k not in names]:
            del _kept[other]
        found = [f if f is not None else _kept.setdefault(n, load(n)) for n, f in zip(names, found)]
    return found
