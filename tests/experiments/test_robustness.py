"""Robustness: the run at smoke size, the head sets and resample donors, and every verdict both
ways on hand-built results."""

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from fakes import Tokenizer

import helpers
from helpers import verdicts as v
from helpers.engine import SweepEngine
from helpers.errors import ConfigError, InterventionError
from helpers.experiments import robustness as chapter
from helpers.experiments.robustness import agreement, patching, removal, stability
from helpers.heads import Head
from helpers.specs import Spec
from helpers.stats import Score
from helpers.sweep import Store
from helpers.tasks import Item


def test_run_at_smoke_size_removes_every_set_every_way():
    # The toy Transformer: SmolLM2's code path (the book's smoke build runs SmolLM2) in seconds.
    result = chapter.run(chapter.Config.for_profile("cpu", smoke=True, model="toy-transformer"))
    assert set(result.kinds.kind) == set(removal.KINDS)
    assert set(result.kinds.set) == {"top 1", "top 2", "random 1 #1", "random 2 #1"}
    assert {s.n for s in result.kinds.score} == {6}
    assert set(result.redundancy.model) == {"toy-transformer", "toy-mamba2"} and set(
        result.redundancy.k
    ) == {1, 2}
    zero = result.kinds[result.kinds.kind == "zero"].set_index("set").score
    top = result.redundancy[(result.redundancy.model == "toy-transformer")].set_index("set").score
    # zero through the new path = the engine's zeroing
    assert np.array_equal(zero["top 1"].correct, top["top 1"].correct)
    # the 30-head claim is Llamba-8B's
    assert [x.outcome for x in chapter.verdicts(result)][-1] == v.NOT_TESTABLE
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert len(chapter.kinds_table(result)) == 4 and len(chapter.redundancy_table(result)) == 4
    # patching: every head the ranking measured exactly, each prompt's corruption asks another key
    p = result.patching
    assert len(p.heads) == 8 and len(p.clean) == 6 and set(p.patched) == set(p.heads["head"])
    # the swapped key moves the answer: there is something to recover
    assert p.corrupted.mean() < p.clean.mean()
    # stability: two seeds of the toy's one prompt form, the screen's layers swept on each
    s = result.stability
    assert list(s.conditions.seed) == [0, 1] and len(s.pairs) == 1 and s.layers == [0, 1]
    assert len(chapter.patching_table(result)) == 8 and len(chapter.stability_table(result)) == 2


def test_the_stability_reference_is_the_rankings_own_cells(monkeypatch, tmp_path):
    # The reference condition is the book's ranking, read from its store: stability measures only
    # the other conditions, and the reference's top heads are the ranking's most harmful.
    monkeypatch.setenv("GA_RESULTS", str(tmp_path))
    loaded = helpers.protocol.loading.load("toy-transformer")
    cfg = chapter.Config.for_profile("cpu", smoke=True, model="toy-transformer")
    ranking = chapter.shared.kv_ranking(loaded, "cpu", True)
    # what is computed, seen where it is stored (a store is versioned by its measurements'
    # code, so the spy cannot stand in for one)
    put, stored = Store.put, []
    monkeypatch.setattr(
        Store, "put", lambda self, cell, result: stored.append(cell) or put(self, cell, result)
    )
    s = stability.run_stability(loaded, cfg)
    swept = [c for c in stored if c.get("part") == "layer"]
    own = {k: ranking.settings[k] for k in chapter.shared.PROMPTS}
    assert len(s.conditions) == 2 and swept  # the toy: the ranking's seed and the next
    assert {c["seed"] for c in swept} == {ranking.settings["seed"] + 1} and all(
        {k: c[k] for k in own} != own for c in swept
    )
    exact = ranking.table.dropna(subset=["acc"])
    acc = {f"L{l}H{h}": a for l, h, a in zip(exact.layer, exact["head"], exact.acc)}
    top = s.conditions.top[0].split(", ")
    assert set(top) <= set(acc) and sorted(acc[h] for h in top) == sorted(acc.values())[: len(top)]


def test_random_sets_are_distinct_reproducible_and_avoid_the_top_heads():
    heads = [Head(l, h) for l in range(3) for h in range(4)]
    sets = removal.random_sets(heads, heads[:2], 3, 5, seed=1)
    assert len(sets) == 5 and len({tuple(s) for s in sets}) == 5
    assert all(len(s) == 3 and not set(s) & set(heads[:2]) for s in sets)
    assert (
        sets
        == removal.random_sets(heads, heads[:2], 3, 5, seed=1)
        != removal.random_sets(heads, heads[:2], 3, 5, 2)
    )
    assert removal.random_sets(heads[:3], heads[:2], 2, 5, 0) == []  # one head left: no set of two


class WordTokenizer(Tokenizer):
    def encode(self, s):
        return [hash(w) % 97 + 3 for w in s.split(" ")]


def item(words, gold=0):
    return Item(((" ".join(["w"] * words), " 1"), (" ".join(["w"] * words), " 2")), gold)


def test_resample_donors_have_the_measured_prompts_length_and_candidates():
    # the draw's prompts' lengths in words; a larger draw extends a smaller one
    lengths = [
        3,
        5,
        3,
        4,
        3,
        2,
        2,
        2,
    ]
    draw = lambda n: [
        Item(((" ".join([f"p{i}"] * k), " 7"),), 0) for i, k in enumerate(lengths[:n])
    ]
    measured = [item(3), item(5), item(3), item(3)]
    out = removal.donors(WordTokenizer(), measured, draw)
    # each donor serves once (a shared context would be packed as one row); the draw grew to 8 for the third
    assert [o.pairs[0][0].split(" ")[0] for o in out] == ["p0", "p1", "p2", "p4"]
    assert all(o.pairs[1][1] == " 2" for o in out)  # the measured prompt's own candidates
    with pytest.raises(
        InterventionError, match="no unused reference prompt among 8 drawn has the layout"
    ):
        removal.donors(WordTokenizer(), [item(6)], draw)


def test_seeds_must_keep_ranking_measuring_and_reference_prompts_apart():
    with pytest.raises(ConfigError, match="must differ"):
        chapter.Config.for_profile("cpu", smoke=True, seed=0)
    with pytest.raises(ConfigError, match="must differ"):
        chapter.Config.for_profile("cpu", smoke=True, reference_seed=1)


def test_ks_a_model_cannot_take_are_refused_before_any_load_and_said_where_left_out():
    toys = dict(model="toy-transformer", ssm_model="toy-mamba2")  # 16 and 12 heads
    with pytest.raises(
        ConfigError, match=r"ks: toy-mamba2 has 12 heads, and every k of \[12, 20\] would remove"
    ):
        # was a KeyError after the whole run
        chapter.Config.for_profile("cpu", smoke=True, ks=[12, 20], **toys)
    result = chapter.Result(
        chapter.Config.for_profile("cpu", smoke=True, ks=[1, 14], **toys),
        pd.DataFrame(),
        pd.DataFrame(),
        {},
        {},
        {},
        {},
    )
    assert chapter.skipped_ks(result) == (
        "Left out, as at least every head of the model: k = 14 for toy-mamba2 (12 heads)."
    )
    every = chapter.Config.for_profile("cpu", smoke=True, ks=[1, 12], **toys)
    assert chapter.skipped_ks(dataclasses.replace(result, cfg=every)) == (
        "Left out, as at least every head of the model: k = 12 for toy-mamba2 (12 heads)."
    )
    assert (
        chapter.skipped_ks(
            dataclasses.replace(result, cfg=chapter.Config.for_profile("cpu", smoke=True, **toys))
        )
        == ""
    )


def at(acc, n=200):
    return Score.of(np.arange(n) < round(acc * n))


def made_up(
    profile="cpu",
    top=(0.2, 0.2, 0.2),
    controls=(0.78, 0.78, 0.78),
    clean=0.8,
    attn_k1=0.2,
    ssm_k1=0.8,
    ssm_clean=0.8,
    ssm_k30=None,
):
    """A Result: the top-2 set's accuracy under zero, mean, resample; random sets' (each kind);
    the redundancy curves at k = 1 (and k = 30 for the SSM)."""
    cfg = chapter.Config.for_profile(profile, smoke=True)
    kinds = pd.DataFrame(
        [
            dict(kind=k, set=name, size=2, control=name != "top 2", heads="L1H0, L1H1", score=at(a))
            for k, t, c in zip(removal.KINDS, top, controls)
            for name, a in (("top 2", t), ("random 2 #1", c))
        ]
    )
    rows = [
        dict(model=cfg.model, k=1, control=False, set="top 1", heads="L1H0", score=at(attn_k1)),
        dict(model=cfg.model, k=1, control=True, set="random 1 #1", heads="L2H0", score=at(clean)),
        dict(model=cfg.ssm_model, k=1, control=False, set="top 1", heads="L1H0", score=at(ssm_k1)),
    ]
    if ssm_k30 is not None:
        rows.append(
            dict(
                model=cfg.ssm_model,
                k=30,
                control=False,
                set="top 30",
                heads="L1H0",
                score=at(ssm_k30),
            )
        )
    clean_scores = {
        cfg.model + " (KV)": at(clean),
        cfg.model: at(clean),
        cfg.ssm_model: at(ssm_clean),
    }
    chance = {name: 0.125 for name in clean_scores}
    tasks = {cfg.model: "KV retrieval (8 keys)", cfg.ssm_model: "MMLU (0-shot)"}
    return chapter.Result(cfg, kinds, pd.DataFrame(rows), clean_scores, chance, tasks, {})


def test_a_bottleneck_under_every_kind_and_one_only_under_zeroing():
    assert [x.outcome for x in removal.kind_verdicts(made_up())] == [v.REPRODUCED] * 3
    # mean and resample leave the top heads' accuracy: the bottleneck is zeroing's artefact
    only_zero = removal.kind_verdicts(made_up(top=(0.2, 0.79, 0.8)))
    assert [x.outcome for x in only_zero] == [v.REPRODUCED, v.NOT_REPRODUCED, v.NOT_REPRODUCED]
    # random heads as harmful as the top ones: not specific
    assert removal.kind_verdicts(made_up(controls=(0.2, 0.2, 0.2)))[0].outcome == v.NOT_REPRODUCED


def test_graceful_degradation_both_ways():
    breaks, graceful, _ = removal.redundancy_verdicts(made_up())
    assert (breaks.outcome, graceful.outcome) == (v.REPRODUCED, v.REPRODUCED)
    _, ssm_breaks_too, _ = removal.redundancy_verdicts(made_up(ssm_k1=0.3))
    assert ssm_breaks_too.outcome == v.NOT_REPRODUCED
    attn_kept, either, _ = removal.redundancy_verdicts(made_up(attn_k1=0.8))
    assert (attn_kept.outcome, either.outcome) == (v.NOT_REPRODUCED, v.NOT_REPRODUCED)


def test_the_30_head_claim_both_ways_on_llamba_and_not_testable_elsewhere():
    kept = removal.claim_30(made_up("paper", ssm_clean=0.6, ssm_k30=0.6))
    lost = removal.claim_30(made_up("paper", ssm_clean=0.6, ssm_k30=0.4))
    assert (kept.outcome, lost.outcome) == (v.REPRODUCED, v.NOT_REPRODUCED)
    assert "3 points" in kept.evidence  # 5% of 60%: the margin follows the clean accuracy
    # no k = 30 in the run
    assert removal.claim_30(made_up("paper", ssm_clean=0.6)).outcome == v.NOT_TESTABLE
    # the toy is not Llamba-8B
    assert removal.claim_30(made_up("cpu", ssm_k30=0.8)).outcome == v.NOT_TESTABLE


# --- activation patching ------------------------------------------------------------------------------


class CharTokenizer(Tokenizer):
    def encode(self, s):
        return [ord(c) for c in s]


def test_the_query_key_swaps_to_the_first_key_of_the_same_length_or_none():
    ctx = "Memorize the following dictionary:\nab:1\nxyz:2\ncd:3\n"
    item = Item(((ctx + "ab:", "1"), (ctx + "ab:", "2"), (ctx + "ab:", "3")), 0)
    swapped = patching.key_swapped(CharTokenizer(), item)
    assert (
        swapped.pairs[0][0] == ctx + "cd:"
        and swapped.gold == 0
        and [c for _, c in swapped.pairs] == ["1", "2", "3"]
    )
    q = ctx + "The value of the key 'cd' is"
    paper_query = Item(((q, "1"), (q, "2"), (q, "3")), 2)
    assert (
        patching.key_swapped(CharTokenizer(), paper_query).pairs[1][0]
        == ctx + "The value of the key 'ab' is"
    )
    # none of 3 letters
    assert (
        patching.key_swapped(CharTokenizer(), Item(((ctx + "xyz:", "1"), (ctx + "xyz:", "2")), 1))
        is None
    )
    toy = Item(
        (
            ("<s> k1 k2 : v4 \\n k3 k4 : v5 \\n ? k1 k2 :", " v4"),
            ("<s> k1 k2 : v4 \\n k3 k4 : v5 \\n ? k1 k2 :", " v5"),
        ),
        0,
    )
    assert (
        patching.key_swapped(CharTokenizer(), toy).pairs[0][0]
        == "<s> k1 k2 : v4 \\n k3 k4 : v5 \\n ? k3 k4 :"
    )
    with pytest.raises(InterventionError, match="not a KV prompt"):
        patching.key_swapped(CharTokenizer(), Item((("no query here", " 1"),), 0))


@pytest.fixture(scope="module")
def swapped_runs(smol):
    items = helpers.kv_items(4, 6, seed=3, query="repeat")
    pairs = [(it, c) for it in items if (c := patching.key_swapped(smol.tokenizer, it)) is not None]
    assert len(pairs) >= 3
    clean, corrupted = (SweepEngine(smol, smol.tokenizer, [p[i] for p in pairs]) for i in (0, 1))
    return clean, corrupted


def test_patching_every_head_restores_the_clean_answer_and_patching_none_restores_nothing(
    smol, swapped_runs
):
    # Known answers: the candidates' tokens are the same in both runs and only attention moves
    # information between positions, so with every head of every layer patched from the clean
    # run the scored positions compute exactly what the clean run computes (recovery 1); with
    # none patched the corrupted run is unchanged (recovery 0).
    clean, corrupted = swapped_runs
    every = {l: list(range(smol.adapter.n_heads(l))) for l in smol.adapter.head_layers()}
    out = corrupted.patched({"none": Spec(), "every head": Spec(patch=every)}, clean)
    c, x = clean.loglikelihoods(["none"])[0], corrupted.loglikelihoods(["none"])[0]
    gold = lambda engine, ll: engine.margins(torch.as_tensor(ll)).double().numpy()
    assert np.abs(gold(clean, c) - gold(corrupted, x)).max() > 0.5  # the swap moves the answer
    # (to float32's rounding: the two ablations run side by side, a batch twice as large)
    np.testing.assert_allclose(out["every head"], c, atol=1e-4)
    np.testing.assert_allclose(out["none"], x, atol=1e-4)
    rec = patching.recoveries(
        gold(clean, c), gold(corrupted, x), np.stack([gold(corrupted, out[k]) for k in out])
    )
    assert rec == pytest.approx([0, 1], abs=1e-4)


def test_patching_a_layers_heads_feeds_it_the_clean_runs_head_outputs(smol, swapped_runs):
    clean, corrupted = swapped_runs
    layer = smol.adapter.head_layers()[-1]
    seen = []
    hook = smol.adapter.head_site(layer).register_forward_hook(
        lambda m, args, out: seen.append(args[0].clone())
    )
    try:
        corrupted.patched({"all": Spec(patch={layer: range(smol.adapter.n_heads(layer))})}, clean)
    finally:
        hook.remove()
    # the first calls are the clean run's own (its site inputs taken), the last the patched run's
    patched_run = seen[-len(corrupted.batches) :]
    assert len(seen) == 2 * len(clean.batches)
    assert all(torch.equal(a, b) for a, b in zip(patched_run, clean.site_inputs(layer)))
    unpatched = corrupted.site_inputs(layer)
    assert not all(torch.equal(a, b) for a, b in zip(patched_run, unpatched))
    with pytest.raises(InterventionError, match="line up"):
        corrupted.patched(
            {"one": Spec(patch=[(layer, 0)])}, SweepEngine(smol, smol.tokenizer, clean.items[:1])
        )


def test_recovery_rank_correlation_and_overlap_follow_the_heads_that_recover():
    # five heads measured by zeroing, most harmful first; patching recovers them in that order or reversed
    table = pd.DataFrame(
        dict(layer=[1] * 5, head=range(5), acc=[0.1, 0.3, 0.5, 0.7, 0.9], estimate=0.0)
    )
    rng = np.random.default_rng(0)
    clean, corrupted = rng.normal(2, 0.1, 50), rng.normal(0, 0.1, 50)
    same = {str(Head(1, h)): corrupted + (1 - 0.2 * h) * (clean - corrupted) for h in range(5)}
    heads, a = patching.patch_agreement(table, same, clean, corrupted, k=2)
    assert (
        np.allclose(heads.recovery, [1, 0.8, 0.6, 0.4, 0.2])
        and a["rho"] == pytest.approx(1)
        and a["overlap"] == 2
    )
    assert a["lo"] > 0 and a["overlap_lo"] == 2
    reversed_ = {str(Head(1, h)): same[str(Head(1, 4 - h))] for h in range(5)}
    _, b = patching.patch_agreement(table, reversed_, clean, corrupted, k=2)
    assert b["rho"] == pytest.approx(-1) and b["overlap"] == 0 and b["hi"] < 0
    # 2 of 5 twice: 4/5 on average
    assert (a["chance"], a["chance_line"]) == (
        pytest.approx(0.8),
        2.0,
    )


def test_rankings_agree_both_ways_and_inconclusive_between():
    agree = v.rankings_agree((0.8, 0.5, 0.9), (4, 3, 5), 1.0, 2.0)
    assert agree[0] == v.REPRODUCED and "0.80 [0.50, 0.90]" in agree[1]
    # rho at or below 0
    assert v.rankings_agree((-0.2, -0.5, 0.0), (3, 3, 4), 1.0, 2.0)[0] == v.NOT_REPRODUCED
    # top sets share no more than random
    assert v.rankings_agree((0.8, 0.5, 0.9), (1, 0, 1), 1.0, 2.0)[0] == v.NOT_REPRODUCED
    assert v.rankings_agree((0.3, -0.1, 0.6), (3, 2, 4), 1.0, 2.0)[0] == v.INCONCLUSIVE
    # at the random 97.5% point
    assert v.rankings_agree((0.8, 0.5, 0.9), (2, 2, 2), 1.0, 2.0)[0] == v.INCONCLUSIVE
    assert v.rankings_agree((float("nan"),) * 3, (2, 2, 2), 1.0, 2.0)[0] == v.NOT_TESTABLE


def patching_made_up(rho=(0.8, 0.5, 0.9), overlap=(4, 3, 5), gap=2.0, readable=(True, "")):
    rng = np.random.default_rng(0)
    clean = rng.normal(gap, 0.1, 40)
    a = dict(
        rho=rho[0],
        lo=rho[1],
        hi=rho[2],
        overlap=overlap[0],
        overlap_lo=overlap[1],
        overlap_hi=overlap[2],
        chance=1.0,
        chance_line=2.0,
        k=5,
        n=27,
        prompts=40,
    )
    return patching.Patching(
        pd.DataFrame(), clean, np.zeros(40), {}, a, at(0.7), readable, at(0.7), at(0.1)
    )


def test_the_patching_verdict_both_ways_and_not_testable_without_a_gap_or_a_readable_ranking():
    assert patching.patching_verdict(patching_made_up()).outcome == v.REPRODUCED
    assert (
        patching.patching_verdict(patching_made_up(rho=(0.0, -0.3, 0.0), overlap=(1, 0, 2))).outcome
        == v.NOT_REPRODUCED
    )
    # nothing to recover
    assert patching.patching_verdict(patching_made_up(gap=0.0)).outcome == v.NOT_TESTABLE
    unread = patching.patching_verdict(patching_made_up(readable=(False, "at chance")))
    assert unread.outcome == v.NOT_TESTABLE and "at chance" in unread.evidence


def stability_made_up(rhos, readable=None):
    readable = readable or [True] * (len(rhos) + 1)
    conditions = pd.DataFrame(
        [
            dict(
                seed=i,
                query="repeat",
                form="released",
                n=100,
                clean=at(0.7),
                readable=ok,
                why="" if ok else "at chance",
                top="L1H0, L2H3",
            )
            for i, ok in enumerate(readable)
        ]
    )
    pairs = pd.DataFrame(
        [
            dict(
                seed=i + 1,
                query="repeat",
                form="released",
                readable=readable[0] and readable[i + 1],
                rho=r[0],
                lo=r[1],
                hi=r[2],
                overlap=4,
                overlap_lo=r[3],
                overlap_hi=5,
                chance=1.0,
                chance_line=2.0,
                k=5,
                n=27,
            )
            for i, r in enumerate(rhos)
        ]
    )
    return stability.Stability(conditions, pairs, ["L1H0", "L2H3"], 5, [1, 2])


def test_the_stability_verdict_needs_every_condition_to_agree():
    good = (0.8, 0.5, 0.9, 3)
    assert stability.stability_verdict(stability_made_up([good, good])).outcome == v.REPRODUCED
    assert "L1H0, L2H3" in stability.stability_verdict(stability_made_up([good, good])).evidence
    assert (
        stability.stability_verdict(stability_made_up([good, (-0.3, -0.6, -0.1, 3)])).outcome
        == v.NOT_REPRODUCED
    )
    assert (
        stability.stability_verdict(stability_made_up([good, (0.3, -0.1, 0.6, 3)])).outcome
        == v.INCONCLUSIVE
    )
    # a condition at chance is left out; the reference at chance makes the claim untestable
    assert (
        stability.stability_verdict(stability_made_up([good, good], [True, True, False])).outcome
        == v.REPRODUCED
    )
    assert (
        stability.stability_verdict(stability_made_up([good, good], [False, True, True])).outcome
        == v.NOT_TESTABLE
    )


def test_the_random_overlap_line_is_the_hypergeometric_975_point():
    from itertools import combinations

    n, k = 7, 3
    # every top-k set of one order against a fixed top-k of the other: the exact overlap distribution
    overlaps = sorted(len(set(c) & {0, 1, 2}) for c in combinations(range(n), k))
    point = next(x for x in range(k + 1) if sum(o <= x for o in overlaps) >= 0.975 * len(overlaps))
    assert agreement.overlap_chance(n, k) == (pytest.approx(np.mean(overlaps)), point)


def test_stability_conditions_factorial_and_one_factor_at_a_time():
    full = stability.stability_conditions(
        chapter.Config.for_profile(
            "cpu", stability_design="factorial", stability_seeds=3, stability_queries=2
        ),
        toy=False,
    )
    assert len(full) == 12 and full[0] == (0, "repeat", "released") and len(set(full)) == 12
    one = stability.stability_conditions(
        chapter.Config.for_profile("cpu", stability_seeds=3, stability_queries=2), toy=False
    )
    # each factor alone from the reference
    assert one == [
        (0, "repeat", "released"),
        (1, "repeat", "released"),
        (2, "repeat", "released"),
        (0, "paper", "released"),
        (0, "repeat", "trailing"),
    ]
    # the CPU design
    cpu = stability.stability_conditions(chapter.Config.for_profile("cpu"), toy=False)
    assert cpu == [(0, "repeat", "released"), (1, "repeat", "released"), (0, "repeat", "trailing")]
    assert set(one) <= set(full)
    paper = stability.stability_conditions(chapter.Config.for_profile("paper"), toy=False)
    # the paper profile's query first
    assert len(paper) == 12 and paper[0] == (
        0,
        "paper",
        "released",
    )


def test_random_heads_above_clean_are_said_with_their_paired_interval_both_ways():
    # the random set scores as clean does: nothing to explain
    assert chapter.above_clean(made_up()) == ""
    result = made_up()
    r = result.redundancy.copy()
    clean = result.clean[result.cfg.model]
    wrong = np.flatnonzero(~clean.correct)
    noise = clean.correct.copy()
    # +2 items: 4 gained, 2 lost
    noise[wrong[:4]], noise[np.flatnonzero(clean.correct)[:2]] = (
        True,
        False,
    )
    helps = clean.correct.copy()
    helps[wrong[:30]] = True  # 30 items gained, none lost
    for correct, read in ((noise, "every interval holds 0"), (helps, "helps beyond chance")):
        r.loc[r.control, "score"] = [Score.of(correct)]
        note = chapter.above_clean(dataclasses.replace(result, redundancy=r))
        assert note.startswith("Random sets scoring above the clean model") and read in note
        assert f"{result.cfg.model}, 1 random heads" in note
