"""Robustness: the run at smoke size, the head sets and resample donors, and every verdict both
ways on hand-built results."""

import numpy as np
import pandas as pd
import pytest

from helpers import verdicts as v
from helpers.errors import ConfigError, InterventionError
from helpers.experiments import robustness as chapter
from helpers.heads import Head
from helpers.stats import Score
from helpers.tasks import Item


def test_run_at_smoke_size_removes_every_set_every_way():
    # The toy Transformer: SmolLM2's code path (the book's smoke build runs SmolLM2) in seconds.
    result = chapter.run(chapter.Config.for_profile("cpu", smoke=True, model="toy-transformer"))
    assert set(result.kinds.kind) == set(chapter.KINDS)
    assert set(result.kinds.set) == {"top 1", "top 2", "random 1 #1", "random 2 #1"}
    assert {s.n for s in result.kinds.score} == {6}
    assert set(result.redundancy.model) == {"toy-transformer", "toy-mamba2"} and set(result.redundancy.k) == {1, 2}
    zero = result.kinds[result.kinds.kind == "zero"].set_index("set").score
    top = result.redundancy[(result.redundancy.model == "toy-transformer")].set_index("set").score
    assert np.array_equal(zero["top 1"].correct, top["top 1"].correct)  # zero through the new path = the engine's zeroing
    assert [x.outcome for x in chapter.verdicts(result)][-1] == v.NOT_TESTABLE  # the 30-head claim is Llamba-8B's
    assert list(chapter.comparison(result).columns) == ["", "paper", "released code", "this run"]
    assert len(chapter.kinds_table(result)) == 4 and len(chapter.redundancy_table(result)) == 4


def test_random_sets_are_distinct_reproducible_and_avoid_the_top_heads():
    heads = [Head(l, h) for l in range(3) for h in range(4)]
    sets = chapter.random_sets(heads, heads[:2], 3, 5, seed=1)
    assert len(sets) == 5 and len({tuple(s) for s in sets}) == 5
    assert all(len(s) == 3 and not set(s) & set(heads[:2]) for s in sets)
    assert sets == chapter.random_sets(heads, heads[:2], 3, 5, seed=1) != chapter.random_sets(heads, heads[:2], 3, 5, 2)
    assert chapter.random_sets(heads[:3], heads[:2], 2, 5, 0) == []  # one head left: no set of two


class WordTokenizer:
    def encode(self, s):
        return [hash(w) % 97 + 3 for w in s.split(" ")]


def item(words, gold=0):
    return Item(((" ".join(["w"] * words), " 1"), (" ".join(["w"] * words), " 2")), gold)


def test_resample_donors_have_the_measured_prompts_length_and_candidates():
    lengths = [3, 5, 3, 4, 3, 2, 2, 2]  # the draw's prompts' lengths in words; a larger draw extends a smaller one
    draw = lambda n: [Item(((" ".join([f"p{i}"] * k), " 7"),), 0) for i, k in enumerate(lengths[:n])]
    measured = [item(3), item(5), item(3), item(3)]
    out = chapter.donors(WordTokenizer(), measured, draw)
    # each donor serves once (a shared context would be packed as one row); the draw grew to 8 for the third
    assert [o.pairs[0][0].split(" ")[0] for o in out] == ["p0", "p1", "p2", "p4"]
    assert all(o.pairs[1][1] == " 2" for o in out)  # the measured prompt's own candidates
    with pytest.raises(InterventionError, match="no unused reference prompt among 8 drawn has the layout"):
        chapter.donors(WordTokenizer(), [item(6)], draw)


def test_seeds_must_keep_ranking_measuring_and_reference_prompts_apart():
    with pytest.raises(ConfigError, match="must differ"):
        chapter.Config.for_profile("cpu", smoke=True, seed=0)
    with pytest.raises(ConfigError, match="must differ"):
        chapter.Config.for_profile("cpu", smoke=True, reference_seed=1)


def at(acc, n=200):
    return Score.of(np.arange(n) < round(acc * n))


def made_up(profile="cpu", top=(0.2, 0.2, 0.2), controls=(0.78, 0.78, 0.78), clean=0.8, attn_k1=0.2, ssm_k1=0.8,
            ssm_clean=0.8, ssm_k30=None):
    """A Result: the top-2 set's accuracy under zero, mean, resample; random sets' (each kind);
    the redundancy curves at k = 1 (and k = 30 for the SSM)."""
    cfg = chapter.Config.for_profile(profile, smoke=True)
    kinds = pd.DataFrame([dict(kind=k, set=name, size=2, control=name != "top 2", heads="L1H0, L1H1", score=at(a))
                          for k, t, c in zip(chapter.KINDS, top, controls)
                          for name, a in (("top 2", t), ("random 2 #1", c))])
    rows = [dict(model=cfg.model, k=1, control=False, set="top 1", heads="L1H0", score=at(attn_k1)),
            dict(model=cfg.model, k=1, control=True, set="random 1 #1", heads="L2H0", score=at(clean)),
            dict(model=cfg.ssm_model, k=1, control=False, set="top 1", heads="L1H0", score=at(ssm_k1))]
    if ssm_k30 is not None:
        rows.append(dict(model=cfg.ssm_model, k=30, control=False, set="top 30", heads="L1H0", score=at(ssm_k30)))
    clean_scores = {cfg.model + " (KV)": at(clean), cfg.model: at(clean), cfg.ssm_model: at(ssm_clean)}
    chance = {name: 0.125 for name in clean_scores}
    tasks = {cfg.model: "KV retrieval (8 keys)", cfg.ssm_model: "MMLU (0-shot)"}
    return chapter.Result(cfg, kinds, pd.DataFrame(rows), clean_scores, chance, tasks, {})


def test_a_bottleneck_under_every_kind_and_one_only_under_zeroing():
    assert [x.outcome for x in chapter.kind_verdicts(made_up())] == [v.REPRODUCED] * 3
    # mean and resample leave the top heads' accuracy: the bottleneck is zeroing's artefact
    only_zero = chapter.kind_verdicts(made_up(top=(0.2, 0.79, 0.8)))
    assert [x.outcome for x in only_zero] == [v.REPRODUCED, v.NOT_REPRODUCED, v.NOT_REPRODUCED]
    # random heads as harmful as the top ones: not specific
    assert chapter.kind_verdicts(made_up(controls=(0.2, 0.2, 0.2)))[0].outcome == v.NOT_REPRODUCED


def test_graceful_degradation_both_ways():
    breaks, graceful, _ = chapter.redundancy_verdicts(made_up())
    assert (breaks.outcome, graceful.outcome) == (v.REPRODUCED, v.REPRODUCED)
    _, ssm_breaks_too, _ = chapter.redundancy_verdicts(made_up(ssm_k1=0.3))
    assert ssm_breaks_too.outcome == v.NOT_REPRODUCED
    attn_kept, either, _ = chapter.redundancy_verdicts(made_up(attn_k1=0.8))
    assert (attn_kept.outcome, either.outcome) == (v.NOT_REPRODUCED, v.NOT_REPRODUCED)


def test_the_30_head_claim_both_ways_on_llamba_and_not_testable_elsewhere():
    kept = chapter.claim_30(made_up("paper", ssm_clean=0.6, ssm_k30=0.6))
    lost = chapter.claim_30(made_up("paper", ssm_clean=0.6, ssm_k30=0.4))
    assert (kept.outcome, lost.outcome) == (v.REPRODUCED, v.NOT_REPRODUCED)
    assert "3 points" in kept.evidence  # 5% of 60%: the margin follows the clean accuracy
    assert chapter.claim_30(made_up("paper", ssm_clean=0.6)).outcome == v.NOT_TESTABLE  # no k = 30 in the run
    assert chapter.claim_30(made_up("cpu", ssm_k30=0.8)).outcome == v.NOT_TESTABLE  # the toy is not Llamba-8B
