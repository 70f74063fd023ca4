import pytest
import torch

import helpers
from helpers import InterventionError

@torch.inference_mode()
def logits(loaded, ids):
    return loaded.model(ids).logits


def test_empty_ablation_is_bit_identical(smol, ids):
    plain = logits(smol, ids)
    with helpers.zero_heads(smol, {}):
        assert torch.equal(logits(smol, ids), plain)
    with helpers.zero_heads(smol, {3: []}):
        assert torch.equal(logits(smol, ids), plain)


def test_interventions_restore_bit_for_bit(smol, ids):
    plain = logits(smol, ids)
    state = {k: v.clone() for k, v in smol.model.state_dict().items()}
    with helpers.zero_heads(smol, {16: [0], 18: [2, 6]}):
        assert not torch.equal(logits(smol, ids), plain)
    with helpers.prune_top(smol, 10):
        assert not torch.equal(logits(smol, ids), plain)
    with helpers.remove_layers(smol, [16]):
        pass
    with pytest.raises(RuntimeError), helpers.zero_heads(smol, {1: [1]}):
        raise RuntimeError("interrupted inside the block")
    assert torch.equal(logits(smol, ids), plain)
    assert all(torch.equal(state[k], v) for k, v in smol.model.state_dict().items())
    assert smol.adapter.n_layers == 30


def test_zeroing_a_head_removes_exactly_its_contribution(smol, ids):
    """Zeroing head h of layer L changes layer L's attention output by -W_o[:, h] @ z_h."""
    layer, head, dim = 16, 0, smol.adapter.head_dim(16)
    o_proj = smol.adapter.head_site(layer)
    seen = {}
    hook = o_proj.register_forward_hook(lambda m, a, out: seen.update({"in": a[0].clone()}))
    logits(smol, ids)
    hook.remove()
    z = seen["in"]
    with torch.inference_mode():
        expected = o_proj(z) - z[..., head * dim:(head + 1) * dim] @ o_proj.weight[:, head * dim:(head + 1) * dim].T
    got = {}
    hook = o_proj.register_forward_hook(lambda m, a, out: got.update({"out": out.clone()}))
    with helpers.zero_heads(smol, {layer: [head]}):
        logits(smol, ids)
    hook.remove()
    torch.testing.assert_close(got["out"], expected, rtol=0, atol=1e-5)


def test_remove_layers_equals_keep_layers(smol, ids):
    with helpers.remove_layers(smol, [5, 7]):
        a = logits(smol, ids)
    with helpers.keep_layers(smol, [i for i in range(30) if i not in (5, 7)]):
        assert torch.equal(logits(smol, ids), a)


def test_bad_input_names_the_range(smol):
    with pytest.raises(InterventionError, match="layers 0..29"):
        with helpers.zero_heads(smol, {30: [0]}):
            pass
    with pytest.raises(InterventionError, match="heads 0..8"):
        with helpers.zero_heads(smol, {3: [9]}):
            pass
    with pytest.raises(InterventionError, match="1..30"):
        helpers.prune_top(smol, 0)


@torch.inference_mode()
def test_removing_a_layer_below_zamba2s_hybrid_layer_keeps_its_index():
    """transformers passes a layer its position in the shortened list; a hybrid layer finds its
    shared block's adapters and cache slot by index, so removing layer 0 used to crash it."""
    toy = helpers.load("toy-hybrid")
    ids = torch.tensor([[1, 8, 9, 10, 2, 3]])
    full = toy.model(ids).logits
    with helpers.remove_layers(toy, [0]):
        removed = toy.model(ids).logits
        assert not torch.equal(removed, full)
    with helpers.keep_layers(toy, [1, 2]):
        assert torch.equal(toy.model(ids, use_cache=False).logits, removed)
    assert torch.equal(toy.model(ids).logits, full)
