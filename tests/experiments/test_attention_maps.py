"""Attention maps: the run at smoke size, every verdict both ways on hand-built results, roles
by behaviour on hand-built measures, and bad parameters."""

import numpy as np
import pandas as pd
import pytest

from helpers import heads as hd
from helpers import reference
from helpers import verdicts as v
from helpers.errors import ConfigError
from helpers.experiments import attention_maps as chapter
from helpers.heads import Head
from helpers.protocol import roles
from helpers.segments import Segments
from helpers.stats import Score


def test_run_at_smoke_size_measures_both_roles_on_every_prompt():
    # Heads given: the shared KV ranking (minutes on CPU) has its own tests. Small prompts, for time.
    cfg = chapter.Config.for_profile(
        "cpu", smoke=True, gather=["L16H0"], aggregate=["L18H6"], n_prompts=2, n_mmlu=2, kv_pairs=4
    )
    result = chapter.run(cfg)
    assert result.roles.source == "set" and result.roles.heads == {
        "G": (Head(16, 0),),
        "A": (Head(18, 6),),
    }
    for name, m in result.measures.items():
        assert len(m) == 2 * 2 and set(m.role) == {"G", "A"} and result.accuracy[name].n == 2
        seg, maps = result.examples[name]
        assert maps["G"].shape == (len(seg), len(seg))
    assert {x.outcome for x in chapter.verdicts(result)} <= set(v.OUTCOMES)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert len(chapter.summary(result)) == len(chapter.MEASURES)
    assert chapter.figure(result, "kv", "A").axes


def made_up(g_own, g_local, a_ends, a_answer, acc=0.8, n=40, filled=True):
    """A Result whose per-prompt measures scatter (sd 0.05) around the given means."""
    rng = np.random.default_rng(0)
    noisy = lambda x: np.clip(x + 0.05 * rng.standard_normal(n), 0, 1)
    rows = [
        dict(role="G", prompt=i, **{hd.GATHER_MEASURE: a, hd.LOCAL_MEASURE: b})
        for i, (a, b) in enumerate(zip(noisy(g_own), noisy(g_local)))
    ]
    rows += [
        dict(role="A", prompt=i, **{hd.AGGREGATE_MEASURE: a, roles.ANSWER_END: b})
        for i, (a, b) in enumerate(zip(noisy(a_ends), noisy(a_answer)))
    ]
    name = "KV retrieval (8 keys)"
    seg = type("Seg", (), {"ends": list(range(8))})()
    named = roles.Roles(
        {"G": (Head(16, 22),), "A": (Head(17, 24),)},
        "paper" if filled else "behaviour",
        closest=() if filled else ("A",),
    )
    return chapter.Result(
        chapter.Config.for_profile("paper"),
        named,
        {name: Score.of(np.arange(n) < acc * n)},
        {name: 0.125},
        {name: pd.DataFrame(rows)},
        {name: (seg, {})},
        {},
        {name: "kv"},
    )


def test_the_papers_patterns_are_reproduced():
    outcomes = [x.outcome for x in chapter.verdicts(made_up(0.9, 0.3, 0.8, 0.7))]
    assert outcomes == [v.REPRODUCED] * 3


def test_a_previous_token_head_and_an_aggregate_head_that_reads_no_ends_are_not_the_papers():
    g, ends, answer = chapter.verdicts(made_up(0.9, 0.95, 0.1, 0.2))
    assert g.outcome == v.NOT_REPRODUCED and "previous-token heads: above 0.8" in g.evidence
    assert ends.outcome == answer.outcome == v.NOT_REPRODUCED
    # straddles the line
    assert chapter.verdicts(made_up(0.5, 0.3, 0.8, 0.7))[0].outcome == v.INCONCLUSIVE


def test_a_model_at_chance_cannot_show_the_mechanism_and_a_missing_role_is_named():
    (only,) = chapter.verdicts(made_up(0.9, 0.3, 0.8, 0.7, acc=0.1))
    assert only.outcome == v.NOT_TESTABLE and "does not clear chance" in only.evidence
    missing = chapter.verdicts(made_up(0.9, 0.3, 0.1, 0.2, filled=False))
    assert "no top head behaves as the Aggregate head" in missing[1].evidence
    assert {x.outcome for x in chapter.verdicts(made_up(0.9, 0.3, 0.8, 0.7, n=3))} == {
        v.INCONCLUSIVE
    }


def test_roles_by_behaviour_fill_a_missing_role_with_the_closest_candidate():
    columns = [hd.AGGREGATE_MEASURE, hd.GATHER_MEASURE, hd.LOCAL_MEASURE]
    index = [Head(18, 6), Head(16, 0), Head(17, 1), Head(19, 8)]
    measures = pd.DataFrame(
        [[0.0, 0.5, 0.04], [0.3, 1.0, 0.95], [0.2, 0.7, 0.2], [0.28, 0.96, 0.89]],
        columns=columns,
        index=index,
    )
    heads, filled = roles.closest_roles(measures)
    assert filled == {"G": True, "A": False}  # no head puts half its mass on the ends
    # L16H0 and L19H8 are local: not Gather heads
    assert heads == {
        "G": (Head(17, 1),),
        "A": (Head(16, 0),),
    }
    measures.loc[[Head(18, 6)], hd.AGGREGATE_MEASURE] = 0.9
    assert roles.closest_roles(measures) == (
        {"G": (Head(17, 1),), "A": (Head(18, 6),)},
        {"G": True, "A": True},
    )


def test_a_head_that_reads_a_sink_and_the_previous_token_is_local_at_the_segment_ends():
    seg = Segments(
        ["<s>", "a", ":", "1", "\\n", "b", ":", "2", "\\n", "b", ":"],
        np.array([-1, 0, 0, 0, 0, 1, 1, 1, 1, -1, -1]),
        ["other"] + ["key", "sep", "value", "end"] * 2 + ["query"] * 2,
        1,
    )
    a = np.eye(len(seg)) * 0.02
    a[:, 0] = 0.8  # the sink
    for t in range(1, len(seg)):
        a[t, t - 1] = 0.18
    m = roles.measures(a, seg)
    assert m[hd.LOCAL_MEASURE] == pytest.approx(1.0)  # over the whole row it would be 0.2


def test_the_papers_heads_come_from_the_reference_table():
    assert reference.paper_heads("llamba-8b") == {
        "G": (Head(16, 10),),
        "A": (Head(17, 3), Head(17, 9)),
    }
    # channel 3186
    assert reference.paper_heads("falcon-mamba-7b-instruct")["G"][0] == Head(35, 3186)
    assert reference.paper_heads("smollm2-135m-instruct") is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gather=["L16H22"]), "set gather and aggregate together"),
        (dict(model="zamba2-7b"), "model must be a model \\(attention or ssm\\)"),
        (dict(n_prompts=0), "n_prompts must be at least 1"),
        (dict(aggregate=["L17H24"], gather=["L16"]), "cannot read 'L16' as a head"),
    ],
)
def test_bad_parameters_fail_before_any_model_loads(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        chapter.Config.for_profile("cpu", **kwargs)


def test_the_roles_are_measured_once_for_every_chapter(monkeypatch):
    # KV retrieval, attention maps and masking name roles among the same candidates on the same
    # prompts: the second asks the results store, and gets exactly what the first measured.
    from helpers.protocol import loading

    loaded = loading.load("toy-transformer")
    from helpers.sweep import Store

    first = roles.find_roles(loaded, "cpu", True, seed=3)
    # nothing computed: nothing stored (a store is versioned by its measurements' code, so a spy
    # cannot stand in for one)
    monkeypatch.setattr(
        Store, "put", lambda self, cell, result: pytest.fail(f"measured again: {cell}")
    )
    again = roles.find_roles(loaded, "cpu", True, seed=3)
    assert first.measures is not None and len(first.measures) > 0
    pd.testing.assert_frame_equal(first.measures, again.measures)
    assert (first.heads, first.found) == (again.heads, again.found)


def test_the_maps_name_the_roles_every_chapter_names():
    # One assignment (roles.find_roles, the seed's KV ranking): KV retrieval's roles, and where no
    # harmful head plays a role, the closest measured head, said so. The toy Transformer at the CPU
    # sizes (seconds; at smoke size no head's harm shows on 4 prompts) and seed 1 has an Aggregate
    # head on KV and no Gather head (its first layer's heads only look back one token): both cases.
    from helpers.experiments import kv_retrieval

    kv = kv_retrieval.run(
        kv_retrieval.Config.for_profile("cpu", model="toy-transformer", seed=1, sizes=[2, 8, 32])
    )
    maps = chapter.run(chapter.Config.for_profile("cpu", model="toy-transformer", seed=1))
    assert maps.roles.source == kv.roles.source == "behaviour"
    assert kv.roles.heads["A"] and not kv.roles.heads["G"]
    assert maps.roles.heads["A"] == kv.roles.heads["A"] and maps.roles.filled["A"]
    assert (
        maps.roles.closest == ("G",)
        and "the closest" in maps.roles.describe("G")
        and maps.roles.heads["G"]
    )
