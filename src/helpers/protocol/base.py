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

Fields are declared with the checkers below (`count()`, `model()`, `heads()`, ...), which
normalise what papermill or a reader passes (lists become tuples, "L16H22" becomes a Head).
What depends on the model (heads and layers in range, dictionary sizes the task can draw) is
checked in the config against the model's shape, read from its config without its weights
(`shape`); `for_profile` also stops a notebook that papermill passed an unknown parameter.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import operator
import os
import time
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Sequence

import pandas as pd

from .. import benchmarks as bm
from .. import packing, paths, provenance, registry, runner, tasks
from ..errors import ConfigError, StaleResults, StoreError
from ..heads import Head
from ..sweep import Store, os_error, writable
from ..sweep import lock as store_lock

# --- field checkers --------------------------------------------------------------------------


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


# --- configs -----------------------------------------------------------------------------------


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
        """The config of `profile`; smoke shrinks sizes that `overrides` does not set; an
        override of None means "the profile's default" (what papermill passes for an unset
        parameter)."""
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
        values = {**cls.defaults(profile), **(cls.smoke_sizes if smoke else {}), **given}
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

    n_mmlu: int | None = count(optional=True)  # None: every question
    k_shot: int = count(minimum=0)
    n_knowledge: int | None = count(optional=True)  # per task; None: all
    n_kv: int = count()
    kv_pairs: int = count()
    kv_query: str = one_of("paper", "repeat")
    seed: int = seed()

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


# --- checks against the model a run will load (from its config: no weights read) ---------------


def shape(name: str):
    """An adapter of model `name` built on the meta device from its config alone: its layers and
    heads are the model's, it holds no weights and allocates nothing. The config is the toy
    zoo's recipe, SmolLM2's GGUF header, or a paper model's config.json from the local hub cache
    (what `load` would load), else its published one in data/configs."""
    s = registry.spec(name)
    return _shape(name, None if s.toy or s.profile == "cpu" else _cached_config_file(s.hub_id))


def _cached_config_file(repo: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, "config.json")
    return found if isinstance(found, str) else None


@lru_cache(maxsize=None)
def _shape(name: str, config_file: str | None):
    """`shape`, once per model and config file (another hub cache, another snapshot: read again)."""
    import torch

    from .. import models, zoo
    from ..adapters import adapter_for
    from ..progress import quiet

    s = registry.spec(name)
    with torch.device("meta"):
        if s.toy:
            return zoo.adapter_of(zoo.recipe(name), zoo.build_model(zoo.recipe(name)))
        with quiet():
            if s.gguf:
                config = _packaged_config(name)
            elif config_file is not None:  # read as `load` reads it: ours by our config class
                from transformers import AutoConfig

                from ..llamba import LlambaConfig

                config = (LlambaConfig if s.ours else AutoConfig).from_pretrained(
                    Path(config_file).parent
                )
            else:
                config = models.paper_config(name)
        return adapter_for(models.model_from_config(config))


def _packaged_config(name: str):
    from .. import models

    return models.packaged_config(name)


def check_layers_of(
    model: str, name: str, layers: Iterable[int] | None, below: int | None = None
) -> None:
    """Every layer in `layers` (the parameter `name`) is one of `model`'s (and below `below`,
    e.g. the layers a run keeps)."""
    n = shape(model).n_layers if below is None else min(below, shape(model).n_layers)
    if bad := [l for l in layers or () if l >= n]:
        kept = f" of the {n} it runs" if below is not None and below < shape(model).n_layers else ""
        raise ConfigError(
            f"{name}: {model} has no layer {', '.join(map(str, bad))}{kept}: its layers are 0..{n - 1}"
        )


def check_heads_of(
    model: str,
    name: str,
    heads: Iterable[Head] | None,
    paper: bool = False,
    below: int | None = None,
) -> None:
    """Every head in `heads` is one of `model`'s (in its first `below` layers, when given). With
    `paper`, the heads are the paper's, used because the parameter `name` was left unset: the
    message says to set it (and its partner) to heads of this model."""
    from ..errors import InterventionError

    adapter = shape(model)
    n_layers = adapter.n_layers if below is None else min(below, adapter.n_layers)
    for h in heads or ():
        try:
            if h.layer >= n_layers:
                raise InterventionError(
                    f"its layers are 0..{n_layers - 1}"
                    if n_layers == adapter.n_layers
                    else f"of its {adapter.n_layers} layers the run keeps 0..{n_layers - 1}"
                )
            adapter.check_heads(h.layer, [h.head])
        except InterventionError as e:
            why = str(e).split(": ", 1)[-1]
            if paper:
                raise ConfigError(
                    f"the paper's heads for {model} include {h}, which {model} does not have ({why}): "
                    f"set gather and aggregate to heads of this model (with papermill: -y 'gather: "
                    f"[L1H0]' -y 'aggregate: [L2H0]')"
                ) from None
            raise ConfigError(f"{name}: {model} has no {adapter.head_kind} {h} ({why})") from None


def kv_limit(model: str) -> int:
    """The most keys a KV dictionary of `model`'s task holds: one distinct value each (the toy
    zoo's token task has 32 values, the release's prompt the numbers 0-99)."""
    from .. import synthetic
    from ..reference import paper

    return (
        synthetic.N_VALUES
        if registry.spec(model).toy
        else len(paper("kv_retrieval", "value_range").integers)
    )


def check_kv_sizes(model: str, name: str, sizes: Iterable[int]) -> None:
    """Dictionary sizes (the parameter `name`) that `model`'s KV task can draw."""
    most = kv_limit(model)
    if bad := [k for k in sizes if k > most]:
        raise ConfigError(
            f"{name}: a KV dictionary for {model} holds at most {most} keys (one distinct value each); "
            f"got {', '.join(map(str, bad))}"
        )


def refuse_toy(chapter: str, name: str, model: str) -> None:
    """A chapter scored on MMLU and the knowledge tasks cannot run a toy model, which speaks only
    the zoo's token tasks: say so by name, with the models it can run."""
    if registry.spec(model).toy:
        usable = [
            n
            for n in registry.names()
            if not registry.spec(n).toy and registry.spec(n).mixer != "hybrid"
        ]
        raise ConfigError(
            f"{name}: {chapter} scores MMLU and the knowledge tasks, which the toy model {model} does "
            f"not read (it speaks only the zoo's token tasks; see the toy_zoo chapter); use one of "
            f"{', '.join(usable)}"
        )


def check_available(names: Iterable[str]) -> None:
    """Every paper model of a multi-model run can load here (in the local hub cache when offline;
    a GPU with room when on one), checked before the first one computes; CPU-tier models ship
    with the package."""
    from .. import models

    for name in dict.fromkeys(names):
        s = registry.spec(name)
        if s.profile != "cpu":
            device = models.paper_device()
            models.check_paper_model(s, device, models.paper_dtype(device))


# --- running -----------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _small(name: str):
    from ..models import load

    return load(name)


def weights(record: dict) -> str:
    """How a run's models' weights are stored, from its record (the registry's `quantization`
    text, which the page's provenance block shows too): for the chapters' comparison tables."""
    return (
        "; ".join(f"{k}: {v}" for k, v in record.get("quantization", {}).items())
        or "as published (not quantized)"
    )


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

    Its file name carries the models' dtype (`numerics_tag`) and the version of the code and data
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
        "stores": list(_opened.get(cfg.chapter, {})),
    }


def comparison_table(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    """The "paper / released code / this run" table from (quantity, paper, released code, this
    run) rows, all text."""
    return pd.DataFrame(rows, columns=["", "paper", "released code", "this run"])
