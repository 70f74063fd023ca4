"""The checkers a chapter's config declares its fields with (`count()`, `model()`, `heads()`, ...):
each normalises what papermill or a reader passes (lists become tuples, "L16H22" becomes a Head)
and refuses a bad value with the fix, when the config is made, before any model loads."""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Iterable

from .. import registry
from ..errors import ConfigError
from ..heads import Head


def _spec(check: Callable[[str, Any], Any]) -> Any:
    return dataclasses.field(metadata={"check": check})


def _integer(name: str, value) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


MAX_COUNT = 100_000  # a count of prompts, layers or runs beyond this would not finish (a typo such as 10**12)


def count(
    minimum: int = 1,
    optional: bool = False,
    maximum: int = MAX_COUNT,
    none_means: str = "all of them",
) -> Any:
    """An integer in minimum..maximum (None allowed when `optional`; what None means is said in
    the refusal)."""
    hint = f" (None: {none_means})" if optional else ""

    def check(name, value):
        if value is None and optional:
            return None
        value = _integer(name, value)
        if value < minimum:
            raise ConfigError(f"{name} must be at least {minimum}, got {value}{hint}")
        if value > maximum:
            raise ConfigError(
                f"{name} must be at most {maximum:,}, got {value:,}: a run that large would not finish; "
                f"set a smaller {name}{hint}"
            )
        return value

    return _spec(check)


def seed() -> Any:
    """A random seed: an integer in 0..2**32 - 1 (what numpy's generators take)."""
    return count(minimum=0, maximum=2**32 - 1)


def counts(minimum: int = 1) -> Any:
    """A non-empty list of distinct integers >= minimum, kept in order (a tuple)."""

    def check(name, value):
        values = tuple(_integer(name, v) for v in _sequence(name, value))
        if not values:
            raise ConfigError(f"{name} must list at least one value")
        if bad := [v for v in values if v < minimum]:
            raise ConfigError(f"{name} must all be at least {minimum}, got {bad}")
        if len(set(values)) < len(values):
            raise ConfigError(f"{name} lists a value twice: {list(values)}")
        return values

    return _spec(check)


def layers(optional: bool = True) -> Any:
    """Layer indices (>= 0), distinct, in increasing order; None when `optional`."""

    def check(name, value):
        if value is None and optional:
            return None
        values = tuple(_integer(name, v) for v in _sequence(name, value))
        if any(v < 0 for v in values) or list(values) != sorted(set(values)) or not values:
            raise ConfigError(
                f"{name} must be distinct layer indices >= 0 in increasing order, got {list(values)}"
            )
        return values

    return _spec(check)


def one_of(*options: Any) -> Any:
    def check(name, value):
        if value not in options:
            raise ConfigError(
                f"{name} must be one of {', '.join(map(repr, options))}; got {value!r}"
            )
        return value

    return _spec(check)


def number(lo: float, hi: float) -> Any:
    """A real number in [lo, hi]."""

    def check(name, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise ConfigError(f"{name} must be a number in [{lo}, {hi}], got {value!r}")
        return float(value)

    return _spec(check)


def model(*mixers: str) -> Any:
    """A model name of `helpers.registry.MODELS` (of these mixer kinds, when given)."""

    def check(name, value):
        return _model_name(name, value, mixers)

    return _spec(check)


def models(*mixers: str) -> Any:
    def check(name, value):
        values = tuple(_model_name(name, v, mixers) for v in _sequence(name, value))
        if not values:
            raise ConfigError(f"{name} must name at least one model")
        if twice := sorted({v for v in values if values.count(v) > 1}):
            raise ConfigError(
                f"{name} lists {', '.join(twice)} more than once: list each model once"
            )
        return values

    return _spec(check)


def head(optional: bool = False) -> Any:
    """A head, from "L16H22", [16, 22] or a Head (None when `optional`)."""

    def check(name, value):
        if value is None and optional:
            return None
        return _head(name, value)

    return _spec(check)


def heads(optional: bool = False) -> Any:
    def check(name, value):
        if value is None and optional:
            return None
        return tuple(_head(name, v) for v in _sequence(name, value))

    return _spec(check)


def flag() -> Any:
    def check(name, value):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}")
        return value

    return _spec(check)


def _sequence(name: str, value) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        listed = value.strip() if isinstance(value, str) else ""
        listed = listed if listed.startswith("[") and listed.endswith("]") else f"[{value}]"
        hint = (
            f" (with papermill, pass a list as YAML: -y '{name}: {listed}')"
            if isinstance(value, str)
            else ""
        )
        raise ConfigError(f"{name} must be a list, got {value!r}{hint}")
    return tuple(value)


def _model_name(name: str, value, mixers: tuple[str, ...]) -> str:
    known = registry.names() if not mixers else [n for m in mixers for n in registry.names(m)]
    if value not in known:
        kind = f" ({' or '.join(mixers)})" if mixers else ""
        raise ConfigError(
            f"{name} must be a model{kind} of the book: one of {', '.join(sorted(known))}; got {value!r}"
        )
    return value


def _head(name: str, value) -> Head:
    try:
        return Head.parse(value)
    except ValueError as e:
        raise ConfigError(f"{name}: {e}") from None
