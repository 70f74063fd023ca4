"""Scores and paired differences, on hand-built numbers with known answers (the verdict rules:
tests/test_verdicts.py)."""

import math

import numpy as np
import pytest

from helpers import verdicts as v
from helpers.evaluate import from_loglikelihoods
from helpers.stats import Score, difference, mcnemar, near_ties, wilson
from helpers.tasks import Item


def score(right: int, n: int, first: bool = True) -> Score:
    """n items, `right` of them right: the first ones (or the last ones)."""
    correct = np.arange(n) < right if first else np.arange(n) >= n - right
    return Score.of(correct)


def test_wilson_known_answers():
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson(5, 10) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert wilson(10, 10)[1] == 1.0


def test_score_formats_with_its_interval_and_survives_json():
    s = score(68, 100)
    assert f"{s}" == "68.0% [58.3%, 76.3%], n=100"
    assert s.brief == "68.0% [58.3, 76.3]"  # a table cell
    again = Score.from_json(s.to_json())
    assert (again.acc, again.n) == (s.acc, s.n) and np.array_equal(again.correct, s.correct)
    # a score that saw no log-likelihoods
    assert again.margin is None and near_ties(again, 0.25) is None


def test_margins_are_gold_minus_the_best_other_choice_and_count_near_ties():
    items = [Item(pairs=[("q", " a"), ("q", " b"), ("q", " c")], gold=g) for g in (0, 2, 1)] + [
        Item(pairs=[("q", " a")], gold=0)
    ]
    lls = [
        np.array([-1.0, -1.1, -5.0]),
        np.array([-1.0, -2.0, -3.0]),
        np.array([-2.0, -0.5, -0.6]),
        np.array([-1.0]),
    ]
    s = from_loglikelihoods(lls, items)
    assert s.correct.tolist() == [True, False, True, True]
    # one choice: nothing to tie with
    np.testing.assert_allclose(s.margin, [0.1, -2.0, 0.1, math.inf])
    assert near_ties(s, 0.25) == 2 and near_ties(s, 0.05) == 0 and near_ties(s, 2.5) == 3
    again = Score.from_json(s.to_json())
    np.testing.assert_allclose(again.margin, s.margin)
    with pytest.raises(ValueError, match="one margin per item"):
        Score.of([True, False], [0.1])
    with pytest.raises(ValueError, match="results store"):
        Score.from_json({"correct": "10", "margin": [0.1]})


def test_a_subset_of_a_score_keeps_its_items_margins():
    s = Score.of([True, False, True, True], [0.1, -2.0, 0.3, math.inf])
    for index in ([2, 0], slice(1, None, 2), np.array([True, False, False, True])):
        part = s.subset(index)
        assert part.correct.tolist() == s.correct[index].tolist()
        np.testing.assert_array_equal(part.margin, s.margin[index])
        assert (part.acc, part.lo, part.hi) == (lambda o: (o.acc, o.lo, o.hi))(
            Score.of(s.correct[index])
        )
    assert Score.of([True, False]).subset([1]).margin is None


def test_mcnemar_counts_only_the_discordant_items():
    a = Score.of([1] * 10 + [0] * 10 + [1] * 5)
    b = Score.of([0] * 10 + [0] * 10 + [1] * 5)  # 10 items right under a only
    assert mcnemar(a, b) == pytest.approx(2 / 2**10)
    assert mcnemar(a, a) == 1.0
    with pytest.raises(ValueError, match="different item sets"):
        mcnemar(a, score(3, 7))


def test_paired_interval_is_narrower_than_the_unpaired_one_when_items_agree():
    a = score(60, 100)
    b = Score.of(np.r_[np.ones(50), np.zeros(50)])  # right on a subset of a's right items
    paired, unpaired = difference(a, b), difference(a, b, paired=False)
    assert paired.delta == unpaired.delta == pytest.approx(-0.10)
    assert paired.hi < 0 and (paired.hi - paired.lo) < (unpaired.hi - unpaired.lo)
    assert unpaired.p is None and paired.p == pytest.approx(2 / 2**10)


def test_a_few_identical_outcomes_leave_a_wide_paired_interval():
    # Uncorrected, the correlation of identical outcomes (phi = 1) shrinks the interval to [0, 0]:
    # four prompts would then "show" that an intervention changes nothing.
    a = Score.of([1, 1, 0, 0])
    d = difference(a, Score.of(a.correct.copy()))
    assert d.delta == 0 and d.lo < -0.2 and d.hi > 0.2
    assert v.kept(a, Score.of(a.correct.copy()), 0.05)[0] == v.INCONCLUSIVE
    many = score(100, 200)  # with many items the same agreement does give a narrow interval
    d = difference(many, Score.of(many.correct.copy()))
    assert -0.02 < d.lo < 0 < d.hi < 0.02


def test_rank_correlation_known_answers_and_ties_as_scipy_ranks_them():
    from helpers.stats import rank_correlation

    rho, lo, hi = rank_correlation([1, 2, 3, 4, 5], [2, 1, 4, 3, 5])  # sum d^2 = 4: 1 - 6*4/(5*24)
    assert rho == pytest.approx(0.8) and (lo, hi) == (
        pytest.approx(-0.317, abs=2e-3),
        pytest.approx(0.987, abs=2e-3),
    )
    assert rank_correlation([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1])[0] == pytest.approx(-1.0)
    scipy_stats = pytest.importorskip("scipy.stats")
    x, y = [0.3, 0.3, 0.5, 0.1, 0.9, 0.7, 0.7], [0.2, 0.4, 0.4, 0.1, 0.8, 0.9, 0.5]
    assert rank_correlation(x, y)[0] == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    # too few heads for an interval
    assert all(map(math.isnan, rank_correlation([1, 2, 3], [1, 2, 3])))
    assert all(map(math.isnan, rank_correlation([1, 1, 1, 1, 1], [1, 2, 3, 4, 5])))


def test_rankings_agree_by_top_k_overlap_and_rank_correlation():
    import pandas as pd

    from helpers.protocol.shared import agreement

    def table(accs):
        return (
            pd.DataFrame(
                [
                    dict(layer=1, head=h, estimate=0.0, acc=a, lo=a, hi=a, n=100)
                    for h, a in enumerate(accs)
                ]
            )
            .sort_values("acc", kind="stable")
            .reset_index(drop=True)
        )

    a = table([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    same = agreement(a, a, 3)
    assert (
        same["overlap"] == 3
        and same["rho"] == pytest.approx(1.0)
        and same["chance_overlap"] == pytest.approx(9 / 8)
    )
    reversed_ = agreement(a, table([0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]), 3)
    assert (
        reversed_["overlap"] == 0
        and reversed_["rho"] == pytest.approx(-1.0)
        and reversed_["hi"] < 0
    )
