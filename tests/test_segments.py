import numpy as np
import pytest
import torch

import helpers
from helpers.segments import (
    aggregate_pattern,
    gather_pattern,
    kv_segments,
    mass_by_role,
    mcq_segments,
    sharpness,
)


def test_kv_segments(smol):
    item = helpers.kv_items(3, 1, seed=0, query="repeat")[0]
    seg = kv_segments(smol.tokenizer, item.pairs[0][0])
    assert seg.target == item.gold and seg.segment.max() == 2
    assert [seg.labels[e] for e in seg.ends] == ["\\n"] * 3
    line = [seg.role[t] for t in np.flatnonzero(seg.segment == 1)]
    assert line[0] == "key" and "sep" in line and line[-1] == "end" and line[-2] == "value"
    assert seg.role[-1] == "query" and seg.segment[-1] == -1
    paper = kv_segments(smol.tokenizer, helpers.kv_items(3, 1, seed=0)[0].pairs[0][0])
    assert paper.target == item.gold


def test_mcq_segments(smol):
    item = helpers.load_mmlu("cpu", k=1)[0]
    seg = mcq_segments(smol.tokenizer, item.pairs[0][0], item.gold)
    assert seg.segment.max() == 3 and [
        seg.labels[np.flatnonzero(seg.segment == s)[0]] for s in range(4)
    ] == list("ABCD")


def test_patterns(smol):
    item = helpers.kv_items(3, 1, seed=0)[0]
    seg = kv_segments(smol.tokenizer, item.pairs[0][0])
    T = len(seg)
    g = gather_pattern(seg)
    end = seg.ends[1]
    assert g[end].nonzero().flatten().tolist() == np.flatnonzero(seg.segment == 1).tolist()
    assert torch.equal(g[-1], torch.ones(T, dtype=torch.bool))  # the query row is left causal
    a = aggregate_pattern(seg)
    assert a[-1].nonzero().flatten().tolist() == seg.ends
    assert torch.equal(a[:-1], torch.ones(T, T, dtype=torch.bool).tril()[:-1])
    ac = aggregate_pattern(seg, control=True)
    assert not (ac[-1] & a[-1]).any() and ac[-1].any()
    gc = gather_pattern(seg, control=True)
    assert not gc[end, np.flatnonzero(seg.segment == 1)[0]]


def test_mass_and_sharpness():
    seg = helpers.segments.Segments(
        list("abcdefg"),
        np.array([-1, 0, 0, 1, 1, -1, -1]),
        ["other", "key", "end", "key", "end", "query", "query"],
        1,
    )
    row = np.array([0.1, 0.1, 0.1, 0.2, 0.4, 0.05, 0.05])
    m = mass_by_role(row, seg)
    assert m["answer key"] == 0.2 and m["answer end"] == 0.4 and m["other segments"] == 0.2
    assert abs(sum(m.values()) - 1) < 1e-9
    s = sharpness(row, seg)
    assert s["top segment share"] == s["answer segment share"] == pytest.approx(0.75)


def test_score_with_patterns(smol):
    from helpers.segments import score_with_patterns

    items = helpers.kv_items(3, 4, seed=0, query="repeat")
    plain = helpers.score(smol.model, smol.tokenizer, items)
    seg = lambda c: kv_segments(smol.tokenizer, c)
    # A causal pattern is no restriction: the same answers as the plain scorer.
    same = score_with_patterns(smol, items, seg, lambda s: {(16, 0): causal_of(s)})
    assert np.array_equal(same.correct, plain.correct)
    # The final position of every head in layers 12-21 reading nothing: retrieval is gone.
    cut = score_with_patterns(
        smol,
        items,
        seg,
        lambda s: {(l, h): no_final_row(s) for l in range(12, 22) for h in range(9)},
    )
    assert cut.acc < plain.acc


def causal_of(seg):
    return torch.ones(len(seg), len(seg), dtype=torch.bool).tril()


def no_final_row(seg):
    allowed = causal_of(seg)
    allowed[-1] = False
    return allowed


def test_head_measures_of_an_ideal_gather_and_aggregate_pair():
    """A Gather head whose line ends read only their own line and an Aggregate head whose final
    row reads only the answer line's end score 1 where they should; a uniform head does not."""
    from helpers import synthetic
    from helpers.segments import head_measures

    seg = synthetic.segments(synthetic.items(synthetic.kv(1, 4, np.random.default_rng(0)))[0])
    T = len(seg)
    gather = np.eye(T)
    for s, e in enumerate(seg.ends):
        line = np.flatnonzero(seg.segment == s)
        gather[e] = 0
        gather[e, line] = 1 / len(line)
    aggregate = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    aggregate[-1] = 0
    aggregate[-1, seg.ends[seg.target]] = -2.0  # sign does not matter for SSM rows
    g, a = head_measures(gather, seg), head_measures(aggregate, seg)
    assert g["segment end: own-segment share"] == pytest.approx(1.0)
    assert a["top segment share"] == a["answer segment share"] == pytest.approx(1.0)
    assert a["answer end"] == pytest.approx(2.0) and a["segment entropy"] == pytest.approx(0.0)
    uniform = head_measures(np.tril(np.ones((T, T))), seg)
    assert uniform["top segment share"] == pytest.approx(0.25)
    assert uniform["segment end: own-segment share"] < 1.0
