"""Heads by name, the policy that ranks them, and the rule that names Gather and Aggregate heads.

A head is `Head(layer, head)`, written `L16H22` as in the paper. Rankings are DataFrames with
one row per head (`layer`, `head`, the screen's `estimate`, and for heads measured exactly `acc`,
`lo`, `hi`, `n`), most harmful first. Roles are assigned by behaviour, not by layer order: a
Gather head keeps each segment's end reading inside its own segment, an Aggregate head reads the
segments' summary tokens from the final position (`segments.head_measures` computes both), and
among the heads whose zeroing hurts, the most harmful that behaves so takes the role.
Imports nothing heavy (pandas only where a ranking is built).
"""

from __future__ import annotations

import operator
import re
from typing import TYPE_CHECKING, Iterable, NamedTuple

if TYPE_CHECKING:
    import pandas as pd


class Head(NamedTuple):
    layer: int
    head: int

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}"

    @classmethod
    def parse(cls, value) -> "Head":
        """A head from `"L16H22"`, `(16, 22)`, `[16, 22]` or a Head."""
        if isinstance(value, str):
            m = re.fullmatch(r"\s*L(\d+)H(\d+)\s*", value)
            if not m:
                raise ValueError(
                    f"cannot read {value!r} as a head: write it as 'L16H22' or [16, 22]"
                )
            return cls(int(m[1]), int(m[2]))
        try:
            layer, head = value
        except (TypeError, ValueError):
            raise ValueError(
                f"cannot read {value!r} as a head: write it as 'L16H22' or [16, 22]"
            ) from None
        if any(isinstance(x, bool) for x in (layer, head)):
            raise ValueError(
                f"cannot read {value!r} as a head: layer and head must be integers, not booleans"
            )
        try:
            layer, head = operator.index(layer), operator.index(head)
        except TypeError:
            raise ValueError(
                f"cannot read {value!r} as a head: layer and head must be integers"
            ) from None
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


def ranking_table(estimate: dict[Head, float], exact: dict) -> pd.DataFrame:
    """One row per head (`exact`: each exactly measured head's `stats.Score`): the exactly measured heads first, most harmful (lowest accuracy) first,
    ties broken by the screen's estimate; `acc` is empty for heads not measured exactly, and
    `correct` holds which items each measured head's zeroing left right ('0110...'), so that its
    harm can be tested item by item against the clean run (`protocol.roles.harmful`)."""
    import pandas as pd

    rows = [
        dict(
            layer=h.layer,
            head=h.head,
            estimate=e,
            **(
                {
                    "acc": exact[h].acc,
                    "lo": exact[h].lo,
                    "hi": exact[h].hi,
                    "n": exact[h].n,
                    "correct": exact[h].to_json()["correct"],
                }
                if h in exact
                else {}
            ),
        )
        for h, e in estimate.items()
    ]
    table = pd.DataFrame(
        rows, columns=["layer", "head", "estimate", "acc", "lo", "hi", "n", "correct"]
    )
    return table.sort_values(["acc", "estimate"], na_position="last", kind="stable").reset_index(
        drop=True
    )


def measured(ranking: pd.DataFrame) -> list[Head]:
    """The exactly measured heads of a ranking, most harmful first."""
    rows = ranking.dropna(subset=["acc"])
    return [Head(int(l), int(h)) for l, h in zip(rows.layer, rows["head"])]


# --- roles, by behaviour ------------------------------------------------------------------------

GATHER_MEASURE = "segment end: own-segment share"
# What the final position reads of the segments: the tokens an option (a line) can be summarised
# in, its end (the newline) and, in an MCQ, its letter; each reported, the Aggregate behaviour
# is their sum (a head that reads the letters instead of the newlines aggregates all the same).
ENDS_MEASURE = "final position: share on segment ends"
LETTERS_MEASURE = "final position: share on option letters"
AGGREGATE_MEASURE = "final position: share on summary tokens"
SEGMENTS_MEASURE = "final position: share on the segments"  # of all its attention
# The final position's shares are of what it puts on the segments, taken as at least this share of
# all its attention: a head that reads next to nothing there (Qwen's L0H10 reads the prompt's
# "Answer:" with all of it) has no share worth the name, whatever that nothing is made of.
SEGMENT_FLOOR = 0.05
LOCAL_MEASURE = "segment ends: share on themselves and the previous token"
LOCAL = 0.8  # above this a head is a previous-token head: staying inside a segment says little
LINE = 0.5  # a role's behaviour: more than half of the mass where the role puts it


ROLE_MEASURES = (GATHER_MEASURE, AGGREGATE_MEASURE)


def assign_roles(measures: pd.DataFrame, order: list[Head] | None = None) -> dict[str, Head | None]:
    """Gather and Aggregate heads among candidates, from `measures` (one row per head, indexed
    by Head, with the columns of `segments.head_measures`, averaged over prompts), taken in
    `order` (most harmful first; default: the rows' order). Harm decides which head plays a
    role, behaviour whether it plays it: the Aggregate head is the first candidate whose final
    position puts more than half of its in-segment attention on the segments' summary tokens
    (ends, option letters); the Gather head the first other candidate, not a previous-token head,
    whose segment ends keep more than half of theirs inside their own segment. A role goes
    unfilled (None) when no candidate shows its behaviour."""
    roles: dict[str, Head | None] = {"G": None, "A": None}
    if measures.empty:
        return roles
    order = [h for h in (order or [Head(*h) for h in measures.index]) if h in measures.index]
    value = lambda h, column: float(measures.loc[[h], column].iloc[0])
    roles["A"] = next((h for h in order if value(h, AGGREGATE_MEASURE) > LINE), None)
    roles["G"] = next(
        (
            h
            for h in order
            if h != roles["A"]
            and value(h, LOCAL_MEASURE) <= LOCAL
            and value(h, GATHER_MEASURE) > LINE
        ),
        None,
    )
    return roles
