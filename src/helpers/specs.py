"""Interventions as data: one spec type that every scorer, sweep, lm-eval run and store cell takes.

A `Spec` says which heads lose their output and how, and which layers run, in the model's own
layer numbering (`L16H22` is head 22 of layer 16 whatever else is removed):

    Spec.parse("zero L16H0,L17H2; keep 0..17; remove 5")
    Spec(zero=(Head(16, 0),), keep_layers=tuple(range(18)))   # the same thing, typed
    str(spec)        "zero L16H0; keep 0..17"   (the stable text form: cells and provenance)
    spec.record()    {"zero": ["L16H0"], "keep_layers": [0, ..., 17], ...}   (JSON)

- `zero`: the heads' outputs zeroed where they enter the layer's output projection;
- `mean`, `resample`, `patch`: the heads' outputs replaced (by their mean over a reference set,
  by a donor prompt's outputs, by a clean run's outputs); the values come from the run that
  measures (`SweepEngine.replaced`), the spec says which heads and how;
- `keep` and `remove`: the layers the model runs (both: the kept layers minus the removed ones).

Who takes it: the plain scorer (`spec.applied(model)` around `evaluate.score`), the sweep engine
(`SweepEngine.score_each({name: spec})`: its batched rows are a list of specs), lm-eval runs
(`lmeval.evaluate(model, tasks, spec)`) and the results-store cells (a spec's text). The empty
spec, `Spec()`, written "none", is the model as it is. Imports nothing heavy.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, fields, replace
from typing import Iterable, Mapping

from .errors import ConfigError, InterventionError
from .heads import Head, ablation

NONE = "none"
# The kinds of head removal, as their text form names them (a spec's field of the same name).
HEAD_KINDS = ("zero", "mean", "resample", "patch")


def parse_heads(value: str | Iterable | Mapping | None, what: str = "zero") -> tuple[Head, ...]:
    """Heads from `"L16H22,L17H24"`, a list of anything `Head.parse` reads, one Head, or the
    `{layer: [head, ...]}` of `interventions.zero_heads`; each head once, sorted."""
    if value is None or value == "":
        return ()
    if isinstance(value, Head):
        value = [value]
    elif isinstance(value, Mapping):
        value = [
            (layer, h) for layer, hs in value.items() for h in ([hs] if isinstance(hs, int) else hs)
        ]
    elif not isinstance(value, (str, Iterable)):
        raise ConfigError(
            f"{what} takes heads as 'L16H22,L17H24' or a list of heads, got {value!r}"
        )
    parts = [p for p in value.split(",") if p.strip()] if isinstance(value, str) else list(value)
    try:
        heads = tuple(Head.parse(p) for p in parts)
    except ValueError as e:
        raise ConfigError(
            f"{what}: {e}; several heads are joined by commas, e.g. L16H22,L17H24"
        ) from None
    twice = sorted({str(h) for h in heads if heads.count(h) > 1})
    if twice:
        raise ConfigError(f"{what} names {', '.join(twice)} more than once: name each head once")
    return tuple(sorted(heads))


def parse_layers(value: str | Iterable[int] | None, what: str) -> tuple[int, ...] | None:
    """Layers from `"0..17"`, `"16,17"` or `"0..5,8"` (ranges include both ends), or a list; the
    order is kept (the model checks it: layers run in the model's order)."""
    if value is None:
        return None
    if not isinstance(value, str):
        if not isinstance(value, Iterable):  # a bare 5 could mean layer 5 or 5 layers
            raise ConfigError(f"{what} takes layers as '0..17', '16,17' or a list, got {value!r}")
        return tuple(value)
    layers: list[int] = []
    try:
        for part in (p.strip() for p in value.split(",") if p.strip()):
            lo, sep, hi = part.partition("..")
            layers += range(int(lo), int(hi) + 1) if sep else [int(part)]
    except ValueError:
        raise ConfigError(
            f"{what}: cannot read {value!r} as layers: write them as 0..17, 16,17 or 0..5,8"
        ) from None
    return tuple(layers)


def layers_text(layers: Iterable[int]) -> str:
    """`0..17,20`: runs of consecutive layers as ranges (what `parse_layers` reads back)."""
    parts: list[list[int]] = []
    for l in layers:
        if parts and l == parts[-1][1] + 1:
            parts[-1][1] = l
        else:
            parts.append([l, l])
    return ",".join(f"{a}..{b}" if b > a else str(a) for a, b in parts)


@dataclass(frozen=True)
class Spec:
    """One intervention (see the module's docstring); frozen, hashable, JSON-able."""

    zero: tuple[Head, ...] = ()
    mean: tuple[Head, ...] = ()
    resample: tuple[Head, ...] = ()
    patch: tuple[Head, ...] = ()
    keep_layers: tuple[int, ...] | None = None
    remove_layers: tuple[int, ...] = ()

    def __post_init__(self):
        for kind in HEAD_KINDS:
            object.__setattr__(self, kind, parse_heads(getattr(self, kind), kind))
        keep = parse_layers(self.keep_layers, "keep")
        object.__setattr__(self, "keep_layers", keep)
        object.__setattr__(self, "remove_layers", parse_layers(self.remove_layers, "remove") or ())
        removed = [h for k in HEAD_KINDS for h in getattr(self, k)]
        if twice := sorted({str(h) for h in removed if removed.count(h) > 1}):
            raise ConfigError(
                f"{', '.join(twice)} removed two ways in one spec: name each head under one kind"
            )

    # --- text and JSON ---------------------------------------------------------------------

    @classmethod
    def of(cls, zero=None, keep_layers=None, remove_layers=None) -> "Spec":
        """From the command line's three flags (`--zero`, `--keep-layers`, `--remove-layers`)."""
        return cls(zero=zero or (), keep_layers=keep_layers, remove_layers=remove_layers or ())

    @classmethod
    def parse(cls, value: "Spec | str | Mapping | None") -> "Spec":
        """A spec from its text form (`"zero L16H0,L17H2; keep 0..17; remove 5"`, `"none"`), its
        record (`record()`), or a Spec (returned as is)."""
        if value is None:
            return cls()
        if isinstance(value, Spec):
            return value
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return cls.from_record(value)
        if isinstance(value, Mapping):
            raise ConfigError(
                f"an intervention is a Spec or its text, not {{layer: [heads]}} ({value!r}): write "
                f"Spec(zero={value!r}) or its text, e.g. 'zero L16H0,L16H3'"
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"an intervention is a Spec or its text, e.g. 'zero L16H0; keep 0..17', got {value!r}"
            )
        words = {**{k: k for k in HEAD_KINDS}, "keep": "keep_layers", "remove": "remove_layers"}
        given: dict[str, str] = {}
        for part in (p.strip() for p in value.split(";")):
            if not part or part == NONE:
                continue
            word, _, rest = part.partition(" ")
            if word not in words:
                raise ConfigError(
                    f"cannot read {part!r} in the intervention {value!r}: each part is one of "
                    f"{', '.join(words)} and its heads or layers, e.g. 'zero L16H0; keep 0..17'"
                )
            if words[word] in given:
                raise ConfigError(f"the intervention {value!r} says {word!r} twice: say it once")
            given[words[word]] = rest.strip()
        return cls(**given)

    def __str__(self) -> str:
        parts = [
            f"{k} {','.join(map(str, getattr(self, k)))}" for k in HEAD_KINDS if getattr(self, k)
        ]
        if self.keep_layers is not None:
            parts.append(f"keep {layers_text(self.keep_layers)}")
        if self.remove_layers:
            parts.append(f"remove {layers_text(self.remove_layers)}")
        return "; ".join(parts) or NONE

    def record(self) -> dict:
        """The spec as JSON (`from_record` reads it back), with its text form."""
        out = {k: [str(h) for h in getattr(self, k)] for k in HEAD_KINDS}
        out["keep_layers"] = None if self.keep_layers is None else list(self.keep_layers)
        out["remove_layers"] = list(self.remove_layers)
        return {"text": str(self), **out}

    @classmethod
    def from_record(cls, record: Mapping) -> "Spec":
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(record) - known - {"text"}):
            raise ConfigError(
                f"an intervention record has no field(s) {unknown}; known: {sorted(known)}"
            )
        return cls(**{k: v for k, v in record.items() if k in known})

    # --- building specs --------------------------------------------------------------------

    def zeroing(self, *heads: Head) -> "Spec":
        """This spec with these heads zeroed too."""
        return replace(self, zero=self.zero + tuple(heads))

    def removing(self, *layers: int) -> "Spec":
        """This spec with these layers removed too."""
        return replace(self, remove_layers=tuple(sorted(set(self.remove_layers) | set(layers))))

    def with_heads(self, kind: str, heads: Iterable[Head]) -> "Spec":
        """This spec's layers, with `heads` removed the `kind` way (one of `HEAD_KINDS`)."""
        if kind not in HEAD_KINDS:
            raise ConfigError(f"heads are removed one of the ways {HEAD_KINDS}, not {kind!r}")
        return replace(self, **{kind: tuple(heads)})

    # --- what it does to a model -------------------------------------------------------------

    @property
    def replaced(self) -> tuple[Head, ...]:
        """Every head whose output this spec removes, whichever way."""
        return tuple(sorted(h for k in HEAD_KINDS for h in getattr(self, k)))

    @property
    def ablation(self) -> dict[int, list[int]]:
        """The zeroed heads as `{layer: [heads]}` (the form the hooks take)."""
        return ablation(self.zero)

    def runs(self, n_layers: int) -> list[int]:
        """The layers that run (before checking: indices may still be out of range)."""
        kept = range(n_layers) if self.keep_layers is None else self.keep_layers
        return [l for l in kept if l not in self.remove_layers]

    def check(self, model) -> list[int]:
        """The layers that run, every index checked against `model` (a loaded model, an adapter,
        or a model on the meta device); an `InterventionError` names what is valid."""
        from .adapters import unwrap

        _, adapter = unwrap(model)
        adapter.check_layers(self.remove_layers, "remove_layers")
        if self.keep_layers is not None:
            adapter.check_layers(self.keep_layers, "keep_layers")
            if missing := [l for l in self.remove_layers if l not in self.keep_layers]:
                raise InterventionError(
                    f"remove {missing}: these layers are not among the kept layers: remove only "
                    "layers that are kept"
                )
        runs = self.runs(adapter.n_layers)
        if not runs:
            raise InterventionError(
                f"the intervention {self} leaves no layer to run: keep at least one"
            )
        for layer, heads in ablation(self.replaced).items():
            adapter.check_heads(layer, heads)
        if idle := [str(h) for h in self.replaced if h.layer not in runs]:
            raise InterventionError(
                f"{', '.join(idle)}: these heads' layers do not run: remove heads of layers that "
                "run, or keep their layers"
            )
        return runs

    def plain(self) -> "Spec":
        """This spec, where a model can take it as it stands (zero, keep and remove); heads
        replaced by values raise here, before anything loads."""
        if others := [k for k in HEAD_KINDS[1:] if getattr(self, k)]:
            raise InterventionError(
                f"{', '.join(others)}: heads replaced by values are measured by the sweep engine "
                "(SweepEngine.replaced), which holds the values; the plain model takes zero, keep "
                "and remove"
            )
        return self

    @contextmanager
    def applied(self, model):
        """The model under this spec, for the plain scorer and lm-eval (zeroed heads and layers;
        heads replaced by values need the engine, `SweepEngine.replaced`); leaving, also by an
        exception, puts it back exactly. The heads are zeroed first, on the full layer list (a
        hook stays with its layer when others are taken out), then the layers are kept or
        removed."""
        if self == Spec():  # nothing to do: any model, whether or not an adapter knows it
            yield model
            return
        from .adapters import unwrap
        from .interventions import keep_layers, zero_heads

        _, adapter = unwrap(model)
        runs = self.plain().check(adapter)
        with ExitStack() as stack:
            stack.enter_context(zero_heads(adapter, self.ablation))
            if runs != list(range(adapter.n_layers)):
                stack.enter_context(keep_layers(adapter, runs))
            yield model
