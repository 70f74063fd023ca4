"""Mean and resample ablation: heads' outputs replaced at the site where zeroing acts, through
`interventions.replace_heads` and the sweep engine's `replaced`; zero through the new path is the
old zeroing bit for bit, the model comes back exactly, and a mean has a known answer."""

import numpy as np
import pytest
import torch

import helpers
from helpers import InterventionError
from helpers.engine import SweepEngine
from helpers.heads import ablation
from helpers.interventions import replace_heads, site_width
from helpers.specs import Spec


@torch.inference_mode()
def logits(loaded, ids):
    return loaded.model(ids).logits


@pytest.fixture(scope="module")
def kv():
    return helpers.kv_items(4, 5, seed=3, query="repeat")


def test_zero_through_the_new_path_is_zero_heads_bit_for_bit(smol, ids):
    heads = {16: [0], 18: [2, 6]}
    with helpers.zero_heads(smol, heads):
        zeroed = logits(smol, ids)
    zeros = {l: torch.zeros(site_width(smol.adapter, l)) for l in heads}
    with replace_heads(smol, heads, zeros):
        assert torch.equal(logits(smol, ids), zeroed)


def test_replacement_restores_the_model_exactly(smol, ids):
    plain = logits(smol, ids)
    state = {k: v.clone() for k, v in smol.model.state_dict().items()}
    value = {16: torch.randn(site_width(smol.adapter, 16))}
    with replace_heads(smol, {16: [0, 4]}, value):
        assert not torch.equal(logits(smol, ids), plain)
    with pytest.raises(RuntimeError), replace_heads(smol, {16: [1]}, value):
        raise RuntimeError("interrupted inside the block")
    assert torch.equal(logits(smol, ids), plain)
    assert all(torch.equal(state[k], v) for k, v in smol.model.state_dict().items())


def test_a_heads_own_output_at_its_only_position_as_the_mean_changes_nothing(smol, kv):
    # The reference set is the measured prompt itself, one token long: its mean over positions
    # is the head's own output there, so mean ablation must give the clean logits exactly.
    one = torch.tensor([[42]])
    engine = SweepEngine(smol, smol.tokenizer, kv, batch_tokens=200)
    seen = {}
    hook = smol.adapter.head_site(16).register_forward_pre_hook(
        lambda m, a: seen.update(x=a[0][0, 0].clone())
    )
    plain = logits(smol, one)
    hook.remove()
    with replace_heads(smol, {16: [3]}, {16: seen["x"]}):
        assert torch.equal(logits(smol, one), plain)
    # and the engine's mean of a one-item set is the average over its real tokens, padding left out
    xs = engine.site_inputs(16)
    # several batches, some padding
    assert len(xs) > 1 and any(not engine.valid(i).all() for i in range(len(xs)))
    real = torch.cat([x[engine.valid(i)] for i, x in enumerate(xs)]).double()
    assert len(real) == int(engine.rows.lengths.sum())
    np.testing.assert_allclose(
        engine.site_mean(16).numpy(), real.mean(0).numpy(), rtol=0, atol=1e-6
    )


def test_engine_replacement_equals_the_intervention_on_the_plain_scorer(smol, kv):
    engine = SweepEngine(smol, smol.tokenizer, kv, batch_tokens=300)
    width = site_width(smol.adapter, 16)
    mean = engine.site_mean(16)
    heads = [[(16, 0)], [(16, 2), (16, 7)]]
    zero = engine.replaced([Spec(zero=h) for h in heads], {16: torch.zeros(width)})
    # zero: the engine's zeroing exactly
    np.testing.assert_array_equal(zero, engine.loglikelihoods([Spec(zero=h) for h in heads]))
    got = engine.replaced([Spec(mean=h) for h in heads], {16: mean})
    for spec, row in zip([Spec(mean=h) for h in heads], got):
        with replace_heads(smol, ablation(spec.replaced), {16: mean}):
            ref = np.concatenate(helpers.choice_loglikelihoods(smol.model, smol.tokenizer, kv))
        np.testing.assert_allclose(row, ref, rtol=0, atol=2e-4)
    assert not np.allclose(got[0], zero[0], atol=1e-3)  # a mean is not zero


def test_resampling_from_oneself_changes_nothing_and_from_another_prompt_something(smol, kv):
    engine = SweepEngine(smol, smol.tokenizer, kv)
    same = SweepEngine(smol, smol.tokenizer, kv)
    assert engine.same_layout(same)
    clean = engine.loglikelihoods(["none"])
    np.testing.assert_allclose(
        engine.replaced(["resample L16H0,L16H1,L16H2"], {16: same.site_inputs(16)}),
        clean,
        rtol=0,
        atol=1e-9,
    )
    other = [
        helpers.Item(tuple((kv[(i + 1) % len(kv)].pairs[0][0], c) for _, c in it.pairs), it.gold)
        for i, it in enumerate(kv)
    ]
    donor = SweepEngine(smol, smol.tokenizer, other)
    if donor.same_layout(engine):
        assert not np.allclose(
            engine.replaced(["resample L16H0"], {16: donor.site_inputs(16)}), clean, atol=1e-3
        )


def test_bad_replacement_values_name_the_fix(smol, kv):
    with pytest.raises(InterventionError, match="no replacement values for layer"):
        replace_heads(smol, {16: [0]}, {})
    with pytest.raises(InterventionError, match="site's width 576"):
        replace_heads(smol, {16: [0]}, {16: torch.zeros(5)})
    engine = SweepEngine(smol, smol.tokenizer, kv)
    with pytest.raises(InterventionError, match="no replacement values"):
        engine.replaced(["mean L16H0"], {})
