"""Verdicts: what a run says about one of the paper's claims, decided from the numbers and their
uncertainty, never by eye.

Five outcomes, all of them real results:

- reproduced / not reproduced: the interval (or the paired test) is on one side of the line;
- inconclusive: it straddles the line, so more items would be needed to tell;
- partly reproduced: a claim with several parts, some reproduced and some not;
- not testable: the model cannot test the claim, e.g. it sits at chance on the task (zeroing a
  head cannot remove a skill the model does not have).

The decision rules below are shared by every chapter, so that "kept" or "falls" means the same
thing on every page; each returns the outcome together with the numbers that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .stats import Score, difference

REPRODUCED, PARTLY, NOT_REPRODUCED = "reproduced", "partly reproduced", "not reproduced"
INCONCLUSIVE, NOT_TESTABLE = "inconclusive", "not testable"
OUTCOMES = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE)


@dataclass(frozen=True)
class Verdict:
    claim: str  # the paper's claim, in a few words
    source: str  # where the paper makes it ("Fig. 2", "§3.4, Table 1")
    outcome: str  # one of OUTCOMES
    evidence: str  # the numbers that decided it, with their intervals and n

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}; use one of {', '.join(OUTCOMES)}")


def overall(verdicts: Iterable[Verdict]) -> str:
    """One outcome for a page: reproduced or not reproduced only when every testable claim
    agrees; partly when they disagree; not testable when no claim could be tested."""
    outcomes = {v.outcome for v in verdicts} - {NOT_TESTABLE}
    if not outcomes:
        return NOT_TESTABLE
    if len(outcomes) == 1:
        return outcomes.pop()
    if outcomes <= {INCONCLUSIVE, NOT_REPRODUCED}:
        return NOT_REPRODUCED if NOT_REPRODUCED in outcomes else INCONCLUSIVE
    return PARTLY


def combine(parts: Iterable[str]) -> str:
    """The outcome of a claim made of several parts (e.g. one per model or per head)."""
    parts = [p for p in parts if p != NOT_TESTABLE]
    if not parts:
        return NOT_TESTABLE
    if all(p == parts[0] for p in parts):
        return parts[0]
    if REPRODUCED in parts or PARTLY in parts:
        return PARTLY
    return NOT_REPRODUCED if NOT_REPRODUCED in parts else INCONCLUSIVE


# --- decision rules ---------------------------------------------------------------------------

def testable(score: Score, chance: float) -> bool:
    """A model can test a claim about a task only if its whole interval clears chance."""
    return score.above(chance)


def collapses(clean: Score, ablated: Score, chance: float) -> tuple[str, str]:
    """Does the ablation take the model most of the way to chance? The line is halfway between
    chance and the clean accuracy: reproduced when the ablated interval lies below it, not
    reproduced when it lies above, inconclusive when it straddles it. Paired on the same items."""
    if not testable(clean, chance):
        return NOT_TESTABLE, f"clean {clean} does not clear chance {chance:.0%}"
    line = (clean.acc + chance) / 2
    outcome = REPRODUCED if ablated.hi < line else NOT_REPRODUCED if ablated.lo > line else INCONCLUSIVE
    return outcome, f"{ablated} against clean {clean}; halfway to chance: {line:.1%}"


def falls(clean: Score, ablated: Score, chance: float, margin: float = 0.05) -> tuple[str, str]:
    """Does the ablation lower accuracy at all? Reproduced when the paired difference's interval
    lies below zero; not reproduced when it excludes any loss larger than `margin`."""
    if not testable(clean, chance):
        return NOT_TESTABLE, f"clean {clean} does not clear chance {chance:.0%}"
    d = difference(clean, ablated)
    outcome = REPRODUCED if d.hi < 0 else NOT_REPRODUCED if d.lo > -margin else INCONCLUSIVE
    return outcome, f"{ablated} against clean {clean}: {d}"


def kept(reference: Score, other: Score, chance: float, margin: float = 0.05) -> tuple[str, str]:
    """Is accuracy kept? Reproduced when the paired difference's interval excludes a loss larger
    than `margin`; not reproduced when it shows a loss (interval below zero); inconclusive else."""
    if not testable(reference, chance):
        return NOT_TESTABLE, f"reference {reference} does not clear chance {chance:.0%}"
    d = difference(reference, other)
    outcome = REPRODUCED if d.lo > -margin else NOT_REPRODUCED if d.hi < 0 else INCONCLUSIVE
    return outcome, f"{other} against {reference}: {d} (kept: no loss beyond {100 * margin:.0f} points)"


def lower(a: Score, b: Score, paired: bool = True) -> tuple[str, str]:
    """Is b below a? Reproduced when the difference's interval lies below zero, not reproduced
    when it lies above zero, inconclusive when it contains zero."""
    d = difference(a, b, paired)
    outcome = REPRODUCED if d.hi < 0 else NOT_REPRODUCED if d.lo > 0 else INCONCLUSIVE
    return outcome, f"{b} against {a}: {d}"
