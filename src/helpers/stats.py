"""Accuracies with their uncertainty, and the tests the verdicts are computed from.

Every accuracy is a `Score`: the fraction of items right, a 95% Wilson interval, n, and which
items were right, so that two conditions scored on the same items can be compared item by item
(McNemar's exact test, Newcombe's interval for a paired difference) rather than by eye.
Imports nothing heavy: numpy and the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def wilson(k: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n trials."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At k = 0 or k = n one bound is exactly 0 or 1; say so rather than leave rounding error.
    return (0.0 if k == 0 else float(centre - half)), (1.0 if k == n else float(centre + half))


def brief(acc: float, lo: float, hi: float) -> str:
    """An accuracy and its 95% interval as a table cell: "68.0% [58.3, 76.3]"."""
    return f"{acc:.1%} [{100 * lo:.1f}, {100 * hi:.1f}]"


class Accuracy:
    """What a Score and a TaskMean share: an accuracy `acc` with its 95% interval `lo`, `hi`."""

    def __str__(self) -> str:
        return format(self)

    @property
    def brief(self) -> str:
        """ "68.0% [58.3, 76.3]": the accuracy and its interval, as table cells show them."""
        return brief(self.acc, self.lo, self.hi)

    def above(self, chance: float) -> bool:
        """Whether the whole interval clears `chance`: only then can the model test a claim
        about the task (a model at chance has nothing an ablation could remove)."""
        return self.lo > chance


@dataclass(frozen=True, eq=False)
class Score(Accuracy):
    """Accuracy over `n` items with a 95% Wilson interval; `correct` says which items were right
    (in item order), for paired comparisons. `margin`, where the choices' log-likelihoods were
    seen, is each item's gold log-likelihood minus the best other choice's (nats): an item whose
    margin is near zero is right or wrong by a hair (`near_ties`)."""

    acc: float
    lo: float
    hi: float
    n: int
    correct: np.ndarray = field(repr=False)
    margin: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def of(cls, correct: Sequence[bool], margin: Sequence[float] | None = None) -> "Score":
        correct = np.asarray(correct, dtype=bool)
        if margin is not None:
            margin = np.asarray(margin, dtype=float)
            if margin.shape != correct.shape:
                raise ValueError(
                    f"one margin per item: {margin.shape} margins for {correct.shape} items"
                )
        lo, hi = wilson(int(correct.sum()), len(correct))
        return cls(
            float(correct.mean()) if len(correct) else float("nan"),
            lo,
            hi,
            len(correct),
            correct,
            margin,
        )

    @classmethod
    def pooled(cls, scores: Iterable["Score"]) -> "Score":
        """One score over the items of several (in order), with their margins where all kept them."""
        scores = list(scores)
        margins = [s.margin for s in scores]
        return cls.of(
            np.concatenate([s.correct for s in scores]),
            None if any(m is None for m in margins) else np.concatenate(margins),
        )

    def subset(self, index) -> "Score":
        """The score over some of the items (`index`: positions, a boolean mask or a slice), with
        their margins."""
        return Score.of(self.correct[index], None if self.margin is None else self.margin[index])

    def __format__(self, spec: str) -> str:
        spec = spec or ".1%"
        return f"{self.acc:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}], n={self.n}"

    def to_json(self) -> dict:
        row = {"correct": "".join("1" if c else "0" for c in self.correct)}
        if self.margin is not None:  # to 0.001 nats: finer than any rounding it is compared with
            # (an item with one choice has no other: its margin is infinite, stored as null)
            row["margin"] = [round(float(m), 3) if math.isfinite(m) else None for m in self.margin]
        return row

    @classmethod
    def from_json(cls, row: dict) -> "Score":
        correct = row.get("correct") if isinstance(row, dict) else None
        margin = row.get("margin") if isinstance(row, dict) else None
        if (
            not isinstance(correct, str)
            or set(correct) - {"0", "1"}
            or not (margin is None or isinstance(margin, list) and len(margin) == len(correct))
        ):
            raise ValueError(
                f"a stored score is {{'correct': '0110...'}}, one 0 or 1 per item (and optionally "
                f"'margin', one number per item); got {str(row)[:120]}: "
                f"the results store holding it was written by other code or edited; delete that store "
                f"(results/<chapter>/*.jsonl) or set GA_RESULTS to a fresh folder"
            )
        return cls.of(
            [c == "1" for c in correct],
            None if margin is None else [math.inf if m is None else m for m in margin],
        )


# What bfloat16's rounding does to a pick: on SmolLM2's KV prompts (100 of 8 keys, against
# float32) it moved the difference between two choices' log-likelihoods by less than this, in
# nats, on 95% of items (0.21-0.23 for the plain scorer, the sweep engine and lm-eval alike);
# tests/test_batch_invariance.py holds it. Letter questions move less (0.035 mean per choice).
BFLOAT16_MARGIN = 0.25


def near_ties(score: Score, within: float = BFLOAT16_MARGIN) -> int | None:
    """How many of the score's items have their gold choice within `within` nats of the best
    other choice (either side), so that a rounding of that size could make them right or wrong;
    None where the score kept no margins."""
    return None if score.margin is None else int((np.abs(score.margin) < within).sum())


def mcnemar(a: Score, b: Score) -> float:
    """Exact two-sided McNemar p-value for two conditions scored on the same items: a binomial
    test of the items right under one condition only."""
    if a.n != b.n:
        raise ValueError(f"paired test on different item sets: n={a.n} and n={b.n}")
    only_a = int((a.correct & ~b.correct).sum())
    only_b = int((~a.correct & b.correct).sum())
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    # The binomial tail P(X <= k), X ~ Bin(n, 1/2), summed in log space: exact big-integer
    # binomials cost seconds once thousands of items disagree (the power simulations' sizes).
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    i = np.arange(k + 1)
    logs = log_factorial[n] - log_factorial[i] - log_factorial[n - i] - n * math.log(2)
    top = logs.max()
    return min(1.0, float(2 * math.exp(top) * np.exp(logs - top).sum()))


def _phi(a: Score, b: Score) -> float:
    both = int((a.correct & b.correct).sum())
    only_a = int((a.correct & ~b.correct).sum())
    only_b = int((~a.correct & b.correct).sum())
    neither = a.n - both - only_a - only_b
    denominator = math.sqrt(
        (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    )
    # Newcombe's correction (as in Altman et al., Statistics with Confidence, 2000): a positive
    # association is shrunk by n/2, so a few concordant pairs cannot narrow the interval to a
    # point (4 identical outcomes would otherwise give [0, 0]).
    association = both * neither - only_a * only_b
    if association > 0:
        association = max(0.0, association - a.n / 2)
    return 0.0 if denominator == 0 else association / denominator


@dataclass(frozen=True)
class Difference:
    """b's accuracy minus a's, with a 95% interval (Newcombe's hybrid score method: paired when
    both were scored on the same items, with McNemar's p; independent otherwise)."""

    delta: float
    lo: float
    hi: float
    p: float | None  # McNemar's exact p for paired scores; None for independent ones

    def __format__(self, spec: str) -> str:
        spec = spec or ".1%"
        pts = lambda x: f"{100 * x:+.1f}"
        p = "" if self.p is None else f", McNemar p={self.p:.2g}"
        return f"{pts(self.delta)} points [{pts(self.lo)}, {pts(self.hi)}]{p}"

    def __str__(self) -> str:
        return format(self)


@dataclass(frozen=True)
class Estimate:
    """A value with its 95% interval, for a table cell that is neither an accuracy nor a
    difference of two (a correlation, a recovery, an overlap, a mean over prompts): "0.85 [0.70,
    0.93]" (", n=40" with n), or as an accuracy ("68.0% [58.3, 76.3]") with percent=True. `page.table` shows the text and gives the
    table's CSV the numbers, as it does for a `Score` or a `Difference`."""

    value: float
    lo: float
    hi: float
    n: int | None = None
    percent: bool = False

    def __format__(self, spec: str) -> str:
        spec = spec or ".2f"
        text = (
            brief(self.value, self.lo, self.hi)
            if self.percent
            else f"{self.value:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"
        )
        return text if self.n is None else f"{text}, n={self.n}"

    def __str__(self) -> str:
        return format(self)


def numbers(cell) -> tuple[float, float, float, int | None] | None:
    """A table cell's value, interval and n when it holds an estimate (a Score, TaskMean,
    Difference or Estimate), else None."""
    if isinstance(cell, Accuracy):
        return cell.acc, cell.lo, cell.hi, cell.n
    if isinstance(cell, Difference):
        return cell.delta, cell.lo, cell.hi, None
    if isinstance(cell, Estimate):
        return cell.value, cell.lo, cell.hi, cell.n
    return None


def difference(a: Score, b: Score, paired: bool = True) -> Difference:
    """b - a with Newcombe's interval (his method 10 for paired proportions, 1998)."""
    pa, pb = a.acc, b.acc
    (la, ua), (lb, ub) = (a.lo, a.hi), (b.lo, b.hi)
    phi = _phi(a, b) if paired else 0.0
    delta = pb - pa
    lower = delta - math.sqrt(
        max(0.0, (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2)
    )
    upper = delta + math.sqrt(
        max(0.0, (ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la) + (pa - la) ** 2)
    )
    return Difference(delta, max(-1.0, lower), min(1.0, upper), mcnemar(a, b) if paired else None)


def mean_of(accs: Sequence[float], ns: Sequence[int]) -> tuple[float, float, float]:
    """Unweighted mean of accuracies over `ns` items each (the released code's knowledge score)
    with a 95% interval: one task's Wilson interval; for several, a normal interval from their
    binomial variances, each taken at (k + 2) / (n + 4) (Agresti and Caffo's adjustment), so that a
    task at 0% or 100% still counts as uncertain rather than exact."""
    accs, ns = np.asarray(accs, dtype=float), np.asarray(ns, dtype=float)
    if len(accs) == 1:
        return (float(accs[0]), *wilson(round(accs[0] * ns[0]), int(ns[0])))
    adjusted = (accs * ns + 2) / (ns + 4)
    half = Z95 * math.sqrt((adjusted * (1 - adjusted) / (ns + 4)).sum() / len(accs) ** 2)
    m = float(accs.mean())
    return m, max(0.0, m - half), min(1.0, m + half)


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Spearman's rank correlation of paired values (ties get their mean rank) with a 95%
    interval from Fisher's z and Fieller, Hartley and Pearson's variance for Spearman's rho,
    1.06 / (n - 3); with fewer than 5 pairs, or a constant side, the interval is unknown (nan)."""

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = v.argsort(kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in np.unique(v):  # ties: their mean rank
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(x), ranks(y)
    if len(rx) < 5 or rx.std() == 0 or ry.std() == 0:
        return float("nan"), float("nan"), float("nan")
    rho = float(np.corrcoef(rx, ry)[0, 1])
    z, half = (
        math.atanh(max(-1 + 1e-12, min(rho, 1 - 1e-12))),
        Z95 * math.sqrt(1.06 / (len(rx) - 3)),
    )
    return rho, math.tanh(z - half), math.tanh(z + half)


def mean_interval(values: Sequence[float], resamples: int = 2000) -> tuple[float, float, float]:
    """The mean of per-prompt measurements with a 95% percentile-bootstrap interval (a fixed
    generator: the same values give the same interval); with fewer than two values the interval is
    unknown (nan)."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return (float(x.mean()) if len(x) else float("nan")), float("nan"), float("nan")
    means = x[np.random.default_rng(0).integers(0, len(x), (resamples, len(x)))].mean(axis=1)
    return float(x.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


@dataclass(frozen=True, eq=False)
class TaskMean(Accuracy):
    """The unweighted mean of several tasks' accuracies, as the released code scores knowledge
    (each task counts once, however many items it has), with `mean_of`'s interval. `chance` is
    the tasks' chance levels averaged the same way. Formats and compares like a `Score`."""

    tasks: tuple[Score, ...]
    chances: tuple[float, ...]

    @classmethod
    def of(cls, tasks: Sequence[Score], chances: Sequence[float]) -> "TaskMean":
        return cls(tuple(tasks), tuple(float(c) for c in chances))

    def __post_init__(self):
        if not self.tasks or len(self.tasks) != len(self.chances):
            raise ValueError(
                f"a mean over tasks needs one chance level per task: {len(self.tasks)} tasks, "
                f"{len(self.chances)} chance levels"
            )

    @property
    def _interval(self) -> tuple[float, float, float]:
        return mean_of([s.acc for s in self.tasks], [s.n for s in self.tasks])

    acc = property(lambda self: self._interval[0])
    lo = property(lambda self: self._interval[1])
    hi = property(lambda self: self._interval[2])
    n = property(lambda self: sum(s.n for s in self.tasks))  # items over all tasks
    chance = property(lambda self: float(np.mean(self.chances)))

    def __format__(self, spec: str) -> str:
        spec = spec or ".1%"
        return f"{self.acc:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}], mean of {len(self.tasks)} task{'s' if len(self.tasks) != 1 else ''}, n={self.n}"


def mean_difference(a: TaskMean, b: TaskMean) -> Difference:
    """b - a for two means over the same tasks, each task's items paired: the mean of the
    per-task paired differences (Newcombe's interval each), their intervals combined as
    independent estimates (the tasks share no items) by the MOVER rule (Zou & Donner, 2008):
    lower = delta - sqrt(sum (d_t - lo_t)^2) / T, upper likewise."""
    if len(a.tasks) != len(b.tasks):
        raise ValueError(f"paired means over different tasks: {len(a.tasks)} and {len(b.tasks)}")
    parts = [difference(x, y) for x, y in zip(a.tasks, b.tasks)]
    t = len(parts)
    delta = sum(d.delta for d in parts) / t
    lower = delta - math.sqrt(sum((d.delta - d.lo) ** 2 for d in parts)) / t
    upper = delta + math.sqrt(sum((d.hi - d.delta) ** 2 for d in parts)) / t
    return Difference(delta, max(-1.0, lower), min(1.0, upper), None)


def difference_in_differences(x_ref, x_other, y_ref, y_other) -> Difference:
    """(x_other - x_ref) - (y_other - y_ref): how much more X changes than Y. Each change is
    paired on its own items (X's conditions share X's items, Y's share Y's); X's and Y's items
    are different, so the two changes are independent and their intervals combine by MOVER."""
    dx, dy = paired(x_ref, x_other), paired(y_ref, y_other)
    delta = dx.delta - dy.delta
    lower = delta - math.sqrt((dx.delta - dx.lo) ** 2 + (dy.hi - dy.delta) ** 2)
    upper = delta + math.sqrt((dx.hi - dx.delta) ** 2 + (dy.delta - dy.lo) ** 2)
    return Difference(delta, max(-2.0, lower), min(2.0, upper), None)


def paired(a, b) -> Difference:
    """b - a, paired on the same items: `difference` for two Scores, `mean_difference` for two
    means over tasks."""
    if isinstance(a, TaskMean) != isinstance(b, TaskMean):
        raise TypeError(
            "compare a mean over tasks with a mean over the same tasks, and a Score with a Score"
        )
    return mean_difference(a, b) if isinstance(a, TaskMean) else difference(a, b)


# --- power: how many items a claim needs --------------------------------------------------------

POWER = 0.8  # a claim's n is the smallest at which its effect is decided this often
POWER_RUNS = 400  # simulated runs per power estimate (a fixed generator: the same n every time)


def simulated_pairs(
    n: int, p_ref: float, p_other: float, discordant: float, runs: int = POWER_RUNS, seed: int = 0
) -> list[tuple[Score, Score]]:
    """`runs` simulated paired scorings of n items: a reference right with probability `p_ref`,
    another condition right with `p_other`, the two disagreeing on a share `discordant` of the
    items (at least |p_ref - p_other|: a pure loss has discordant = p_ref - p_other)."""
    d = p_ref - p_other
    discordant = max(discordant, abs(d))
    p10, p01 = (discordant + d) / 2, (discordant - d) / 2
    p11 = max(0.0, p_ref - p10)
    probs = np.clip([p11, p10, p01, 1 - p11 - p10 - p01], 0, None)
    counts = np.random.default_rng(seed).multinomial(n, probs / probs.sum(), size=runs)
    out = []
    for both, only_ref, only_other, neither in counts:
        ref = np.repeat([True, True, False, False], [both, only_ref, only_other, neither])
        other = np.repeat([True, False, True, False], [both, only_ref, only_other, neither])
        out.append((Score.of(ref), Score.of(other)))
    return out


def power_of(decide, want: str, n: int, p_ref: float, p_other: float, discordant: float) -> float:
    """How often `decide(reference, other)` (a verdict rule's (outcome, evidence)) gives `want`
    on n simulated paired items (`simulated_pairs`)."""
    pairs = simulated_pairs(n, p_ref, p_other, discordant)
    return float(np.mean([decide(a, b)[0] == want for a, b in pairs]))


def powered_n(
    decide,
    want: str,
    p_ref: float,
    p_other: float,
    discordant: float,
    low: int = 10,
    high: int = 20_000,
) -> int | None:
    """The smallest n (to 5%) at which `decide` gives `want` with power POWER, where the
    condition's true accuracy is `p_other` against the reference's `p_ref`; None when even
    `high` items do not (the effect sits on the rule's line)."""
    if power_of(decide, want, high, p_ref, p_other, discordant) < POWER:
        return None
    while high > low * 1.05 and high - low > 1:
        middle = min(high - 1, max(low + 1, int((low * high) ** 0.5)))
        if power_of(decide, want, middle, p_ref, p_other, discordant) >= POWER:
            high = middle
        else:
            low = middle
    return high


def detectable_loss(
    decide, want: str, n: int, p_ref: float, floor: float, resolution: float = 0.005
) -> float | None:
    """The smallest paired loss (a pure loss: items only turn wrong), to `resolution`, that
    `decide` reports as `want` with power POWER on n items, from a reference at `p_ref`, the
    condition at most down to `floor` (chance); None when not even the loss to the floor is.
    Power grows with the loss, so the search halves the interval."""
    power = lambda loss: power_of(decide, want, n, p_ref, p_ref - loss, loss)
    low, high = 0.0, p_ref - floor
    if high <= 0 or power(high) < POWER:
        return None
    while high - low > resolution:
        middle = (low + high) / 2
        low, high = (low, middle) if power(middle) >= POWER else (middle, high)
    return high
