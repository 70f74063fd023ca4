"""The verdict rules every chapter shares, each on hand-built results both ways, including the
cases measured on the earlier rules (issue 19): a page with one testable claim of four, a
universal claim with one failing part, a head no more harmful than random heads, a loss inside
its own margin, a dissociation tested on one side only, pooled knowledge, a missing role."""

import numpy as np
import pytest

from helpers import book
from helpers import verdicts as v
from helpers.stats import (
    Score,
    TaskMean,
    difference,
    difference_in_differences,
    mean_difference,
    mean_of,
)


def right(n: int, *ranges: tuple[int, int]) -> Score:
    """n items, right on the given [start, stop) ranges."""
    c = np.zeros(n, dtype=bool)
    for start, stop in ranges:
        c[start:stop] = True
    return Score.of(c)


def verdict(outcome: str, kind: str = v.CLAIM) -> v.Verdict:
    return v.Verdict("claim", "Fig. 1", outcome, "", kind)


# --- a page's outcome ---------------------------------------------------------------------------


def test_one_testable_claim_of_four_does_not_make_a_page_reproduced():
    page = [verdict(v.REPRODUCED)] + [verdict(v.NOT_TESTABLE)] * 3
    assert v.overall(page) == v.NOT_TESTABLE
    assert v.tested(page) == (1, 4) and v.tested_note(page) == "1 of 4 claims testable"
    half = [verdict(v.REPRODUCED)] * 2 + [verdict(v.NOT_TESTABLE)] * 2
    assert v.overall(half) == v.REPRODUCED  # at least half testable: the testable ones decide


def test_a_page_agrees_or_is_partly_reproduced():
    assert v.overall([verdict(v.REPRODUCED), verdict(v.NOT_REPRODUCED)]) == v.PARTLY
    assert v.overall([verdict(v.INCONCLUSIVE), verdict(v.NOT_REPRODUCED)]) == v.NOT_REPRODUCED
    assert v.overall([verdict(v.NOT_REPRODUCED)] * 3) == v.NOT_REPRODUCED
    assert v.overall([verdict(v.NOT_TESTABLE)]) == v.NOT_TESTABLE
    with pytest.raises(ValueError, match="unknown outcome"):
        verdict("sort of")
    with pytest.raises(ValueError, match="unknown kind"):
        verdict(v.REPRODUCED, "aside")


def headline(outcome: str) -> v.Verdict:
    return v.Verdict("claim", "Fig. 1", outcome, "", headline=True)


def test_a_page_follows_its_headline_claims():
    # The headline fails; the claims that depend on it hold: the page is not reproduced, not "partly".
    assert (
        v.overall([headline(v.NOT_REPRODUCED), verdict(v.REPRODUCED), verdict(v.REPRODUCED)])
        == v.NOT_REPRODUCED
    )
    assert v.overall([headline(v.INCONCLUSIVE), verdict(v.REPRODUCED)]) == v.INCONCLUSIVE
    assert v.overall([headline(v.NOT_TESTABLE), verdict(v.REPRODUCED)]) == v.NOT_TESTABLE
    # The headline holds: a dependent claim that fails makes the page partly reproduced.
    assert v.overall([headline(v.REPRODUCED), verdict(v.NOT_REPRODUCED)]) == v.PARTLY
    assert (
        v.overall([headline(v.REPRODUCED), verdict(v.REPRODUCED), verdict(v.NOT_TESTABLE)])
        == v.REPRODUCED
    )
    assert (
        v.overall([headline(v.REPRODUCED), headline(v.NOT_REPRODUCED), verdict(v.REPRODUCED)])
        == v.PARTLY
    )
    # Without headlines the old agreement rule stands.
    assert v.overall([verdict(v.NOT_REPRODUCED), verdict(v.REPRODUCED)]) == v.PARTLY


def test_a_dependent_claim_is_judged_only_where_its_premise_holds():
    calls = []
    decide = lambda: calls.append(1) or (v.REPRODUCED, "kept")
    outcome, evidence = v.gated(
        (v.NOT_REPRODUCED, "G zeroed: -1 point"), "zeroing G does not hurt the task", decide
    )
    assert outcome == v.NOT_TESTABLE and "does not hurt" in evidence and not calls
    assert (
        v.gated((v.INCONCLUSIVE, "..."), "zeroing G may not hurt the task", decide)[0]
        == v.NOT_TESTABLE
    )
    assert (
        v.gated((v.REPRODUCED, "G zeroed: -30 points"), "unused", decide) == (v.REPRODUCED, "kept")
        and calls
    )


def test_a_check_is_not_one_of_the_papers_claims():
    check = verdict(v.REPRODUCED, v.CHECK)
    # a page of checks only is judged by its checks; beside claims, a check does not count
    assert v.overall([check]) == v.REPRODUCED and v.tested_note([check]) == "1 of 1 check testable"
    assert v.overall([check, verdict(v.NOT_TESTABLE)]) == v.NOT_TESTABLE
    assert v.tested([check, verdict(v.NOT_TESTABLE)]) == (0, 1)


def test_the_books_summary_shows_checks_apart_from_the_papers_claims():
    pages = {
        "book/toy_zoo": {
            "overall": v.REPRODUCED,
            "subject": "the zoo",
            "tested": "1 of 1 check testable",
            "verdicts": [verdict(v.REPRODUCED, v.CHECK).__dict__ | {"claim": "records equal"}],
        },
        "book/kv": {
            "overall": v.NOT_TESTABLE,
            "subject": "smollm2",
            "tested": "1 of 4 claims testable",
            "verdicts": [verdict(v.REPRODUCED).__dict__ | {"claim": "accuracy falls"}],
        },
    }
    table = book.summary_table(pages)
    zoo = next(line for line in table.splitlines() if "toy_zoo" in line)
    kv = next(line for line in table.splitlines() if "book/kv" in line)
    assert "check: **reproduced**" in zoo and "check: records equal" in zoo
    assert "**not testable**" in kv and "1 of 4 claims testable" in kv and "check:" not in kv


# --- parts of a claim ---------------------------------------------------------------------------


def test_a_universal_claim_needs_every_part():
    parts = [v.REPRODUCED] * 53 + [v.NOT_REPRODUCED]
    assert v.every(parts) == v.NOT_REPRODUCED
    assert v.combine(parts) == v.PARTLY  # a claim that may hold in part
    assert v.every([v.REPRODUCED] * 3 + [v.NOT_TESTABLE]) == v.REPRODUCED
    assert v.every([v.REPRODUCED, v.INCONCLUSIVE]) == v.INCONCLUSIVE
    assert v.every([v.REPRODUCED, v.PARTLY]) == v.NOT_REPRODUCED
    assert v.every([v.NOT_TESTABLE]) == v.NOT_TESTABLE


# --- collapses: paired, and the clean interval --------------------------------------------------


def test_collapses_reads_the_paired_loss_against_the_clean_interval():
    clean = right(100, (0, 70))
    assert v.collapses(clean, right(100, (0, 26)), 0.25)[0] == v.REPRODUCED
    assert v.collapses(clean, right(100, (0, 68)), 0.25)[0] == v.NOT_REPRODUCED
    # loss [14, 31] straddles 18-27
    assert v.collapses(clean, right(100, (0, 47)), 0.25)[0] == v.INCONCLUSIVE
    # clean at chance
    assert v.collapses(right(100, (0, 27)), right(100, (0, 20)), 0.25)[0] == v.NOT_TESTABLE
    # 14 of 20 -> 4 of 20: the ablated interval lies below the point line (47.5%), but the clean
    # interval [48, 86] puts the line anywhere from 37% to 55%: the paired loss cannot tell
    few_clean, few_ablated = right(20, (0, 14)), right(20, (0, 4))
    assert few_ablated.hi < (few_clean.acc + 0.25) / 2
    outcome, evidence = v.collapses(few_clean, few_ablated, 0.25)
    assert outcome == v.INCONCLUSIVE and "loss 50.0 points" in evidence


def test_collapses_is_paired_on_the_items():
    clean = right(200, (0, 120))
    nested = right(200, (0, 55))  # wrong wherever clean is, and on 65 more
    apart = right(200, (145, 200))  # the same accuracy on the other items
    assert difference(clean, nested).hi < difference(clean, apart, paired=False).hi
    assert v.collapses(clean, nested, 0.25)[0] == v.REPRODUCED


# --- kept: an equivalence test ----------------------------------------------------------------------


def test_a_loss_the_interval_cannot_tell_from_the_margin_is_inconclusive_not_a_failure():
    ref = right(200, (0, 120))
    other = right(200, (12, 122))  # 12 items lost, 2 gained: -5.0 [-8.7, -1.3]
    d = difference(ref, other)
    assert (round(100 * d.delta, 1), round(100 * d.lo, 1), round(100 * d.hi, 1)) == (
        -5.0,
        -8.7,
        -1.3,
    )
    assert v.kept(ref, other, 0.25)[0] == v.INCONCLUSIVE


def test_kept_only_when_the_whole_interval_clears_the_margin():
    ref = right(1000, (0, 700))
    other = right(1000, (35, 705))  # a 3-point loss, interval [-4.3, -1.8]: inside 5 points
    assert v.kept(ref, other, 0.25)[0] == v.REPRODUCED
    ref = right(200, (0, 160))
    # -30 points: all below -5
    assert v.kept(ref, right(200, (0, 100)), 0.25)[0] == v.NOT_REPRODUCED
    assert v.kept(ref, Score.of(ref.correct.copy()), 0.25)[0] == v.REPRODUCED
    assert v.kept(*(Score.of([1, 1, 0, 1]), Score.of([1, 0, 0, 1])), 0.0)[0] == v.INCONCLUSIVE
    assert v.kept(right(100, (0, 27)), right(100, (0, 27)), 0.25)[0] == v.NOT_TESTABLE


def test_falls_and_below_are_paired():
    clean = right(200, (0, 80))
    same = Score.of(clean.correct.copy())
    assert v.falls(clean, same, 0.1)[0] == v.NOT_REPRODUCED
    assert v.falls(clean, right(200, (0, 50)), 0.1)[0] == v.REPRODUCED
    # 8 lost, 3 gained: -2.5 [-5.9, +0.9]
    assert v.below(clean, right(200, (8, 83)))[0] == v.INCONCLUSIVE


# --- a bottleneck must beat the random controls -------------------------------------------------------


def test_a_head_no_more_harmful_than_random_heads_is_not_a_bottleneck():
    clean, head = right(200, (0, 140)), right(200, (0, 50))
    harmless = [Score.of(clean.correct.copy()), right(200, (0, 138))]
    assert v.beats_controls(clean, head, harmless, 0.25)[0] == v.REPRODUCED
    as_harmful = harmless + [Score.of(head.correct.copy())]  # one draw does as much as the head
    outcome, evidence = v.beats_controls(clean, head, as_harmful, 0.25)
    assert outcome == v.NOT_REPRODUCED and "3 draws" in evidence  # not "partly"
    # no collapse
    assert v.beats_controls(clean, right(200, (0, 138)), harmless, 0.25)[0] == v.NOT_REPRODUCED
    assert v.beats_controls(clean, head, [], 0.25)[0] == v.INCONCLUSIVE  # nothing to beat
    assert v.beats_controls(right(200, (0, 52)), head, harmless, 0.25)[0] == v.NOT_TESTABLE


def test_a_fall_beyond_random_controls_needs_a_fall_and_every_control_above_it():
    # Table 2's claim on a generative task: lower, and lower than random heads; not "to chance".
    # 10 points lower: far from exact match's 0
    clean, top = (
        right(100, (0, 60)),
        right(100, (0, 50)),
    )
    harmless = [Score.of(clean.correct.copy()), right(100, (0, 58))]
    assert v.falls_beyond_controls(clean, top, harmless, 0.05)[0] == v.REPRODUCED
    # not most of the way to 0
    assert v.beats_controls(clean, top, harmless, 0.05)[0] == v.NOT_REPRODUCED
    outcome, evidence = v.falls_beyond_controls(
        clean, top, harmless + [Score.of(top.correct.copy())], 0.05
    )
    # a draw as harmful as the top heads
    assert outcome == v.NOT_REPRODUCED and "3 draws" in evidence
    assert (
        v.falls_beyond_controls(clean, Score.of(clean.correct.copy()), harmless, 0.05)[0]
        == v.NOT_REPRODUCED
    )
    assert v.falls_beyond_controls(clean, top, [], 0.05)[0] == v.INCONCLUSIVE  # nothing to beat
    # the floor: a clean score whose interval does not clear it cannot test the claim
    assert (
        v.falls_beyond_controls(right(100, (0, 4)), right(100), harmless, 0.05)[0] == v.NOT_TESTABLE
    )
    assert (
        v.falls_beyond_controls(right(100, (0, 12)), right(100), [right(100, (0, 12))], 0.05)[0]
        == v.REPRODUCED
    )


# --- "X kept while Y falls": a difference in differences -----------------------------------------------


def test_kept_while_falls_needs_x_kept_and_y_falling_further():
    mmlu, mmlu_cut = right(400, (0, 260)), right(400, (2, 260))  # kept: -0.5 points
    know, know_fell, know_kept = right(400, (0, 280)), right(400, (0, 200)), right(400, (0, 279))
    assert v.kept_while_falls(mmlu, mmlu_cut, know, know_fell, 0.25)[0] == v.REPRODUCED
    outcome, evidence = v.kept_while_falls(mmlu, mmlu_cut, know, know_kept, 0.25)
    assert outcome == v.NOT_REPRODUCED and "change minus" in evidence  # knowledge does not fall
    both_fall = right(400, (0, 180))
    # MMLU not kept
    assert v.kept_while_falls(mmlu, both_fall, know, know_fell, 0.25)[0] == v.NOT_REPRODUCED
    assert (
        v.kept_while_falls(right(400, (0, 100)), mmlu_cut, know, know_fell, 0.3)[0]
        == v.NOT_TESTABLE
    )


def test_kept_while_falls_needs_the_second_measure_to_fall():
    # Letters rise a little (kept) and knowledge does not move: the difference in differences is
    # above zero, but nothing fell, so there is no dissociation.
    letters, letters_up = right(400, (0, 260)), right(400, (0, 275))
    know, know_same = right(400, (0, 280)), right(400, (0, 280))
    outcome, evidence = v.kept_while_falls(letters, letters_up, know, know_same, 0.25)
    assert outcome == v.NOT_REPRODUCED and "falls (not reproduced)" in evidence
    know_fell = right(400, (0, 200))
    assert v.kept_while_falls(letters, letters_up, know, know_fell, 0.25)[0] == v.REPRODUCED


def test_the_difference_in_differences_pairs_within_each_task_only():
    x, x2 = right(300, (0, 200)), right(300, (0, 190))
    y, y2 = right(100, (0, 70)), right(100, (0, 40))
    did = difference_in_differences(x, x2, y, y2)
    dx, dy = difference(x, x2), difference(y, y2)
    assert did.delta == pytest.approx(dx.delta - dy.delta) == pytest.approx(-10 / 300 + 0.30)
    # the two changes are independent: their half-widths add in quadrature (MOVER)
    assert did.lo == pytest.approx(did.delta - np.hypot(dx.delta - dx.lo, dy.hi - dy.delta))
    assert did.hi == pytest.approx(did.delta + np.hypot(dx.hi - dx.delta, dy.delta - dy.lo))


# --- knowledge: the unweighted mean over tasks ---------------------------------------------------------


def test_knowledge_is_the_unweighted_mean_over_tasks_as_the_release_computes_it():
    big, small = right(1000, (0, 900)), right(100, (0, 30))
    k = TaskMean((big, small), (0.5, 0.25))
    assert k.acc == pytest.approx(0.6)  # pooled items would give 930 / 1100 = 84.5%
    assert (k.acc, k.lo, k.hi) == pytest.approx(mean_of([0.9, 0.3], [1000, 100]))
    assert k.n == 1100 and k.chance == pytest.approx(0.375) and "mean of 2 tasks" in f"{k}"
    with pytest.raises(ValueError, match="one chance level per task"):
        TaskMean((big,), (0.5, 0.25))


def test_knowledge_differences_are_paired_within_each_task():
    a = TaskMean((right(100, (0, 80)),), (0.25,))
    b = TaskMean((right(100, (0, 60)),), (0.25,))
    one = difference(a.tasks[0], b.tasks[0])
    d = mean_difference(a, b)
    # one task: its own difference
    assert (d.delta, d.lo, d.hi) == pytest.approx((one.delta, one.lo, one.hi))
    two_a = TaskMean((right(100, (0, 80)), right(100, (0, 50))), (0.25, 0.5))
    two_b = TaskMean((right(100, (0, 60)), right(100, (0, 50))), (0.25, 0.5))
    d2 = mean_difference(two_a, two_b)
    assert d2.delta == pytest.approx(-0.10) and d2.hi - d2.lo < one.hi - one.lo
    assert v.kept(two_a, two_b, 0.3)[0] == v.NOT_REPRODUCED
    assert v.kept(two_a, two_a, 0.3)[0] == v.REPRODUCED
    with pytest.raises(TypeError, match="mean over the same tasks"):
        v.kept(two_a, right(100, (0, 50)), 0.3)


# --- a missing role is an outcome ----------------------------------------------------------------


def test_harmful_heads_that_are_not_gather_or_aggregate_are_another_mechanism():
    outcome, evidence = v.another_mechanism(
        "Gather", "the best is a previous-token head (L16H0)", measured=True
    )
    assert outcome == v.NOT_REPRODUCED and evidence.startswith("another mechanism")
    assert v.another_mechanism("Gather", "single SSM channels", measured=False)[0] == v.NOT_TESTABLE
    outcome, evidence = v.another_mechanism(
        "Gather", "the best is 0.46 [0.31, 0.62]", measured=True, sure=False
    )
    assert outcome == v.INCONCLUSIVE and "reaches the line" in evidence


# --- a ranking is read past the chance and ceiling checks ------------------------------------------


def test_a_ranking_needs_a_model_above_chance_and_a_head_that_moves_it():
    clean = right(200, (0, 180))
    assert v.ranking_readable(clean, (0.40, 0.33, 0.47), 0.125) == (True, "")
    # the top head leaves 90%: ties
    readable, why = v.ranking_readable(clean, (0.90, 0.85, 0.93), 0.125)
    assert not readable and why.startswith("no single head moves it")
    readable, why = v.ranking_readable(right(200, (0, 26)), (0.10, 0.06, 0.15), 0.125)
    assert not readable and "at chance" in why
