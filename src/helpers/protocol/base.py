"""The shape of a chapter's module, shared by every chapter.

A chapter module holds:

- `Config`, a frozen dataclass built by `Config.for_profile(profile, smoke=False, **overrides)`:
  the profile's settings (the paper's own on "paper", read from `data/reference`), smoke sizes
  for what was not set, then the overrides; every field is checked when the config is made, so a
  bad parameter fails in the chapter's first cell, before any model is loaded;
- `run(cfg) -> Result`: the experiment, through a results store (an interrupted run computes
  only what is missing);
- `comparison(result)`: the "paper / released code / this run" table, a DataFrame;
- `verdicts(result)`: the paper's claims, decided from the numbers (`helpers.verdicts`).

Fields are declared with the checkers of `fields` (`count()`, `model()`, `heads()`, ...), which
normalise what papermill or a reader passes (lists become tuples, "L16H22" becomes a Head).
What depends on the model (heads and layers in range, dictionary sizes the task can draw) is
checked in the config against the model's shape, read from its config without its weights
(`checks`); `for_profile` also stops a notebook that papermill passed an unknown parameter.
A run loads its models through `loading` and keeps its numbers in `stores`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd

from .. import benchmarks as bm
from .. import provenance, registry, tasks
from ..errors import ConfigError
from ..heads import Head
from . import fields, stores


@dataclass(frozen=True)
class Config:
    """Base of every chapter's config: the profile, smoke size, and the chapter's own fields."""

    profile: str
    smoke: bool

    chapter: ClassVar[str] = ""  # the results folder and the page's name
    smoke_sizes: ClassVar[dict[str, Any]] = {}  # what smoke=True shrinks, unless set explicitly

    @classmethod
    def defaults(cls, profile: str) -> dict[str, Any]:
        """The profile's settings for every field (the paper's own on the paper profiles)."""
        raise NotImplementedError

    @classmethod
    def for_profile(cls, profile: str = "cpu", smoke: bool = False, **overrides) -> "Config":
        """The config of `profile`; smoke shrinks sizes that `overrides` does not set and runs a
        default model's smoke-size stand-in (`registry.SMOKE_STANDINS`); an override of None
        means "the profile's default" (what papermill passes for an unset parameter)."""
        if profile not in registry.PROFILES:
            raise ConfigError(
                f"unknown profile {profile!r}: use one of {', '.join(registry.PROFILES)}"
            )
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("profile", "smoke")]
        if unknown := sorted(set(overrides) - set(names)):
            raise ConfigError(
                f"{cls.chapter} has no parameter {', '.join(unknown)}; its parameters: {', '.join(names)}"
            )
        given = {k: v for k, v in overrides.items() if v is not None}
        defaults = cls.defaults(profile)
        if smoke:
            defaults = {k: registry.smoke_standin(profile, v) for k, v in defaults.items()}
        values = {**defaults, **(cls.smoke_sizes if smoke else {}), **given}
        return cls(profile=profile, smoke=flag_value(smoke), **{k: values[k] for k in names})

    def __post_init__(self):
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None:
                object.__setattr__(self, f.name, check(f.name, getattr(self, f.name)))

    def parameters(self) -> dict[str, Any]:
        """The settings as JSON (heads as "L16H22"): what a results store cell and a page's
        provenance block record."""
        return {f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class BenchmarkConfig(Config):
    """A chapter scored on MMLU, the knowledge tasks and KV retrieval (`helpers.benchmarks`): the
    sizes and prompt settings of those benchmarks, declared once."""

    n_mmlu: int | None = fields.count(optional=True)  # None: every question
    k_shot: int = fields.count(minimum=0)
    n_knowledge: int | None = fields.count(optional=True)  # per task; None: all
    n_kv: int = fields.count()
    kv_pairs: int = fields.count()
    kv_query: str = fields.one_of("paper", "repeat")
    seed: int = fields.seed()

    def __post_init__(self):
        super().__post_init__()
        most = tasks.most_shots(self.profile)
        if most is not None and self.k_shot > most:
            raise ConfigError(
                f"k_shot must be at most {most} on the {self.profile} profile: some subjects of its "
                f"MMLU have only {most} solved examples (dev rows); got {self.k_shot}"
            )


def _json(value):
    if isinstance(value, Head):
        return str(value)
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    return value


def flag_value(value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"smoke must be True or False, got {value!r}")
    return value


def weights(record: dict) -> str:
    """How a run's models' weights are stored, from its record (the registry's `quantization`
    text, which the page's provenance block shows too): for the chapters' comparison tables."""
    return (
        "; ".join(f"{k}: {v}" for k, v in record.get("quantization", {}).items())
        or "as published (not quantized)"
    )


class ByRole:
    """For a Result whose `roles` maps each benchmark to `benchmarks.RETRIEVAL` or `KNOWLEDGE`."""

    roles: dict[str, str]

    @property
    def retrieval(self) -> list[str]:
        return [b for b, r in self.roles.items() if r == bm.RETRIEVAL]

    @property
    def knowledge_tasks(self) -> list[str]:
        return [b for b, r in self.roles.items() if r == bm.KNOWLEDGE]


def knowledge_name(result: ByRole) -> str:
    """Knowledge as the verdicts test it: the unweighted mean of the tasks, as the release scores it."""
    tasks = result.knowledge_tasks
    return tasks[0] if len(tasks) == 1 else f"knowledge (mean of {', '.join(tasks)})"


class Timer:
    """Wall time of a run, for the page's provenance block."""

    def __init__(self):
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return round(time.perf_counter() - self.start, 1)


def record(cfg: Config, loaded: list, timer: Timer) -> dict:
    """What a Result carries about how it was made, with the names of the results stores of its
    chapter this process opened (the page links them: `book.run_stores`)."""
    return {
        **provenance.record(loaded, cfg.parameters()),
        "profile": cfg.profile,
        "wall_s": timer.seconds,
        "stores": stores.opened(cfg.chapter),
    }


def comparison_table(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    """The "paper / released code / this run" table from (quantity, paper, released code, this
    run) rows, all text."""
    return pd.DataFrame(rows, columns=["", "paper", "released code", "this run"])
