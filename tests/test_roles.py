"""Harm-aware roles, on hand-built measures: the candidates are the heads whose zeroing hurts, the
most harmful that behaves as a role takes it, ties are reported, and an Aggregate head may read
an option's letter as well as its newline."""

import numpy as np
import pandas as pd
import pytest

from helpers import heads as hd
from helpers.heads import Head
from helpers.protocol.roles import harmful, near_ties
from helpers.segments import Segments, head_measures
from helpers.stats import Score


def measures(rows: dict[Head, tuple[float, float, float]]) -> pd.DataFrame:
    """(own-segment share, summary share, local share) per head, as `segments.head_measures` names them."""
    return pd.DataFrame(
        {
            hd.GATHER_MEASURE: [r[0] for r in rows.values()],
            hd.AGGREGATE_MEASURE: [r[1] for r in rows.values()],
            hd.LOCAL_MEASURE: [r[2] for r in rows.values()],
        },
        index=pd.Index(list(rows)),
    )


def test_the_most_harmful_head_that_behaves_takes_the_role_not_the_one_that_behaves_most():
    # The toy Mamba-2: L0H0 is the most harmful head (36% zeroed) and keeps 0.72 of its segment ends'
    # mass inside; L0H2 (74% zeroed) keeps 0.74. By behaviour alone L0H2 would be the Gather head.
    m = measures(
        {Head(0, 2): (0.74, 0.1, 0.3), Head(0, 0): (0.72, 0.1, 0.3), Head(1, 1): (0.2, 0.97, 0.1)}
    )
    assert hd.assign_roles(m, [Head(0, 0), Head(1, 1), Head(0, 2)]) == {
        "G": Head(0, 0),
        "A": Head(1, 1),
    }
    # the order decides
    assert hd.assign_roles(m, [Head(0, 2), Head(0, 0), Head(1, 1)])["G"] == Head(0, 2)
    # A previous-token head never plays Gather, and a role nobody shows stays empty.
    local = measures({Head(0, 0): (0.9, 0.1, 0.95), Head(1, 1): (0.2, 0.3, 0.1)})
    assert hd.assign_roles(local, [Head(0, 0), Head(1, 1)]) == {"G": None, "A": None}


def at(acc: float, n: int = 200) -> Score:
    return Score.of(np.arange(n) < round(acc * n))


def test_candidates_are_the_heads_whose_zeroing_surely_hurts_most_harmful_first():
    clean = at(0.8)
    table = hd.ranking_table(
        {Head(1, 0): -3.0, Head(1, 1): -2.0, Head(2, 0): -1.0, Head(2, 1): 0.0},
        {Head(1, 0): at(0.3), Head(1, 1): at(0.79), Head(2, 0): at(0.6)},
    )
    # one item fewer is no harm; L2H1 was not measured
    assert harmful(table, clean) == [
        Head(1, 0),
        Head(2, 0),
    ]
    assert harmful(table, at(0.3)) == []  # against a clean run that low, nothing hurts
    ties = hd.ranking_table(
        {Head(1, 0): 0.0, Head(1, 1): 0.0, Head(2, 0): 0.0},
        {Head(1, 0): at(0.30), Head(1, 1): at(0.33), Head(2, 0): at(0.60)},
    )
    assert near_ties(ties, Head(1, 0), [Head(1, 1), Head(2, 0)]) == (Head(1, 1),)


def test_an_aggregate_head_may_read_the_options_letters_instead_of_their_newlines():
    # Two options "A. x\n" "B. y\n" then the final position; tokens: A . x \n B . y \n Answer
    roles = ["letter", "sep", "value", "end"] * 2 + ["query"]
    seg = Segments(list("A.x\nB.y\n?"), np.array([0, 0, 0, 0, 1, 1, 1, 1, -1]), roles, target=1)
    a = np.zeros((9, 9))
    a[-1, [0, 4]] = 0.45  # the final position reads the letters
    a[-1, 6] = 0.1
    reads = head_measures(a, seg)
    assert (
        reads[hd.LETTERS_MEASURE] == 0.9
        and reads[hd.ENDS_MEASURE] == 0.0
        and reads[hd.AGGREGATE_MEASURE] == 0.9
    )
    newline = np.zeros((9, 9))
    newline[-1, [3, 7]] = 0.5
    reads = head_measures(newline, seg)
    assert (
        reads[hd.ENDS_MEASURE] == 1.0
        and reads[hd.LETTERS_MEASURE] == 0.0
        and reads[hd.AGGREGATE_MEASURE] == 1.0
    )


def test_a_head_whose_final_position_reads_next_to_nothing_of_the_segments_is_no_aggregate_head():
    # Qwen's L0H10: its final position reads "Answer:" with all its attention; what little reaches
    # the options lands on their letters. A share of next to nothing is not the Aggregate behaviour.
    roles = ["letter", "sep", "value", "end"] * 2 + ["query"]
    seg = Segments(list("A.x\nB.y\n?"), np.array([0, 0, 0, 0, 1, 1, 1, 1, -1]), roles, target=1)
    local = np.zeros((9, 9))
    local[-1, -1], local[-1, [0, 4]] = 0.99, 0.005
    reads = head_measures(local, seg)
    assert reads[hd.SEGMENTS_MEASURE] == pytest.approx(0.01) and reads[
        hd.AGGREGATE_MEASURE
    ] == pytest.approx(0.2)
    m = pd.DataFrame(
        [{**reads, hd.GATHER_MEASURE: 0.0, hd.LOCAL_MEASURE: 0.0}], index=pd.Index([Head(0, 10)])
    )
    assert hd.assign_roles(m)["A"] is None
    # The same letters read with a tenth of its attention (the rest on an attention sink): an Aggregate head.
    sink = np.zeros((9, 9))
    sink[-1, -1], sink[-1, [0, 4]] = 0.9, 0.05
    reads = head_measures(sink, seg)
    assert reads[hd.SEGMENTS_MEASURE] == pytest.approx(0.1) and reads[
        hd.AGGREGATE_MEASURE
    ] == pytest.approx(1.0)
    assert hd.assign_roles(
        pd.DataFrame(
            [{**reads, hd.GATHER_MEASURE: 0.0, hd.LOCAL_MEASURE: 0.0}],
            index=pd.Index([Head(0, 10)]),
        )
    )["A"] == Head(0, 10)
