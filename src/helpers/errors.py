"""The mistakes a user can make, one error type per kind, each message naming what is valid;
and the one rule for what counts as an integer argument, which every check applies.
Imports nothing (leaf modules such as `tasks` use it without pulling torch in)."""

import operator


class InterventionError(ValueError):
    """An intervention this model cannot take (a layer or head out of range, a mask of the wrong
    shape, ...); the message says what is valid."""


class ConfigError(ValueError):
    """A parameter that cannot run: a chapter's or a task loader's (an unknown profile, a count
    that is not positive, ...) or a model configuration's (head counts that do not divide the
    width); the message lists the valid values. Raised before any model is loaded or built."""


class StoreError(ValueError):
    """A sweep cell or result that a results store cannot keep (not a dict of JSON values; the
    message names the cell, raised before anything is written), or a store the operating system
    will not let us read or write (a read-only folder, a full disk, a results path that is a file;
    the message names the file and GA_RESULTS)."""


class StaleResults(RuntimeError):
    """A results store written by other code or other weights than this run's; the message
    says how to start afresh."""


def as_index(value) -> int | None:
    """`value` as a Python int if it is an integer, else None.

    Python ints, numpy integers and 0-d integer arrays or tensors count (a layer index read off a
    numpy array or a tensor is still an index); booleans do not: True would silently mean 1, and
    a list of booleans is a mask, not a list of indices. Duck-typed, so nothing is imported."""
    if (
        isinstance(value, bool)
        or getattr(value, "ndim", 0) != 0
        or "bool" in str(getattr(value, "dtype", ""))
    ):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
