"""Heads by name, the policy that ranks them, and the rule that names Gather and Aggregate heads.

A head is `Head(layer, head)`, written `L16H22` as in the paper. Rankings are DataFrames with
one row per head (`layer`, `head`, the screen's `estimate`, and for heads measured exactly `acc`,
`lo`, `hi`, `n`), most harmful first. Roles are assigned by behaviour, not by layer order: a
Gather head keeps each segment's end reading inside its own segment, an Aggregate head reads the
segments' ends from the final position (`segments.head_measures` computes both).
Imports nothing heavy (pandas, numpy).
"""

from __future__ import annotations

import operator
import re
from typing import Iterable, NamedTuple

import pandas as pd


class Head(NamedTuple):
    layer: int
    head: int

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"

    @property
    def ablation(self) -> dict[int, list[int]]:
        """This head alone, in the `{layer: [heads]}` form interventions take."""
        return {self.layer: [self.head]}

    @classmethod
    def parse(cls, value) -> "Head":
        """A head from `"L16H22"`, `(16, 22)`, `[16, 22]` or a Head."""
        if isinstance(value, str):
            m = re.fullmatch(r"\s*L(\d+)H(\d+)\s*", value)
            if not m:
                raise ValueError(f"cannot read {value!r} as a head: write it as 'L16H22' or [16, 22]")
            return cls(int(m[1]), int(m[2]))
        try:
            layer, head = value
        except (TypeError, ValueError):
            raise ValueError(f"cannot read {value!r} as a head: write it as 'L16H22' or [16, 22]") from None
        if any(isinstance(x, bool) for x in (layer, head)):
            raise ValueError(f"cannot read {value!r} as a head: layer and head must be integers, not booleans")
        try:
            layer, head = operator.index(layer), operator.index(head)
        except TypeError:
            raise ValueError(f"cannot read {value!r} as a head: layer and head must be integers") from None
        if layer < 0 or head < 0:
            raise ValueError(f"cannot read {value!r} as a head: layer and head are indices >= 0")
        return cls(layer, head)


def ablation(heads: Iterable[Head]) -> dict[int, list[int]]:
    """Several heads in the `{layer: [heads]}` form, zeroed together."""
    out: dict[int, list[int]] = {}
    for h in heads:
        out.setdefault(h.layer, []).append(h.head)
    return out


# --- the ranking policy -----------------------------------------------------------------------

def layers_to_sweep(estimate: dict[Head, float], top: int) -> list[int]:
    """The layers of the screen's `top` most harmful heads (lowest estimated change of the gold
    margin), and at least two layers: a Gather/Aggregate pair spans two."""
    order = [h.layer for h in sorted(estimate, key=estimate.get)]
    layers = sorted(set(order[:top]))
    if len(layers) < 2:
        layers = sorted(layers + [l for l in order if l not in layers][:1])
    return layers


def ranking_table(estimate: dict[Head, float], exact: dict[Head, "Score"]) -> pd.DataFrame:
    """One row per head: the exactly measured heads first, most harmful (lowest accuracy) first,
    ties broken by the screen's estimate; `acc` is empty for heads not measured exactly."""
    rows = [dict(layer=h.layer, head=h.head, estimate=e,
                 **({"acc": exact[h].acc, "lo": exact[h].lo, "hi": exact[h].hi, "n": exact[h].n} if h in exact else {}))
            for h, e in estimate.items()]
    table = pd.DataFrame(rows, columns=["layer", "head", "estimate", "acc", "lo", "hi", "n"])
    return table.sort_values(["acc", "estimate"], na_position="last", kind="stable").reset_index(drop=True)


def measured(ranking: pd.DataFrame) -> list[Head]:
    """The exactly measured heads of a ranking, most harmful first."""
    rows = ranking.dropna(subset=["acc"])
    return [Head(int(l), int(h)) for l, h in zip(rows.layer, rows["head"])]


def candidates(ranking: pd.DataFrame, k: int = 4) -> list[Head]:
    """The `k` most harmful measured heads, from at least two layers (the most harmful head of
    another layer is added when the first k share one)."""
    heads = measured(ranking)
    chosen = heads[:k]
    if len({h.layer for h in chosen}) < 2:
        other = [h for h in heads if h.layer != chosen[0].layer]
        if not other:
            raise ValueError(f"only layer {chosen[0].layer} was swept exactly; a Gather/Aggregate pair needs two: "
                             "sweep more layers (a larger `top`, or name the layers)")
        chosen = chosen[:k - 1] + other[:1]
    return chosen


def boundary_ties(ranking: pd.DataFrame, chosen: list[Head]) -> list[Head]:
    """The measured heads left out of `chosen` that are exactly as harmful as the last head
    chosen (the same accuracy on the same prompts): the ranking's order among them is the
    screen's estimate, which a page must say rather than break the tie in silence."""
    rows = ranking.dropna(subset=["acc"])
    acc = {Head(int(l), int(h)): a for l, h, a in zip(rows.layer, rows["head"], rows.acc)}
    if not chosen or chosen[-1] not in acc:
        return []
    return [h for h in acc if h not in chosen and acc[h] == acc[chosen[-1]]]


# --- roles, by behaviour ------------------------------------------------------------------------

GATHER_MEASURE = "segment end: own-segment share"
AGGREGATE_MEASURE = "final position: share on segment ends"
LOCAL_MEASURE = "segment ends: share on themselves and the previous token"
LOCAL = 0.8  # above this a head is a previous-token head: staying inside a segment says little


ROLE_MEASURES = (GATHER_MEASURE, AGGREGATE_MEASURE)


def assign_roles(measures: pd.DataFrame) -> dict[str, Head | None]:
    """Gather and Aggregate heads among candidates, from `measures` (one row per head, indexed
    by Head, with the columns of `segments.head_measures`, averaged over prompts).

    Aggregate: the head whose final position puts the largest share of its in-segment attention
    on the segments' end tokens. Gather: of the others, the head whose segment ends keep the
    largest share of their attention inside their own segment, leaving out local heads. A role
    goes unfilled (None) when no candidate shows the behaviour on more than half its mass."""
    roles: dict[str, Head | None] = {"G": None, "A": None}
    if measures.empty:
        return roles
    agg = measures[AGGREGATE_MEASURE].astype(float)
    if agg.max() > 0.5:
        roles["A"] = Head(*agg.idxmax())
    rest = measures.drop(index=[roles["A"]] if roles["A"] else [])
    rest = rest[rest[LOCAL_MEASURE] <= LOCAL]
    if not rest.empty and rest[GATHER_MEASURE].max() > 0.5:
        roles["G"] = Head(*rest[GATHER_MEASURE].astype(float).idxmax())
    return roles
