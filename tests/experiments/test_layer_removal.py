"""Layer removal: the run at smoke size, and every verdict both ways on hand-built results."""

import numpy as np
import pytest

from helpers import verdicts as v
from helpers.errors import ConfigError
from helpers.experiments import layer_removal as chapter
from helpers.stats import Score

KV, KNOW = "KV retrieval (8 keys)", "capitals"


def test_run_at_smoke_size_removes_every_layer_of_the_minimal_model():
    # SmolLM2 (the letter model's smoke runs in the book's build): MMLU at chance, KV is the probe.
    # n_kv as the pruning walk's smoke size, so that both score the same KV items
    n_kv = chapter.pruning_config(chapter.Config.for_profile("cpu", smoke=True)).n_kv
    result = chapter.run(
        chapter.Config.for_profile(
            "cpu", smoke=True, model="smollm2-135m-instruct", minimal_layers=3, n_kv=n_kv
        )
    )
    assert result.minimal_layers == 3 and result.source == "given" and result.probe == KV
    assert all(sorted(by_layer) == [0, 1, 2] for by_layer in result.removed.values())
    # the probe and knowledge are swept; MMLU, at chance, is not
    assert (
        set(result.removed)
        == set(result.minimal)
        == set(result.full)
        == set(result.roles)
        == {KV, "facts (cloze)"}
    )
    assert len(result.removed[KV][1].correct) == n_kv
    # the minimal model's score is on the removal's own items: with a layer "removed" past its top
    # nothing changes, so removing L2 of layers 0-2 equals the 2-layer cut of the pruning chapter
    from helpers.experiments import layer_pruning

    pruning = layer_pruning.run(chapter.pruning_config(result.cfg))
    assert result.removed[KV][2].correct.tolist() == pruning.scores[KV][2].correct.tolist()
    assert {x.outcome for x in chapter.verdicts(result)} <= set(v.OUTCOMES)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]


def test_the_cpu_profile_removes_layers_of_the_letter_model_on_as_many_items_as_the_claims_need():
    from helpers import verdicts as v_

    cfg = chapter.Config.for_profile("cpu")
    pruning = chapter.pruning_config(cfg)
    assert cfg.model == pruning.model == "qwen2.5-coder-1.5b-instruct"
    # powered in `run`; knowledge: the letters' cloze twins
    assert cfg.n_mmlu is None and cfg.n_knowledge is None
    plan = v_.plan(0.75, 0.25, chapter.CPU_FLOOR, 726)
    assert plan.n >= chapter.CPU_FLOOR >= 150 and plan.n == max(
        chapter.CPU_FLOOR, *[n for n in plan.needs.values() if n]
    )


def made_up(kv, knowledge, minimal=(0.8, 0.8), n=200):
    """A Result of a minimal model whose accuracies with each layer removed are the given lists (the first items right); `minimal` = (kv, knowledge) with every layer."""
    at = lambda acc: Score.of(np.arange(n) < round(acc * n))
    removed = {
        KV: {l: at(a) for l, a in enumerate(kv)},
        KNOW: {l: at(a) for l, a in enumerate(knowledge)},
    }
    return chapter.Result(
        chapter.Config.for_profile("cpu"),
        len(kv),
        "found",
        KV,
        {KV: at(minimal[0]), KNOW: at(minimal[1])},
        {KV: at(minimal[0]), KNOW: at(minimal[1])},
        removed,
        {KV: "retrieval", KNOW: "knowledge"},
        {KV: 0.125, KNOW: 0.25},
        {},
        {KV: "kv", KNOW: "knowledge"},
    )


def test_two_critical_layers_with_knowledge_kept_reproduce_the_paper():
    result = made_up(kv=[0.8, 0.78, 0.8, 0.8, 0.15, 0.2], knowledge=[0.8, 0.8, 0.79, 0.8, 0.8, 0.8])
    assert result.collapsing() == ([4, 5], [])
    assert [x.outcome for x in chapter.verdicts(result)] == [v.REPRODUCED] * 3


def test_no_collapse_and_many_collapses_are_not_the_papers_picture():
    flat = made_up(kv=[0.8, 0.75, 0.8, 0.7, 0.72, 0.8], knowledge=[0.8] * 6)
    first, few, knowledge = chapter.verdicts(flat)
    assert first.outcome == v.NOT_REPRODUCED and few.outcome == knowledge.outcome == v.NOT_TESTABLE
    broad = made_up(kv=[0.1, 0.15, 0.1, 0.2, 0.15, 0.8], knowledge=[0.8] * 6)
    assert [x.outcome for x in chapter.verdicts(broad)][:2] == [v.REPRODUCED, v.NOT_REPRODUCED]


def test_knowledge_that_falls_with_the_critical_layer_is_not_kept():
    result = made_up(kv=[0.8, 0.8, 0.8, 0.8, 0.15, 0.8], knowledge=[0.8, 0.8, 0.8, 0.8, 0.3, 0.8])
    assert chapter.verdicts(result)[2].outcome == v.NOT_REPRODUCED


def test_a_minimal_model_at_chance_cannot_test_the_claim():
    result = made_up(kv=[0.1] * 6, knowledge=[0.8] * 6, minimal=(0.12, 0.8))
    assert {x.outcome for x in chapter.verdicts(result)} == {v.NOT_TESTABLE}


def test_published_minimal_models_follow_the_release():
    from helpers.protocol.minimal import published_minimal

    assert published_minimal("llama-3.1-8b-instruct") == 18  # the paper's layers 0-17
    assert published_minimal("falcon-mamba-7b-instruct") == 37  # up to its Aggregate layer, L36
    assert published_minimal("smollm2-135m-instruct") is None  # found from the data


def test_bad_parameters_fail_before_any_model_loads():
    with pytest.raises(ConfigError, match="minimal_layers must be at least 1"):
        chapter.Config.for_profile("cpu", minimal_layers=0)
    with pytest.raises(ConfigError, match="kv_query must be one of 'paper', 'repeat'"):
        chapter.Config.for_profile("cpu", kv_query="ask")


def test_the_claim_names_mmlu_by_the_probes_kind_not_by_its_label():
    result = made_up(kv=[0.8, 0.78, 0.8, 0.8, 0.15, 0.2], knowledge=[0.8] * 6)
    assert (
        chapter.verdicts(result)[0].claim
        == f"Removing one layer takes {KV} (in place of MMLU) most of the way to chance"
    )
    letters = chapter.Result(**{**result.__dict__, "kinds": {KV: "mcq", KNOW: "knowledge"}})
    assert (
        chapter.verdicts(letters)[0].claim
        == "Removing one layer takes MMLU most of the way to chance"
    )
    assert [x.outcome for x in chapter.verdicts(letters)] == [
        x.outcome for x in chapter.verdicts(result)
    ]


def test_on_the_papers_model_the_collapsing_layers_are_compared_with_its_own():
    kv = [0.8] * 16 + [0.15, 0.2]
    result = made_up(kv=kv, knowledge=[0.8] * 18)
    result = chapter.Result(
        chapter.Config.for_profile("paper"),
        *[
            getattr(result, f)
            for f in (
                "minimal_layers",
                "source",
                "probe",
                "full",
                "minimal",
                "removed",
                "roles",
                "chance",
                "provenance",
                "kinds",
            )
        ],
    )
    last = chapter.verdicts(result)[-1]
    assert last.claim == "The layers are the paper's (L16, L17)" and last.outcome == v.REPRODUCED


def test_knowledge_must_stay_whichever_collapsing_layer_goes():
    # L4 and L5 both collapse retrieval; knowledge stays without L4 but falls without L5: the claim
    # is about every such layer, so it fails (not "partly")
    result = made_up(kv=[0.8, 0.8, 0.8, 0.8, 0.15, 0.15], knowledge=[0.8, 0.8, 0.8, 0.8, 0.8, 0.3])
    knowledge = chapter.verdicts(result)[2]
    assert knowledge.outcome == v.NOT_REPRODUCED and "mean of 1 task," in knowledge.evidence
