"""Layer pruning: the run at smoke size, and every verdict both ways on hand-built results."""

import numpy as np
import pytest

from helpers import verdicts as v
from helpers.experiments import layer_pruning as chapter
from helpers.protocol import minimal
from helpers.stats import Score


def test_the_cpu_profile_runs_the_letter_model_on_the_same_facts_as_letters_and_cloze():
    cfg = chapter.Config.for_profile("cpu")
    assert cfg.model == "qwen2.5-coder-1.5b-instruct" and cfg.n_mmlu == cfg.n_knowledge


def test_run_at_smoke_size_scores_every_benchmark_at_every_depth():
    # SmolLM2 (the letter model's smoke runs in the book's build): MMLU at chance, KV stands in.
    result = chapter.run(
        chapter.Config.for_profile("cpu", smoke=True, model="smollm2-135m-instruct")
    )
    assert result.n_layers == 30 and set(result.roles.values()) == {"retrieval", "knowledge"}
    assert all(sorted(by_depth) == list(range(1, 31)) for by_depth in result.scores.values())
    assert len(result.scores[result.kv][30].correct) == 4
    assert {v.outcome for v in chapter.verdicts(result)} <= set(v.OUTCOMES)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]


def made_up(mmlu, knowledge, kv, n=200):
    """A Result whose accuracies by depth (1..len) are the given lists (the first items right)."""
    at = lambda acc: Score.of(np.arange(n) < round(acc * n))
    scores = {
        "MMLU (0-shot)": {d + 1: at(a) for d, a in enumerate(mmlu)},
        "capitals": {d + 1: at(a) for d, a in enumerate(knowledge)},
        "KV retrieval (8 keys)": {d + 1: at(a) for d, a in enumerate(kv)},
    }
    roles = {
        "MMLU (0-shot)": "retrieval",
        "capitals": "knowledge",
        "KV retrieval (8 keys)": "retrieval",
    }
    chance = {"MMLU (0-shot)": 0.25, "capitals": 0.25, "KV retrieval (8 keys)": 0.125}
    kinds = {"MMLU (0-shot)": "mcq", "capitals": "knowledge", "KV retrieval (8 keys)": "kv"}
    return chapter.Result(
        chapter.Config.for_profile("paper"), len(mmlu), scores, roles, chance, {}, kinds
    )


def test_the_papers_dissociation_is_reproduced():
    # MMLU flat down to 4 layers, then chance; knowledge falls from 80% to 40%.
    result = made_up(
        mmlu=[0.25, 0.25, 0.25, 0.66, 0.66, 0.66],
        knowledge=[0.3, 0.3, 0.35, 0.4, 0.6, 0.8],
        kv=[0.1] * 6,
    )
    assert result.minimal() == 4
    verdicts = chapter.verdicts(result)
    assert [x.outcome for x in verdicts] == [v.REPRODUCED, v.REPRODUCED] and all(
        x.headline for x in verdicts
    )


def test_knowledge_that_does_not_fall_is_not_the_papers_dissociation():
    result = made_up(mmlu=[0.25, 0.25, 0.25, 0.66, 0.66, 0.66], knowledge=[0.8] * 6, kv=[0.1] * 6)
    assert [x.outcome for x in chapter.verdicts(result)] == [v.NOT_REPRODUCED, v.REPRODUCED]


def test_a_model_at_chance_on_mmlu_hands_over_to_kv_and_says_so():
    result = made_up(
        mmlu=[0.25] * 6,
        knowledge=[0.3, 0.3, 0.35, 0.4, 0.6, 0.8],
        kv=[0.1, 0.1, 0.7, 0.7, 0.7, 0.7],
    )
    first, *rest = chapter.verdicts(result)
    assert first.outcome == v.NOT_TESTABLE and "at chance" in first.evidence
    assert chapter.probe(result) == "KV retrieval (8 keys)" and rest[0].claim.startswith(
        "At the minimal model (3 of 6"
    )
    at_chance = made_up(mmlu=[0.25] * 6, knowledge=[0.5] * 6, kv=[0.12] * 6)
    assert {x.outcome for x in chapter.verdicts(at_chance)} == {v.NOT_TESTABLE}


def test_bad_parameters_fail_before_any_model_loads():
    with pytest.raises(ValueError, match="n_kv must be at least 1"):
        chapter.Config.for_profile("cpu", n_kv=-5)
    with pytest.raises(ValueError, match=r"k_shot must be at most 5 on the cpu profile: .* got 6"):
        # was a raw ValueError once the model had loaded
        chapter.Config.for_profile("cpu", k_shot=6)


def test_knowledge_is_the_mean_over_tasks_not_the_pooled_items():
    result = made_up(mmlu=[0.25, 0.66, 0.66], knowledge=[0.3, 0.4, 0.8], kv=[0.1] * 3)
    big = {
        d: Score.of(np.arange(1000) < round(a * 1000)) for d, a in {1: 0.3, 2: 0.8, 3: 0.8}.items()
    }
    result.scores["hellaswag"], result.roles["hellaswag"], result.chance["hellaswag"] = (
        big,
        "knowledge",
        0.25,
    )
    # capitals (200 items) falls 0.8 -> 0.4 from 3 layers to 2, hellaswag (1000 items) stays at 0.8:
    # pooled items would say -6.7 points, the release's mean says -20
    assert (
        result.knowledge(2).acc == pytest.approx((0.4 + 0.8) / 2) and result.knowledge(2).n == 1200
    )
    kept, *_ = chapter.verdicts(result)
    assert kept.outcome == v.REPRODUCED and "-20.0 points" in kept.evidence


def curve(accs: dict[int, float], n: int = 300) -> dict[int, Score]:
    return {d: Score.of(np.arange(n) < round(a * n)) for d, a in accs.items()}


# Qwen2.5-Coder-1.5B's letters on 300 questions of the old letter set, as measured (layers kept -> accuracy).
QWEN = {
    **{d: 0.27 for d in range(1, 22)},
    22: 0.283,
    23: 0.617,
    24: 0.70,
    25: 0.687,
    26: 0.663,
    27: 0.683,
    28: 0.703,
}


def test_the_minimal_model_is_the_cut_above_the_sharpest_fall():
    assert minimal.minimal_depth(curve(QWEN), 0.25) == 23  # 61.7% with 23 layers, 28.3% with 22
    # the 5-point variant stops one layer higher
    assert minimal.margin_minimal_depth(curve(QWEN)) == 24
    assert minimal.pick_by_halves(curve(QWEN), 0.25) == (23, 23)


def test_a_dip_near_the_top_does_not_move_the_pick_but_a_sharper_collapse_does():
    dip = {**QWEN, 27: 0.55}  # a 15-point dip, not a collapse: half of the gap is kept
    assert (
        minimal.minimal_depth(curve(dip), 0.25) == 23
        and minimal.margin_minimal_depth(curve(dip)) == 28
    )
    # Two collapsing falls: the larger decides (here the upper one, 70% -> 30%).
    two = {**QWEN, 26: 0.30, 25: 0.687}
    assert minimal.minimal_depth(curve(two), 0.25) == 27


def test_a_gradual_decline_picks_its_largest_fall_and_the_collapse_claim_says_no():
    # no cut loses half; the largest: 4 -> 3
    steps = {
        1: 0.55,
        2: 0.58,
        3: 0.61,
        4: 0.66,
        5: 0.68,
        6: 0.70,
    }
    assert minimal.minimal_depth(curve(steps), 0.25) == 4
    result = made_up(
        mmlu=list(steps.values()), knowledge=[0.3, 0.3, 0.35, 0.4, 0.6, 0.8], kv=[0.1] * 6
    )
    collapse = chapter.verdicts(result)[-1]
    assert collapse.claim.startswith("One layer fewer (3)") and collapse.outcome == v.NOT_REPRODUCED
