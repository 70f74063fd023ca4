"""KV retrieval: the run at smoke size, and every verdict both ways on hand-built results."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from helpers import verdicts as v
from helpers.errors import ConfigError
from helpers.experiments import kv_retrieval as chapter
from helpers.experiments.head_zeroing import Roles
from helpers.experiments.shared import Ranking
from helpers.heads import Head
from helpers.stats import Score

G, A = Head(16, 22), Head(17, 24)


def test_run_at_smoke_size_scores_every_size_and_both_rankings():
    # The toy Transformer: the same code path as SmolLM2 (which the book's smoke build runs), with
    # two shared rankings of seconds rather than minutes.
    result = chapter.run(chapter.Config.for_profile("cpu", smoke=True, model="toy-transformer"))
    assert result.sizes == [2, 8] and set(result.rankings) == {False, True}
    assert {len(s.correct) for by_size in result.scores.values() for s in by_size.values()} == {3}
    assert set(result.scores) == {"model"} | {f"{r} removed" for r in "GA" if result.roles.heads[r]}
    assert {x.outcome for x in chapter.verdicts(result)} <= set(v.OUTCOMES)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert set(chapter.top_heads(result)["prompt ends"]) == {"as released", "with a space"}


def at(acc, n=200):
    return Score.of(np.arange(n) < round(acc * n))


def ranking(order, accs=None):
    """A ranking whose measured heads are `order`, most harmful first."""
    accs = accs or [0.1 + 0.05 * i for i in range(len(order))]
    table = pd.DataFrame([dict(layer=h.layer, head=h.head, estimate=-1.0 + i, acc=a, lo=a - 0.05, hi=a + 0.05, n=200)
                          for i, (h, a) in enumerate(zip(order, accs))])
    return Ranking("llama-3.1-8b-instruct", {"pairs": 8, "n": 200}, at(0.9), table)


def made_up(model, gather, aggregate, source="paper", order=(G, A, Head(3, 1), Head(5, 2), Head(8, 0))):
    """A Result over sizes 2, 8, 32 with the given accuracies per size."""
    sizes = [2, 8, 32]
    scores = {"model": {k: at(a) for k, a in zip(sizes, model)},
              "G removed": {k: at(a) for k, a in zip(sizes, gather)},
              "A removed": {k: at(a) for k, a in zip(sizes, aggregate)}}
    roles = Roles({"G": (G,), "A": (A,)}, source)
    ranked = ranking(list(order))
    return chapter.Result(chapter.Config.for_profile("paper"), scores, roles, {False: ranked, True: ranked}, {})


def test_the_papers_fig_4_is_reproduced():
    result = made_up(model=[0.95, 0.8, 0.5], gather=[0.5, 0.3, 0.1], aggregate=[0.4, 0.2, 0.05])
    assert [x.outcome for x in chapter.verdicts(result)] == [v.REPRODUCED] * 5


def test_accuracy_that_rises_and_heads_that_do_nothing_are_not_the_papers_picture():
    result = made_up(model=[0.6, 0.7, 0.9], gather=[0.6, 0.7, 0.9], aggregate=[0.2, 0.7, 0.9])
    trend, gather, aggregate, *_ = chapter.verdicts(result)
    assert trend.outcome == v.NOT_REPRODUCED
    assert gather.outcome == v.NOT_REPRODUCED  # identical scores: no loss beyond the margin
    # lower at 2 keys only: "at every size" needs every size
    assert aggregate.outcome == v.NOT_REPRODUCED and "lower at 1 of 3 sizes" in aggregate.evidence


def test_a_role_no_measured_candidate_plays_is_another_mechanism():
    import helpers.heads as hd
    result = made_up(model=[0.95, 0.8, 0.5], gather=[0.5, 0.3, 0.1], aggregate=[0.4, 0.2, 0.05], source="behaviour")
    local = pd.DataFrame({hd.GATHER_MEASURE: [0.9], hd.AGGREGATE_MEASURE: [0.9], hd.LOCAL_MEASURE: [0.95]},
                         index=pd.Index([G]))  # a previous-token head, and no aggregating one
    measured = Roles({"G": (), "A": ()}, "behaviour", local, {"G": None, "A": None})
    gather = chapter.verdicts(dataclasses.replace(result, roles=measured))[1]
    assert gather.outcome == v.NOT_REPRODUCED and gather.evidence.startswith("another mechanism")
    assert "L16H22 reads the previous token" in gather.evidence
    unmeasured = Roles({"G": (), "A": ()}, "behaviour")
    assert chapter.verdicts(dataclasses.replace(result, roles=unmeasured))[1].outcome == v.NOT_TESTABLE


def test_heads_ranked_low_are_not_top_ranked_and_heads_found_by_ranking_cannot_test_it():
    others = [Head(3, i) for i in range(6)]
    low = made_up(model=[0.95, 0.8, 0.5], gather=[0.5, 0.3, 0.1], aggregate=[0.4, 0.2, 0.05], order=others + [G, A])
    assert [x.outcome for x in chapter.verdicts(low)][3:] == [v.NOT_REPRODUCED] * 2
    unswept = made_up(model=[0.95, 0.8, 0.5], gather=[0.5, 0.3, 0.1], aggregate=[0.4, 0.2, 0.05], order=others)
    assert "was not swept" in chapter.verdicts(unswept)[3].evidence
    ours = made_up(model=[0.95, 0.8, 0.5], gather=[0.5, 0.3, 0.1], aggregate=[0.4, 0.2, 0.05], source="behaviour")
    assert [x.outcome for x in chapter.verdicts(ours)][3:] == [v.NOT_TESTABLE] * 2


def test_a_model_at_chance_cannot_lose_what_it_does_not_have():
    result = made_up(model=[0.5, 0.12, 0.03], gather=[0.5, 0.12, 0.03], aggregate=[0.5, 0.12, 0.03])
    trend, gather, *_ = chapter.verdicts(result)
    assert trend.outcome == gather.outcome == v.NOT_TESTABLE


@pytest.mark.parametrize("kwargs, message", [
    (dict(sizes=[0, 4]), "sizes must all be at least 1"),
    (dict(sizes=[8, 120]), "sizes: a KV dictionary for smollm2-135m-instruct holds at most 100 keys"),
    (dict(gather=["L16H22"]), "set gather and aggregate together"),
    (dict(n_per_size=0), "n_per_size must be at least 1"),
])
def test_bad_parameters_fail_before_any_model_loads(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        chapter.Config.for_profile("cpu", **kwargs)
