"""Verdicts: what a run says about one of the paper's claims, decided from the numbers and their
uncertainty, never by eye.

Five outcomes, all of them real results:

- reproduced / not reproduced: the interval (or the paired test) is on one side of the line;
- inconclusive: it straddles the line, so more items would be needed to tell;
- partly reproduced: a claim with several parts, some reproduced and some not;
- not testable: the model cannot test the claim, e.g. it sits at chance on the task (zeroing a
  head cannot remove a skill the model does not have).

A verdict is about one of the paper's claims (`kind="claim"`) or is a check of this book's own
machinery (`kind="check"`, e.g. the toy zoo's records): checks are shown as checks, never
counted among the paper's claims.

A page names its headline claims (`headline=True`: the claims its section of the paper stands on,
listed in the chapter's plan). The other claims depend on them (knowledge kept *while* a head
breaks letters, random heads doing little *beside* a head that does a lot): `gated` judges such
a claim only where the claim it depends on holds, and the page's outcome follows its headline
(`overall`): never "partly reproduced" when the headline fails and only dependent claims hold.

The decision rules below are shared by every chapter, so that "kept" or "falls" means the same
thing on every page; each returns the outcome together with the numbers that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from .stats import Score, TaskMean, difference, difference_in_differences, paired

REPRODUCED, PARTLY, NOT_REPRODUCED = "reproduced", "partly reproduced", "not reproduced"
INCONCLUSIVE, NOT_TESTABLE = "inconclusive", "not testable"
OUTCOMES = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE)
CLAIM, CHECK = "claim", "check"
MARGIN = 0.05  # a loss or difference smaller than this counts as none, on every page


@dataclass(frozen=True)
class Verdict:
    claim: str  # the paper's claim, in a few words
    source: str  # where the paper makes it ("Fig. 2", "§3.4, Table 1")
    outcome: str  # one of OUTCOMES
    evidence: str  # the numbers that decided it, with their intervals and n
    kind: str = CLAIM  # CLAIM: one of the paper's; CHECK: of this book's own machinery
    headline: bool = False  # one of the claims the page's outcome rests on (`overall`)

    def __post_init__(self):
        if self.outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {self.outcome!r}; use one of {', '.join(OUTCOMES)}")
        if self.kind not in (CLAIM, CHECK):
            raise ValueError(f"unknown kind {self.kind!r}; use {CLAIM!r} or {CHECK!r}")


def _judged(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """The verdicts a page's outcome is about: its claims, or its checks where it has no claim."""
    verdicts = list(verdicts)
    claims = [v for v in verdicts if v.kind == CLAIM]
    return claims or verdicts


def tested(verdicts: Iterable[Verdict]) -> tuple[int, int]:
    """How many of a page's claims (its checks, where it has none) could be tested, of how many."""
    judged = _judged(verdicts)
    return sum(v.outcome != NOT_TESTABLE for v in judged), len(judged)


def tested_note(verdicts: Iterable[Verdict]) -> str:
    """ "3 of 4 claims testable", for the page's verdict box and the book's summary."""
    verdicts = list(verdicts)
    k, n = tested(verdicts)
    what = "claim" if any(v.kind == CLAIM for v in verdicts) or not verdicts else "check"
    return f"{k} of {n} {what}{'s' if n != 1 else ''} testable"


def _agreement(judged: list[Verdict]) -> str:
    """Not testable unless at least half the claims were testable (one reproduced claim among
    three untestable ones does not make a page "reproduced": `tested_note` says how many were);
    else reproduced or not reproduced only when every testable claim agrees, not reproduced when
    the others are only inconclusive, partly when they disagree."""
    k, n = tested(judged)
    if k == 0 or 2 * k < n:
        return NOT_TESTABLE
    outcomes = {v.outcome for v in judged} - {NOT_TESTABLE}
    if len(outcomes) == 1:
        return outcomes.pop()
    if outcomes <= {INCONCLUSIVE, NOT_REPRODUCED}:
        return NOT_REPRODUCED if NOT_REPRODUCED in outcomes else INCONCLUSIVE
    return PARTLY


def overall(verdicts: Iterable[Verdict]) -> str:
    """One outcome for a page, over its claims (checks count only on a page without claims).
    Where the page names headline claims, their agreement (`_agreement`) is the page's outcome
    unless it is "reproduced": then the page is "partly reproduced" if a dependent claim that
    could be tested failed (not reproduced or partly). A failed headline is never lifted by the
    claims that depend on it. Without headline claims, the agreement of all of them."""
    judged = _judged(verdicts)
    headlines = [v for v in judged if v.headline]
    if not headlines:
        return _agreement(judged)
    outcome = _agreement(headlines)
    failed = {v.outcome for v in judged if not v.headline} & {NOT_REPRODUCED, PARTLY}
    return PARTLY if outcome == REPRODUCED and failed else outcome


def gated(holds: tuple[str, str], what: str, decide) -> tuple[str, str]:
    """A dependent claim (`decide()`, called only when needed) judged only where the claim it
    depends on holds: `holds` is that claim's (outcome, evidence), e.g. "zeroing H lowers the
    task"; where it is not reproduced the dependent claim is not testable ("knowledge kept with H
    zeroed" says nothing when H does not hurt letters either), and `what` says which."""
    outcome, evidence = holds
    if outcome != REPRODUCED:
        return NOT_TESTABLE, f"not testable: {what} ({outcome}: {evidence})"
    return decide()


def combine(parts: Iterable[str]) -> str:
    """The outcome of a claim that can hold in part (e.g. "retrieval collapses" over several
    retrieval tasks): partly where some parts are reproduced and others are not. A claim made
    of every part ("at every size", "for every model", "this AND that") is `every`'s."""
    parts = [p for p in parts if p != NOT_TESTABLE]
    if not parts:
        return NOT_TESTABLE
    if all(p == parts[0] for p in parts):
        return parts[0]
    if REPRODUCED in parts or PARTLY in parts:
        return PARTLY
    return NOT_REPRODUCED if NOT_REPRODUCED in parts else INCONCLUSIVE


def every(parts: Iterable[str]) -> str:
    """The outcome of a universal claim, one that needs every testable part: not reproduced when
    any part is not reproduced (or only partly), reproduced when all are, inconclusive when the
    rest are inconclusive; not testable when no part was. 53 reproduced sizes and one that fails
    is a claim "at every size" that fails."""
    parts = [p for p in parts if p != NOT_TESTABLE]
    if not parts:
        return NOT_TESTABLE
    if NOT_REPRODUCED in parts or PARTLY in parts:
        return NOT_REPRODUCED
    return REPRODUCED if all(p == REPRODUCED for p in parts) else INCONCLUSIVE


# --- decision rules ---------------------------------------------------------------------------

Measured = Score | TaskMean  # an accuracy with its interval: one task's, or a mean over tasks


def testable(score: Measured, chance: float) -> bool:
    """A model can test a claim about a task only if its whole interval clears chance."""
    return score.above(chance)


def loss_line(clean: Measured, ablated: Measured, chance: float) -> tuple[str, str]:
    """Does the ablation take accuracy most of the way to chance, i.e. is the paired loss
    (clean - ablated, on the same items) more than half of what clean holds above chance? The
    line moves with the clean accuracy, so its interval counts too: reproduced when the loss's
    whole interval exceeds half the gap at clean's upper bound, not reproduced when it stays
    below half the gap at clean's lower bound, inconclusive between."""
    d = paired(clean, ablated)  # ablated - clean: the loss is -d
    loss_lo, loss_hi = -d.hi, -d.lo
    need_hi, need_lo = (clean.hi - chance) / 2, (clean.lo - chance) / 2
    outcome = (
        REPRODUCED if loss_lo > need_hi else NOT_REPRODUCED if loss_hi < need_lo else INCONCLUSIVE
    )
    return outcome, (
        f"{ablated} against clean {clean}: loss {100 * -d.delta:.1f} points "
        f"[{100 * loss_lo:.1f}, {100 * loss_hi:.1f}]; most of the way to chance {chance:.0%} needs more "
        f"than {100 * need_lo:.1f} to {100 * need_hi:.1f} points (half the clean interval's gap)"
    )


def collapses(clean: Measured, ablated: Measured, chance: float) -> tuple[str, str]:
    """Does the ablation take the model most of the way to chance (`loss_line`, paired)? Not
    testable where clean accuracy does not clear chance."""
    if not testable(clean, chance):
        return NOT_TESTABLE, f"clean {clean} does not clear chance {chance:.0%}"
    return loss_line(clean, ablated, chance)


def below(reference: Measured, other: Measured, margin: float = MARGIN) -> tuple[str, str]:
    """Is `other` lower than `reference` (paired)? Reproduced when the difference's interval lies
    below zero; not reproduced when it excludes any drop larger than `margin`; else inconclusive."""
    d = paired(reference, other)
    outcome = REPRODUCED if d.hi < 0 else NOT_REPRODUCED if d.lo > -margin else INCONCLUSIVE
    return outcome, f"{other} against {reference}: {d}"


def falls(
    clean: Measured, ablated: Measured, chance: float, margin: float = MARGIN
) -> tuple[str, str]:
    """Does the ablation lower accuracy at all (`below`, paired)? Not testable where clean
    accuracy does not clear chance."""
    if not testable(clean, chance):
        return NOT_TESTABLE, f"clean {clean} does not clear chance {chance:.0%}"
    return below(clean, ablated, margin)


def kept(
    reference: Measured, other: Measured, chance: float, margin: float = MARGIN
) -> tuple[str, str]:
    """Is accuracy kept within `margin` (an equivalence test on the paired difference)? Kept
    (reproduced) when the whole interval lies above -margin, not kept when the whole interval
    lies below -margin, inconclusive when it straddles -margin: a loss the interval cannot tell
    from one inside the margin is not a failure."""
    if not testable(reference, chance):
        return NOT_TESTABLE, f"reference {reference} does not clear chance {chance:.0%}"
    d = paired(reference, other)
    outcome = REPRODUCED if d.lo > -margin else NOT_REPRODUCED if d.hi < -margin else INCONCLUSIVE
    return (
        outcome,
        f"{other} against {reference}: {d} (kept: no loss beyond {100 * margin:.0f} points)",
    )


def lower(a: Score, b: Score, paired: bool = True) -> tuple[str, str]:
    """Is b below a? Reproduced when the difference's interval lies below zero, not reproduced
    when it lies above zero, inconclusive when it contains zero."""
    d = difference(a, b, paired)
    outcome = REPRODUCED if d.hi < 0 else NOT_REPRODUCED if d.lo > 0 else INCONCLUSIVE
    return outcome, f"{b} against {a}: {d}"


def beats_controls(
    clean: Measured,
    ablated: Measured,
    controls: Sequence[Measured],
    chance: float,
    margin: float = MARGIN,
    ablated_on_controls: Measured | None = None,
) -> tuple[str, str]:
    """Is an ablation a bottleneck: does it take accuracy most of the way to chance
    (`collapses`) AND lower than every random control does (`below` against each draw, on the
    same items)? A universal claim (`every`): an ablation no more harmful than some random heads
    is not reproduced, not "partly"; with no control drawn it cannot be shown specific
    (inconclusive at best). Where the controls were scored on fewer items than the collapse
    (a dependent claim's n), `ablated_on_controls` is the ablation on their items."""
    beside = ablated if ablated_on_controls is None else ablated_on_controls
    return _beyond_controls(*collapses(clean, ablated, chance), beside, controls, margin)


def _beyond_controls(
    outcome: str, evidence: str, ablated: Measured, controls: Sequence[Measured], margin: float
) -> tuple[str, str]:
    """A loss's outcome AND the ablation below every random control (`below` against each draw,
    on the same items); with no control drawn, inconclusive at best."""
    if outcome == NOT_TESTABLE:
        return outcome, evidence
    if not controls:
        return (
            INCONCLUSIVE if outcome == REPRODUCED else outcome
        ), evidence + "; no random control to beat"
    against = [below(c, ablated, margin) for c in controls]
    worst = min(range(len(controls)), key=lambda i: controls[i].acc)
    specific = every(o for o, _ in against)
    return every([outcome, specific]), (
        evidence + f"; below every random control ({len(controls)} draws): {specific} "
        f"(against the most harmful draw: {against[worst][1]})"
    )


def kept_while_falls(
    x_ref: Measured,
    x_other: Measured,
    y_ref: Measured,
    y_other: Measured,
    x_chance: float,
    margin: float = MARGIN,
) -> tuple[str, str]:
    """ "X is kept while Y falls" (e.g. MMLU kept while knowledge falls), a claim of three parts
    (`verdicts.every`): X kept (`kept`, paired on X's items); Y falls (`below`, paired on Y's
    items: a Y that does not move, or rises, is no dissociation however X does); and X's change
    above Y's, the difference-in-differences (x_other - x_ref) - (y_other - y_ref) with its
    interval (each change paired on its own items, X's and Y's items independent:
    `stats.difference_in_differences`): reproduced when that interval lies above zero, not
    reproduced when it excludes a gap larger than `margin`, else inconclusive."""
    if not testable(x_ref, x_chance):
        return NOT_TESTABLE, f"reference {x_ref} does not clear chance {x_chance:.0%}"
    x_kept, x_evidence = kept(x_ref, x_other, x_chance, margin)
    y_falls, y_evidence = below(y_ref, y_other, margin)
    did = difference_in_differences(x_ref, x_other, y_ref, y_other)
    gap = REPRODUCED if did.lo > 0 else NOT_REPRODUCED if did.hi < margin else INCONCLUSIVE
    return every([x_kept, y_falls, gap]), (
        f"kept ({x_kept}): {x_evidence}; falls ({y_falls}): {y_evidence}; "
        f"X's change minus Y's: {did}"
    )


def another_mechanism(role: str, why: str, measured: bool, sure: bool = True) -> tuple[str, str]:
    """The outcome where no head the ranking found behaves as `role` ("Gather", "Aggregate"):
    the harmful heads do something else (previous-token, induction, value copying), which is
    evidence against the mechanism here: not reproduced. Only where no candidate could be
    measured at all is it not testable; where a candidate's measure is under the line but its
    interval over the prompts reaches it (`sure` False), too few prompts decide: inconclusive."""
    if not measured:
        return NOT_TESTABLE, why
    if not sure:
        return (
            INCONCLUSIVE,
            f"no {role} head for sure: {why}, but a candidate's interval reaches the line",
        )
    return NOT_REPRODUCED, f"another mechanism: no {role} head among the most harmful heads; {why}"


def ranking_readable(
    clean: Score, most_harmful: tuple[float, float, float], chance: float
) -> tuple[bool, str]:
    """Can a ranking of heads by accuracy-when-zeroed be read? Two checks before any head's
    rank counts: chance (the clean model's interval clears it: there is retrieval to remove) and
    ceiling (zeroing the most harmful head takes accuracy below the clean model's, its interval
    `most_harmful` = (acc, lo, hi) under the clean point: where no single head moves a saturated
    or redundant model, every head ties and the order is only the screen's estimate)."""
    acc, lo, hi = most_harmful
    if not testable(clean, chance):
        return (
            False,
            f"the model is at chance on the ranking's prompts ({clean}, chance {chance:.0%})",
        )
    if not hi < clean.acc:
        return False, (
            f"no single head moves it (at ceiling, or redundant): zeroing the most harmful head leaves "
            f"{acc:.1%} [{lo:.1%}, {hi:.1%}] against {clean.acc:.1%} clean, so no head's zeroing is told "
            "apart and the order is the screen's"
        )
    return True, ""


def falls_beyond_controls(
    clean: Measured,
    ablated: Measured,
    controls: Sequence[Measured],
    floor: float,
    margin: float = MARGIN,
) -> tuple[str, str]:
    """Does an ablation lower a task (`falls`, paired) AND lower it below every random control of
    the same size (`below` against each draw, on the same items)? The claim of a bottleneck on a
    task where no "chance" is the line to reach (a generative task's exact match: Table 2): not
    "most of the way to chance" (`beats_controls`), only lower, and lower than random heads. A
    universal claim (`every`); with no control drawn it cannot be shown specific (inconclusive at
    best). Not testable where clean does not clear `floor` (for open answers chance is 0: a stated
    minimum the clean interval must clear)."""
    outcome, evidence = falls(clean, ablated, floor, margin)
    return _beyond_controls(
        outcome,
        f"lowers it: {evidence}" if outcome != NOT_TESTABLE else evidence,
        ablated,
        controls,
        margin,
    )


def rankings_agree(
    rho: tuple[float, float, float],
    overlap: tuple[float, float, float],
    chance: float,
    chance_line: float,
    what: str = "the two rankings",
) -> tuple[str, str]:
    """Do two rankings of the same heads agree? `rho` = (Spearman's rho, lo, hi) and `overlap`
    = (top-k overlap, lo, hi) with their 95% intervals (lo = hi = the value where it has none);
    `chance` and `chance_line`: the overlap two random orders share on average and its 97.5%
    point. Agree (reproduced) when rho's whole interval is above 0 AND the overlap's whole
    interval is above the random orders' 97.5% point; disagree (not reproduced) when rho's whole
    interval is at or below 0 OR the overlap's whole interval is at or below the random mean
    (the top sets share no more than random ones would, even at the interval's top); else
    inconclusive. Not testable where rho is unknown (fewer than 5 heads in common, or a constant
    side: every head ties)."""
    r, r_lo, r_hi = rho
    o, o_lo, o_hi = overlap
    if r != r or r_lo != r_lo:
        return (
            NOT_TESTABLE,
            f"{what}: no rank correlation (fewer than 5 common heads, or every head ties)",
        )
    agree = r_lo > 0 and o_lo > chance_line
    disagree = r_hi <= 0 or o_hi <= chance
    outcome = REPRODUCED if agree else NOT_REPRODUCED if disagree else INCONCLUSIVE
    return outcome, (
        f"{what}: rank correlation {r:.2f} [{r_lo:.2f}, {r_hi:.2f}]; top-k overlap {o:g} [{o_lo:g}, {o_hi:g}] "
        f"against {chance:.2f} for random orders (97.5% point {chance_line:g})"
    )


# --- how many items a page needs ----------------------------------------------------------------

# The share of items a harmless ablation flips either way, for planning: the "kept" claims'
# power is computed at it (a planning value, not a measurement; a page prints the discordance
# its own check found beside it).
KEEP_DISCORDANCE = 0.05


@dataclass(frozen=True)
class Power:
    """The items a page's claims need (`plan`): the rule's n for each kind of claim, the floor
    and the items there are, the n used, and the smallest collapse it detects."""

    n: int  # items used: the largest need, at least `floor`, at most `available`
    # kind of claim -> the n that decides it with 80% power (None: no n does)
    needs: dict[str, int | None]
    floor: int
    available: int
    clean: float
    chance: float
    # the smallest loss `collapses` reports as reproduced with 80% power at n
    detectable: float | None

    @property
    def n_dependent(self) -> int:
        """The n of the claims judged only where a head hurts (`gated`: random heads doing little,
        keep-only, knowledge kept): the largest need without the floor, which is the headline's,
        at most `n`."""
        return min(self.n, max([x for x in self.needs.values() if x] or [self.n]))

    def note(self, what: str = "items") -> str:
        needs = "; ".join(
            f"{kind}: {n if n is not None else 'no n'}" for kind, n in self.needs.items()
        )
        where = (
            f" (the rule asks for {max(n for n in self.needs.values() if n)}, the set has {self.available})"
            if self.n == self.available and self.n < max((n or 0) for n in self.needs.values())
            else ""
        )
        line = (
            f"a loss of {100 * self.detectable:.1f} points or more is detected as a collapse with 80% power"
            if self.detectable is not None
            else "no loss down to chance is detected as a collapse with 80% power"
        )
        dependent = (
            f" The claims that depend on a head that hurts are scored on {self.n_dependent} of them drawn at random, "
            "the most their rule asks for, beside what they are compared with there."
            if self.n_dependent < self.n
            else ""
        )
        return (
            f"n = {self.n} {what}{where}, from the rule: the smallest n that decides each claim with 80% power at "
            f"the clean accuracy {self.clean:.1%} (chance {self.chance:.0%}); {needs}; at least {self.floor}. "
            f"At n = {self.n} {line}; 'kept' is planned at {100 * KEEP_DISCORDANCE:.0f}% of items flipping either "
            f"way.{dependent}"
        )


def plan(clean: float, chance: float, floor: int, available: int) -> Power:
    """The n the book's claims need at a clean accuracy `clean` (the items' expected accuracy,
    measured before they are drawn): a head or layer at chance decided a collapse (`collapses`
    reproduced), one that does nothing decided no collapse (not reproduced), and an ablation that
    does nothing decided "kept within 5 points" (`kept` reproduced, at KEEP_DISCORDANCE), each
    with 80% power (`stats.powered_n`, simulated on the rules themselves); n is the largest of
    them and `floor`, at most `available`."""
    from .stats import detectable_loss, powered_n

    collapse = lambda a, b: collapses(a, b, chance)
    keep = lambda a, b: kept(a, b, chance)
    needs = {
        "a collapse to chance": powered_n(collapse, REPRODUCED, clean, chance, clean - chance),
        "no collapse where nothing changes": powered_n(
            collapse, NOT_REPRODUCED, clean, clean, KEEP_DISCORDANCE
        ),
        "kept within 5 points": powered_n(keep, REPRODUCED, clean, clean, KEEP_DISCORDANCE),
    }
    n = min(available, max([floor] + [x for x in needs.values() if x]))
    return Power(
        n,
        needs,
        floor,
        available,
        clean,
        chance,
        detectable_loss(collapse, REPRODUCED, n, clean, chance),
    )
