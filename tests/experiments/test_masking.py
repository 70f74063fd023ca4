"""Masking: the run at smoke size, every verdict both ways on hand-built results (and not
testable at chance or without a head of the role), and bad parameters."""

import numpy as np
import pytest

from helpers import benchmarks as bm
from helpers import verdicts as v
from helpers.errors import ConfigError
from helpers.experiments import masking as chapter
from helpers.heads import Head
from helpers.protocol import head_screen
from helpers.protocol.roles import Roles, with_closest
from helpers.specs import Spec
from helpers.stats import Score


def test_run_at_smoke_size_scores_every_condition_on_the_same_prompts():
    # Heads given: the shared KV ranking (minutes on CPU) has its own tests. Small prompts, for time.
    cfg = chapter.Config.for_profile(
        "cpu",
        smoke=True,
        models=["smollm2-135m-instruct"],
        task="kv",
        gather=["L16H0"],
        aggregate=["L18H6"],
        n=2,
        kv_pairs=4,
    )
    result = chapter.run(cfg)
    (r,) = result.runs
    assert list(r.scores) == list(chapter.CONDITIONS) and {s.n for s in r.scores.values()} == {2}
    assert len(chapter.verdicts(result)) == 11 and {
        x.outcome for x in chapter.verdicts(result)
    } <= set(v.OUTCOMES)
    assert len(chapter.table(result)) == len(chapter.CONDITIONS)
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert result.provenance["models"].keys() == {"smollm2-135m-instruct"}
    assert chapter.figure(result).axes
    # KV has no published minimal model: the whole model, with only G and A kept in their layers
    assert (r.layers, r.others_zeroed) == (
        30,
        {16: list(range(1, 9)), 18: [h for h in range(9) if h != 6]},
    )


def test_on_the_letter_task_the_heads_are_masked_in_head_zeroings_keep_only_minimal_model():
    # The toy zoo's letter MCQ takes the path the CPU profile's Qwen takes (no published heads or
    # minimal model): head zeroing's minimal model, roles and check prompts (its screen, shared
    # through the same stores).
    from helpers.experiments import head_zeroing

    # At the CPU sizes (seconds on the toy; the smoke size's 4 screen prompts cannot show a head's harm, so
    # no head would be a candidate) the screen finds both a G and an A head.
    result = chapter.run(chapter.Config.for_profile("cpu", models=["toy-transformer"], seed=0))
    (r,) = result.runs
    zeroing = head_zeroing.run(
        head_zeroing.Config.for_profile("cpu", model="toy-transformer", seed=0)
    )
    assert all(zeroing.roles.heads[x] for x in "GA")
    assert r.layers == zeroing.layers_kept and r.minimal.startswith("the layer-pruning chapter's")
    assert {x: r.roles.heads[x] for x in "GA"} == {x: zeroing.roles.heads[x] for x in "GA"}
    kept = {h for hs in r.roles.heads.values() for h in hs}
    assert {l: set(hs) for l, hs in r.others_zeroed.items()} == {
        h.layer: {k for k in range(4) if Head(h.layer, k) not in kept} for h in kept
    }
    # Only G and A kept in their layers is the unmasked condition: head zeroing's own score of it, on the
    # prompts both drew (the masked ones, a subset of head zeroing's).
    n_check, n = zeroing.clean.n, r.scores["no mask"].n
    drawn = lambda k: (
        head_screen.check_part(
            bm.Benchmark("check", bm.RETRIEVAL, list(range(n_check))), k, 0
        ).items
    )
    masked, zeroed = drawn(n), drawn(zeroing.n_dependent)
    kept_only = zeroing.score("only G and A kept in their layers").correct
    assert n < zeroing.n_dependent and r.scores["no mask"].correct.tolist() == [
        kept_only[zeroed.index(i)] for i in masked
    ]


def test_masked_conditions_from_one_cached_stream_equal_each_run_alone(smol):
    from helpers.engine import SweepEngine
    from helpers.segments import aggregate_pattern, gather_pattern

    b = bm.kv(smol.name, smol.tokenizer, 4, 1, seed=1, query="repeat")
    within = Spec.parse("zero L16H1,L16H2,L18H0,L18H3; keep 0..19")
    conditions = {
        "G": lambda seg: {(16, 0): gather_pattern(seg)},
        "A control": lambda seg: {(18, 6): aggregate_pattern(seg, control=True)},
        "below the zeroed layers": lambda seg: {(10, 4): gather_pattern(seg, control=True)},
        "none": lambda seg: {},
    }
    together = chapter.masked_runs(smol, b, conditions, within)
    for name, patterns in conditions.items():
        alone = chapter.masked_loglikelihoods(smol, b, patterns, within)
        for ours, theirs in zip(together[name], alone, strict=True):
            np.testing.assert_array_equal(ours, theirs)
    # the mask acts (also below the zeroed layers), and with no mask it is the engine's own ablation
    assert not np.allclose(
        np.concatenate(together["below the zeroed layers"]), np.concatenate(together["none"])
    )
    plain = SweepEngine(smol, smol.tokenizer, b.items).loglikelihoods([within])[0]
    np.testing.assert_allclose(np.concatenate(together["none"]), plain, atol=2e-4)


def test_a_role_no_candidate_plays_is_masked_on_the_closest_candidate_and_said_so():
    import pandas as pd

    from helpers import heads as hd

    measures = pd.DataFrame(
        {
            hd.GATHER_MEASURE: [0.9, 0.3, 0.2],
            hd.AGGREGATE_MEASURE: [0.1, 0.4, 0.2],
            hd.LOCAL_MEASURE: [0.1, 0.1, 0.1],
        },
        index=[(22, 1), (23, 4), (23, 7)],
    )
    # The screen's roles, as every chapter names them: no candidate plays the Aggregate head.
    found = Roles(
        {"G": (Head(22, 1),), "A": ()},
        "behaviour",
        measures,
        ranking="the letter screen",
        candidates=(Head(22, 1), Head(23, 4), Head(23, 7)),
    )
    roles = with_closest(found)
    assert roles.heads == {"G": (Head(22, 1),), "A": (Head(23, 4),)} and roles.filled == {
        "G": True,
        "A": False,
    }
    nobody = (
        "no head whose zeroing hurts on the letter screen's prompts behaves as the Aggregate head"
    )
    assert f"{nobody})" in found.describe("A") and f"{nobody}: the closest" in roles.describe("A")
    assert chapter.others_zeroed(roles, lambda layer: 12) == {
        22: [h for h in range(12) if h != 1],
        23: [h for h in range(12) if h != 4],
    }


def made_up(accuracy: dict[str, float], n=200, filled=True, chance=0.125, aggregate_hi=0.45):
    """A one-model Result: each condition gets the first acc*n prompts right (so that conditions
    are nested, as a paired test sees them); conditions not given keep the unmasked accuracy.
    Unfilled: the Aggregate role went to the closest candidate, whose aggregate measure (0.4) has
    the upper bound `aggregate_hi` over the prompts."""
    import pandas as pd

    from helpers import heads as hd

    at = lambda acc: Score.of(np.arange(n) < round(acc * n))
    scores = {c: at(accuracy.get(c, accuracy["no mask"])) for c in chapter.CONDITIONS}
    measures = pd.DataFrame(
        {
            hd.GATHER_MEASURE: [0.9, 0.3],
            f"{hd.GATHER_MEASURE} hi": [0.95, 0.35],
            hd.AGGREGATE_MEASURE: [0.1, 0.4],
            f"{hd.AGGREGATE_MEASURE} hi": [0.15, aggregate_hi],
            hd.LOCAL_MEASURE: [0.1, 0.1],
        },
        index=[(16, 10), (17, 3)],
    )
    roles = Roles(
        {"G": (Head(16, 10),), "A": (Head(17, 3), Head(17, 9))},
        "paper" if filled else "behaviour",
        measures=None if filled else measures,
        closest=() if filled else ("A",),
        candidates=() if filled else (Head(16, 10), Head(17, 3)),
    )
    run = chapter.ModelRun("llamba-8b", roles, "MMLU (0-shot)", chance, scores)
    return chapter.Result(chapter.Config.for_profile("paper"), (run,), {})


PAPERS = {
    "no mask": 0.6,
    "G: control pattern": 0.3,
    "A: control pattern": 0.3,
    "G and A: control patterns": 0.25,
    "G zeroed": 0.25,
    "A zeroed": 0.25,
}


def test_the_papers_masking_result_is_reproduced():
    assert {x.outcome for x in chapter.verdicts(made_up(PAPERS))} == {v.REPRODUCED}


def test_a_control_that_beats_the_aggregate_pattern_is_said_so():
    result = made_up({**PAPERS, "A: aggregate pattern": 0.35, "A: control pattern": 0.6})
    by_claim = {x.claim: x.outcome for x in chapter.verdicts(result)}
    assert (
        by_claim["A head masked to the hypothesised pattern: accuracy is kept"] == v.NOT_REPRODUCED
    )
    assert by_claim["A head masked to the control pattern: accuracy falls"] == v.NOT_REPRODUCED
    assert by_claim["A head: the control scores below the hypothesised pattern"] == v.NOT_REPRODUCED
    assert by_claim["G head masked to the hypothesised pattern: accuracy is kept"] == v.REPRODUCED


def test_at_chance_nothing_is_testable_and_without_an_aggregate_head_it_is_one_finding():
    assert {x.outcome for x in chapter.verdicts(made_up({"no mask": 0.13}))} == {v.NOT_TESTABLE}
    verdicts = chapter.verdicts(made_up(PAPERS, filled=False))
    by_claim = {x.claim: x for x in verdicts}
    roles = verdicts[0]
    assert (
        roles.headline
        and roles.outcome == v.NOT_REPRODUCED
        and "another mechanism" in roles.evidence
    )
    assert "no candidate behaves as an Aggregate head" in roles.evidence
    # The claims about the stand-in's masks are not testable: one finding, not one per claim.
    a = by_claim["A head masked to the hypothesised pattern: accuracy is kept"]
    assert (
        a.outcome == v.NOT_TESTABLE
        and "no harmful head behaves as the Aggregate head" in a.evidence
    )
    assert (
        by_claim["G and A heads masked to the control patterns: accuracy falls"].outcome
        == v.NOT_TESTABLE
    )
    assert by_claim["G head masked to the control pattern: accuracy falls"].outcome == v.REPRODUCED
    assert [x.outcome for x in verdicts].count(v.NOT_REPRODUCED) == 1
    # the closest candidate's interval reaches the line: too few prompts to say no head plays it
    unsure = chapter.verdicts(made_up(PAPERS, filled=False, aggregate_hi=0.55))[0]
    assert (
        unsure.outcome == v.INCONCLUSIVE
        and "a candidate's interval reaches the line" in unsure.evidence
    )
    # every condition at the clean accuracy: nothing hurts, so the masks say nothing either
    flat = chapter.verdicts(made_up({"no mask": 0.7}, filled=False))
    assert {x.outcome for x in flat[1:10]} == {v.NOT_TESTABLE}


def test_a_roles_masks_are_judged_only_where_the_head_is_needed():
    # zeroing G costs nothing (redundancy): G masked to its pattern "keeping" accuracy says nothing,
    # nor does a control pattern of G that costs nothing either (Qwen's 24-layer minimal model)
    idle = {
        x.claim: x
        for x in chapter.verdicts(made_up({**PAPERS, "G zeroed": 0.6, "G: control pattern": 0.6}))
    }
    for claim in (
        "G head masked to the hypothesised pattern: accuracy is kept",
        "G head masked to the control pattern: accuracy falls",
        "G head: the control scores below the hypothesised pattern",
        "G and A heads masked to the hypothesised patterns: accuracy is kept",
    ):
        assert (
            idle[claim].outcome == v.NOT_TESTABLE
            and "zeroing Gather does not measurably lower" in idle[claim].evidence
        )
    assert (
        idle["A head masked to the hypothesised pattern: accuracy is kept"].outcome == v.REPRODUCED
    )
    assert idle["A head masked to the control pattern: accuracy falls"].outcome == v.REPRODUCED
    # the harm itself is still judged
    assert idle["G head zeroed: accuracy falls"].outcome == v.NOT_REPRODUCED


# the questions masking may take (head zeroing checks at least these)
CHECKED = chapter.check_questions("cpu", False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(
                models=["llamba-8b", "llama-3.1-8b-instruct"],
                gather=["L16H10"],
                aggregate=["L17H3"],
            ),
            "list one model",
        ),
        (dict(task="gsm8k"), "task must be one of 'kv', 'mmlu'"),
        (dict(models=[]), "models must name at least one model"),
        (dict(n=0), "n must be at least 1"),
        (
            dict(n=CHECKED + 1),
            f"n must be at most the {CHECKED} questions head zeroing checks its roles on",
        ),
    ],
)
def test_bad_parameters_fail_before_any_model_loads(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        chapter.Config.for_profile("cpu", **kwargs)


@pytest.mark.parametrize(
    "model, heads",
    [("smollm2-135m-instruct", [(16, 0), (18, 6), (18, 2)]), ("toy-mamba2", [(1, 0), (1, 2)])],
)
def test_masks_through_the_engine_equal_the_plain_scorers(model, heads, monkeypatch, request):
    import torch

    from helpers import evaluate, models
    from helpers.segments import aggregate_pattern, gather_pattern, score_with_patterns

    # Equal to 2e-4 in float32 (bfloat16 rounds further): SmolLM2 is conftest's float32 copy.
    loaded = (
        request.getfixturevalue("smol")
        if model == "smollm2-135m-instruct"
        else models.load(model, dtype=torch.float32)
    )
    b = bm.kv(model, loaded.tokenizer, 4, 2, seed=1, query="repeat")
    (g, a, *rest) = heads
    patterns = lambda seg: {
        g: gather_pattern(seg),
        a: aggregate_pattern(seg),
        **{h: gather_pattern(seg, control=True) for h in rest},
    }
    plain = []
    monkeypatch.setattr(evaluate, "from_loglikelihoods", lambda lls, items: plain.extend(lls))
    by_context = {it.pairs[0][0]: it for it in b.items}
    score_with_patterns(loaded, b.items, lambda context: b.segments(by_context[context]), patterns)
    for ours, theirs in zip(chapter.masked_loglikelihoods(loaded, b, patterns), plain, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=2e-4)
