"""The toy-zoo page: the run at smoke size, the re-measuring path against the zoo's own, and
the verdict both ways (and not testable) on hand-built results."""

import numpy as np
import pandas as pd
import pytest

from helpers import verdicts as v
from helpers import zoo
from helpers.experiments import toy_zoo as chapter
from helpers.protocol import loading
from helpers.stats import Score


def test_run_at_smoke_size_re_measures_every_cell_of_every_model():
    result = chapter.run(chapter.Config.for_profile("cpu", smoke=True))
    assert list(result.remeasured) == list(zoo.RECIPES) and len(result.models) == len(zoo.RECIPES)
    assert all(
        s.keys() == result.records[m]["final"].keys() and {x.n for x in s.values()} == {24}
        for m, s in result.remeasured.items()
    )
    (verdict,) = chapter.verdicts(result)
    assert verdict.outcome == v.NOT_TESTABLE and "n=24" in verdict.evidence
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert list(chapter.accuracy_table(result).columns) == ["task@size", *zoo.RECIPES]
    assert len(chapter.examples(0)) == 3 and chapter.figure(result).axes


def test_scores_are_the_zoos_own_accuracies_with_their_items():
    loaded = loading.load("toy-mamba1")
    with zoo.one_thread():
        scores = chapter.final_scores(loaded.model, seed=0, n=6)
        accuracies = zoo.final_accuracies(loaded.model, seed=0, n=6)
    assert {k: s.acc for k, s in scores.items()} == accuracies and {
        len(s.correct) for s in scores.values()
    } == {6}


def made_up(gap_examples: int, n: int = 500):
    """Two models, two cells each; one cell re-measured `gap_examples` examples off its record."""
    records = {
        m: {"final": {"kv@8": 0.5, "mcq@4": 0.9}, "n_final": 500} for m in ("toy-a", "toy-b")
    }
    at = lambda acc: Score.of(np.arange(n) < round(acc * n))
    remeasured = {m: {c: at(a) for c, a in rec["final"].items()} for m, rec in records.items()}
    remeasured["toy-b"]["kv@8"] = at(0.5 + gap_examples / 500)
    cfg = chapter.Config.for_profile("cpu", n=n)
    return chapter.Result(cfg, pd.DataFrame(), records, remeasured, {})


def test_the_verdict_allows_two_examples_and_no_more():
    (ok,) = chapter.verdicts(made_up(2))
    assert ok.outcome == v.REPRODUCED and "2 example(s) of 500: toy-b kv@8" in ok.evidence
    (off,) = chapter.verdicts(made_up(3))
    assert off.outcome == v.NOT_REPRODUCED and "make zoo" in off.evidence
    (exact,) = chapter.verdicts(made_up(0))
    assert (
        exact.outcome == v.REPRODUCED
        and "all 4 cells (2 models) equal their records exactly" in exact.evidence
    )
    (other_n,) = chapter.verdicts(made_up(0, n=100))
    assert other_n.outcome == v.NOT_TESTABLE
    # a check, not one of the paper's claims
    assert {x.kind for x in (ok, off, exact, other_n)} == {v.CHECK}


def test_bad_parameters_fail_before_any_model_loads():
    with pytest.raises(ValueError, match="n must be at least 1"):
        chapter.Config.for_profile("cpu", n=0)
    with pytest.raises(ValueError, match="toy_zoo has no parameter models"):
        chapter.Config.for_profile("paper", models=["toy-mamba2"])
