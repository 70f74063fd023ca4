"""Hybrid swap: the run at smoke size, and every verdict both ways on hand-built results."""

import numpy as np
import pytest

from helpers import verdicts as v
from helpers import zoo
from helpers.errors import ConfigError
from helpers.experiments import hybrid_swap as chapter
from helpers.protocol import distilled
from helpers.stats import Score


@pytest.fixture(autouse=True)
def one_thread():
    """Toy models run fastest on one thread: on a busy two-core machine, two threads made these
    tests thirty times slower (measured)."""
    with zoo.one_thread():
        yield


def test_run_at_smoke_size_swaps_layers_and_finds_the_teachers_layer():
    result = chapter.run(
        chapter.Config.for_profile("cpu", smoke=True, teacher_layer_by="layer ablation")
    )
    found = result.teacher_layer
    # smoke: layers 0 and 1, and the aggregating layer
    assert result.layers == sorted({0, 1, found.layer})
    assert (
        set(found.ablated)
        == set(result.retrieval)
        == {"letter MCQ (4 options)", "KV retrieval (8 keys)"}
    )
    for b in result.retrieval:
        assert set(result.scores[b]) == {"student", "teacher", *map(chapter.swapped, result.layers)}
    assert set(result.scores["knowledge"]) == {"student", "teacher", chapter.swapped(found.layer)}
    assert (
        len(result.scores["KV retrieval (8 keys)"]["student"].correct)
        == chapter.Config.smoke_sizes["n_kv"]
    )
    assert {x.outcome for x in chapter.verdicts(result)} <= set(v.OUTCOMES)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]


def at(acc, n=200):
    return Score.of(np.arange(n) < round(acc * n))


def made_up(kv, mcq=None, knowledge=(1.0, 1.0), layer=0):
    """A Result from accuracies: `kv` and `mcq` map student, teacher and each swapped layer (an
    int) to an accuracy; knowledge is (student, with `layer` swapped in)."""

    def conditions(accs):
        return {(chapter.swapped(k) if isinstance(k, int) else k): at(a) for k, a in accs.items()}

    mcq = mcq or {"student": 0.9, "teacher": 0.9, 0: 0.9, 1: 0.9, 2: 0.9}
    scores = {
        "MMLU (0-shot)": conditions(mcq),
        "KV retrieval (8 keys)": conditions(kv),
        "knowledge": {
            "student": at(knowledge[0]),
            "teacher": at(1.0),
            chapter.swapped(layer): at(knowledge[1]),
        },
    }
    roles = {
        "MMLU (0-shot)": "retrieval",
        "KV retrieval (8 keys)": "retrieval",
        "knowledge": "knowledge",
    }
    chance = {"MMLU (0-shot)": 0.25, "KV retrieval (8 keys)": 0.125, "knowledge": 0.25}
    found = distilled.TeacherLayer(layer, "made up", {}, {})
    return chapter.Result(
        chapter.Config.for_profile("paper"), 3, [0, 1, 2], found, scores, roles, chance, {}
    )


def test_the_aggregating_layers_swap_helping_most_is_reproduced():
    result = made_up(kv={"student": 0.15, "teacher": 1.0, 0: 0.95, 1: 0.2, 2: 0.15})
    mcq, kv, know = chapter.verdicts(result)
    # student = teacher on MMLU
    assert mcq.outcome == v.NOT_TESTABLE and "no gap to close" in mcq.evidence
    assert (
        kv.outcome == v.REPRODUCED
        and "L0 swapped in: 95.0%" in kv.evidence
        and "best other swap, L1" in kv.evidence
    )
    assert know.outcome == v.REPRODUCED


def test_another_layer_doing_better_or_as_well_is_not_the_papers_result():
    better = made_up(kv={"student": 0.15, "teacher": 1.0, 0: 0.5, 1: 0.9, 2: 0.15})
    # lifts the student, but L1 lifts it more: not "most"
    assert chapter.verdicts(better)[1].outcome == v.NOT_REPRODUCED
    tied = made_up(kv={"student": 0.15, "teacher": 1.0, 0: 0.9, 1: 0.9, 2: 0.15})
    kv = chapter.verdicts(tied)[1]
    # "most" cannot be told
    assert kv.outcome == v.INCONCLUSIVE and "not told apart from L0: L1" in kv.evidence
    useless = made_up(kv={"student": 0.15, "teacher": 1.0, 0: 0.15, 1: 0.9, 2: 0.9})
    assert chapter.verdicts(useless)[1].outcome == v.NOT_REPRODUCED


def test_a_teacher_at_chance_cannot_test_the_claim_and_lost_knowledge_is_reported():
    result = made_up(
        kv={"student": 0.1, "teacher": 0.12, 0: 0.9, 1: 0.1, 2: 0.1}, knowledge=(1.0, 0.0)
    )
    _, kv, know = chapter.verdicts(result)
    assert kv.outcome == v.NOT_TESTABLE and "cannot do it" in kv.evidence
    # MMLU has no gap either
    assert know.outcome == v.NOT_TESTABLE and "nothing to control" in know.evidence
    lost = made_up(
        kv={"student": 0.15, "teacher": 1.0, 0: 0.95, 1: 0.2, 2: 0.15}, knowledge=(1.0, 0.0)
    )
    assert (
        chapter.verdicts(lost)[2].outcome == v.NOT_REPRODUCED
        and "-100.0 points" in chapter.verdicts(lost)[2].evidence
    )


def test_bad_parameters_fail_before_any_model_loads():
    with pytest.raises(
        ConfigError, match="teacher_layer_by='reference' needs a teacher .*llama-3.1-8b-instruct"
    ):
        chapter.Config.for_profile("cpu", teacher_layer_by="reference")
    with pytest.raises(
        ConfigError,
        match="teacher_layer_by must be one of 'reference', 'layer ablation', 'KV ranking'",
    ):
        chapter.Config.for_profile("cpu", teacher_layer_by="L17")
    with pytest.raises(ConfigError, match="student must be a model \\(ssm\\)"):
        chapter.Config.for_profile("cpu", student="toy-transformer")
