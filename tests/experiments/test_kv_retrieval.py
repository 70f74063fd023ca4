"""KV retrieval: the run at smoke size, and every verdict both ways on hand-built results."""

import dataclasses
import os
import tempfile

import numpy as np
import pandas as pd
import pytest

from helpers import verdicts as v
from helpers.errors import ConfigError
from helpers.experiments import kv_retrieval as chapter
from helpers.heads import Head
from helpers.protocol.roles import Roles
from helpers.protocol.shared import Ranking
from helpers.stats import Score

G, A = Head(16, 22), Head(17, 24)


def test_run_at_smoke_size_scores_every_size_and_both_rankings():
    # The toy Transformer: the same code path as SmolLM2 (which the book's smoke build runs), with
    # two shared rankings of seconds rather than minutes.
    result = chapter.run(chapter.Config.for_profile("cpu", smoke=True, model="toy-transformer"))
    # the zoo's token task: no query forms
    assert result.sizes == [2, 8] and set(result.rankings) == {"released"}
    assert {len(s.correct) for by_size in result.scores.values() for s in by_size.values()} == {3}
    assert set(result.scores) == {"model"} | {f"{r} removed" for r in "GA" if result.roles.heads[r]}
    assert {x.outcome for x in chapter.verdicts(result)} <= set(v.OUTCOMES)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert set(chapter.top_heads(result)["value follows"]) == {"with no space (released)"}


def at(acc, n=200):
    return Score.of(np.arange(n) < round(acc * n))


def ranking(order, accs=None):
    """A ranking whose measured heads are `order`, most harmful first."""
    accs = accs or [0.1 + 0.05 * i for i in range(len(order))]
    table = pd.DataFrame(
        [
            dict(
                layer=h.layer,
                head=h.head,
                estimate=-1.0 + i,
                acc=a,
                lo=a - 0.05,
                hi=a + 0.05,
                n=200,
            )
            for i, (h, a) in enumerate(zip(order, accs))
        ]
    )
    return Ranking("llama-3.1-8b-instruct", {"pairs": 8, "n": 200}, at(0.9), table)


def made_up(
    model, gather, aggregate, source="paper", order=(G, A, Head(3, 1), Head(5, 2), Head(8, 0))
):
    """A Result over sizes 2, 8, 32 with the given accuracies per size."""
    sizes = [2, 8, 32]
    scores = {
        "model": {k: at(a) for k, a in zip(sizes, model)},
        "G removed": {k: at(a) for k, a in zip(sizes, gather)},
        "A removed": {k: at(a) for k, a in zip(sizes, aggregate)},
    }
    roles = Roles({"G": (G,), "A": (A,)}, source)
    ranked = ranking(list(order))
    return chapter.Result(
        chapter.Config.for_profile("paper"),
        scores,
        roles,
        {"released": ranked, "spaced": ranked},
        {},
        {("released", "spaced"): False, ("spaced", "trailing"): True},
    )


def test_the_papers_fig_4_is_reproduced():
    # The zeroed heads' lines fall further behind the model's as the dictionary grows.
    result = made_up(model=[0.95, 0.85, 0.7], gather=[0.9, 0.6, 0.2], aggregate=[0.85, 0.5, 0.15])
    assert [x.outcome for x in chapter.verdicts(result)] == [v.REPRODUCED] * 5


def test_accuracy_that_rises_and_heads_that_do_nothing_are_not_the_papers_picture():
    result = made_up(model=[0.6, 0.7, 0.9], gather=[0.6, 0.7, 0.9], aggregate=[0.2, 0.7, 0.9])
    trend, gather, aggregate, *_ = chapter.verdicts(result)
    assert trend.outcome == v.NOT_REPRODUCED
    # G does nothing at any size: whether it widens a gap is not testable (judged beside a head that hurts)
    assert gather.outcome == v.NOT_TESTABLE and "lowers retrieval at no size" in gather.evidence
    # A costs 40 points at 2 keys and nothing at 32: the gap narrows
    assert aggregate.outcome == v.NOT_REPRODUCED and "the gap widens" in aggregate.evidence
    # A gap that stays the same size: not a widening one
    steady = made_up(model=[0.95, 0.85, 0.7], gather=[0.75, 0.65, 0.5], aggregate=[0.75, 0.65, 0.5])
    # too few items to exclude a small widening, but no widening
    assert chapter.verdicts(steady)[1].outcome != v.REPRODUCED


def test_a_role_no_harmful_head_plays_is_one_finding():
    import helpers.heads as hd

    result = made_up(
        model=[0.95, 0.85, 0.7],
        gather=[0.9, 0.6, 0.2],
        aggregate=[0.85, 0.5, 0.15],
        source="behaviour",
    )
    # a previous-token head, and no aggregating one
    local = pd.DataFrame(
        {hd.GATHER_MEASURE: [0.9], hd.AGGREGATE_MEASURE: [0.2], hd.LOCAL_MEASURE: [0.95]},
        index=pd.Index([G]),
    )
    measured = Roles(
        {"G": (), "A": ()}, "behaviour", local, {"G": None, "A": None}, candidates=(G,)
    )
    trend, roles, gather, aggregate, *_ = chapter.verdicts(
        dataclasses.replace(result, roles=measured)
    )
    assert (
        roles.headline
        and roles.outcome == v.NOT_REPRODUCED
        and "another mechanism" in roles.evidence
    )
    assert "L16H22 reads the previous token" in roles.evidence
    assert gather.outcome == aggregate.outcome == v.NOT_TESTABLE  # one finding, not one per claim
    unmeasured = Roles({"G": (), "A": ()}, "behaviour")
    assert (
        chapter.verdicts(dataclasses.replace(result, roles=unmeasured))[1].outcome == v.NOT_TESTABLE
    )


def test_heads_ranked_low_are_not_top_ranked_and_heads_found_by_ranking_cannot_test_it():
    others = [Head(3, i) for i in range(6)]
    low = made_up(
        model=[0.95, 0.85, 0.7],
        gather=[0.9, 0.6, 0.2],
        aggregate=[0.85, 0.5, 0.15],
        order=others + [G, A],
    )
    assert [x.outcome for x in chapter.verdicts(low)][3:] == [v.NOT_REPRODUCED] * 2
    unswept = made_up(
        model=[0.95, 0.85, 0.7], gather=[0.9, 0.6, 0.2], aggregate=[0.85, 0.5, 0.15], order=others
    )
    assert chapter.verdicts(unswept)[3].outcome == v.NOT_TESTABLE  # not read as "not reproduced"
    assert "was not swept exactly" in chapter.verdicts(unswept)[3].evidence
    ours = made_up(
        model=[0.95, 0.85, 0.7],
        gather=[0.9, 0.6, 0.2],
        aggregate=[0.85, 0.5, 0.15],
        source="behaviour",
    )
    assert [x.outcome for x in chapter.verdicts(ours)][-2:] == [v.NOT_TESTABLE] * 2


def test_a_model_at_chance_cannot_lose_what_it_does_not_have():
    result = made_up(model=[0.5, 0.12, 0.03], gather=[0.5, 0.12, 0.03], aggregate=[0.5, 0.12, 0.03])
    trend, gather, *_ = chapter.verdicts(result)
    assert trend.outcome == gather.outcome == v.NOT_TESTABLE


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sizes=[0, 4]), "sizes must all be at least 1"),
        (
            dict(sizes=[8, 120]),
            "sizes: a KV dictionary for smollm2-135m-instruct holds at most 100 keys",
        ),
        (dict(gather=["L16H22"]), "set gather and aggregate together"),
        (dict(n_per_size=0), "n_per_size must be at least 1"),
    ],
)
def test_bad_parameters_fail_before_any_model_loads(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        chapter.Config.for_profile("cpu", **kwargs)


def test_a_ranking_is_read_only_past_the_chance_and_the_ceiling_checks():
    result = made_up(model=[0.95, 0.85, 0.7], gather=[0.9, 0.6, 0.2], aggregate=[0.85, 0.5, 0.15])
    # no head moves the clean 90%
    flat = ranking([G, A, Head(3, 1), Head(5, 2), Head(8, 0)], accs=[0.9] * 5)
    at_ceiling = dataclasses.replace(result, rankings={"released": flat, "spaced": flat})
    top_g = chapter.verdicts(at_ceiling)[3]
    assert top_g.outcome == v.NOT_TESTABLE and "no single head moves it" in top_g.evidence
    at_chance = dataclasses.replace(flat, clean=at(0.12), table=ranking([G, A]).table)
    assert (
        "at chance"
        in chapter.verdicts(dataclasses.replace(result, rankings={"released": at_chance}))[
            3
        ].evidence
    )
    # the readable ranking of the paper's picture
    assert chapter.verdicts(result)[3].outcome == v.REPRODUCED


def test_the_released_form_is_compared_with_the_spaced_one_unless_they_are_the_same_tokens():
    result = made_up(model=[0.95, 0.8, 0.5], gather=[0.5, 0.3, 0.1], aggregate=[0.4, 0.2, 0.05])
    note = chapter.forms_note(result)
    assert (
        note.startswith("released against spaced, top 4: 4 of 4 shared")
        and "same tokens as the spaced form" in note
    )
    same = dataclasses.replace(
        result, same_tokens={("released", "spaced"): True, ("spaced", "trailing"): True}
    )
    assert "same tokens on this tokenizer, one computation" in chapter.forms_note(same)


def test_the_paper_heads_layers_are_swept_exactly_whatever_the_screen_says():
    from types import SimpleNamespace

    import helpers
    from helpers.engine import SweepEngine
    from helpers.protocol import shared
    from helpers.screen import rank_heads

    def fake(name, width):
        return SimpleNamespace(name=name, adapter=SimpleNamespace(n_heads=lambda layer: width))

    assert shared.paper_layers(fake("llama-3.1-8b-instruct", 32)) == [16, 17]
    # too wide to sweep one by one
    assert shared.paper_layers(fake("falcon-mamba-7b-instruct", 8192)) == []
    # the release names no heads of it
    assert shared.paper_layers(fake("smollm2-135m-instruct", 9)) == []
    loaded = helpers.load("toy-transformer")
    engine = SweepEngine(
        loaded, loaded.tokenizer, chapter.bm.kv("toy-transformer", None, 4, 4, 0).items
    )
    swept = lambda table: sorted(set(table.dropna(subset=["acc"]).layer.astype(int)))
    screened = swept(rank_heads(engine, top=1, progress=False))
    left_out = min(set(range(loaded.adapter.n_layers)) - set(screened))
    assert swept(rank_heads(engine, top=1, progress=False, also=[left_out])) == sorted(
        screened + [left_out]
    )


def test_the_size_curves_never_reuse_the_rankings_dictionaries():
    from helpers import benchmarks as bm
    from helpers.protocol import shared

    s = shared.RANKING["cpu"]
    for seed in (0, 1):
        ranked = {
            it.pairs[0][0]
            for it in bm.kv(
                "smollm2-135m-instruct", None, s["pairs"], s["n"], seed, s["query"]
            ).items
        }
        curve = {
            it.pairs[0][0]
            for it in bm.kv(
                "smollm2-135m-instruct",
                None,
                s["pairs"],
                100,
                chapter.CURVES_SEED + seed,
                s["query"],
            ).items
        }
        assert len(ranked) == s["n"] and len(curve) == 100 and not ranked & curve


def test_workers_beyond_this_machine_are_refused_in_the_config_before_ray_or_a_model_starts(
    monkeypatch, tmp_path
):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # no `ray start` cluster to connect to
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    cpus = len(os.sched_getaffinity(0))
    with pytest.raises(
        ConfigError, match=rf"workers={cpus + 1}, but .* has {cpus} CPUs .* at most {cpus}"
    ):
        # was refused after the model and Ray started
        chapter.Config.for_profile("cpu", smoke=True, workers=cpus + 1)
    assert chapter.Config.for_profile("cpu", smoke=True, workers=cpus).workers == cpus
    with pytest.raises(
        ConfigError, match=r"workers must be at least 1, got 0 \(None: in this process\)"
    ):
        chapter.Config.for_profile("cpu", smoke=True, workers=0)
