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
        expected = (
            o_proj(z)
            - z[..., head * dim : (head + 1) * dim]
            @ o_proj.weight[:, head * dim : (head + 1) * dim].T
        )
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


# --- interventions inside one another (found by tests/test_properties.py) ------------------------


@torch.inference_mode()
def test_an_ssm_mask_keeps_its_layer_when_layers_are_removed_inside_its_block():
    """The mask used to look its layer's mixer up by index at every forward pass: inside a
    keep_layers block that index named another layer, or none."""
    from test_attention import tiny_mamba2

    model = tiny_mamba2()
    ids = torch.randint(0, 50, (1, 6))
    with helpers.keep_layers(model, [1]), helpers.mask_attention(model, 0, [0], torch.eye(6)):
        want = model(ids).logits
    with helpers.mask_attention(model, 1, [0], torch.eye(6)), helpers.keep_layers(model, [1]):
        assert torch.equal(model(ids).logits, want)


@torch.inference_mode()
def test_zamba2_heads_are_reached_by_position_after_layers_are_removed():
    """Its attention layers were looked up by their index in the full model, and a removed
    layer's neighbours were wrapped where the adapter could not see their attention."""
    from test_adapters import tiny_zamba2

    model = tiny_zamba2()  # attention in layers 1 and 3
    adapter = helpers.adapter_for(model)
    ids = torch.randint(0, 50, (1, 6))
    with helpers.zero_heads(adapter, {3: [1]}), helpers.remove_layers(adapter, [0]):
        want = model(ids, use_cache=False).logits
    with helpers.remove_layers(adapter, [0]):
        assert adapter.hybrid_layers == [0, 2]
        with helpers.zero_heads(adapter, {2: [1]}):
            assert torch.equal(model(ids, use_cache=False).logits, want)


def test_a_swapped_in_layer_is_reached_through_its_own_model():
    from test_adapters import tiny_pair

    teacher, student = tiny_pair()
    with helpers.swap_layers(teacher, student, [1]):
        adapter = helpers.adapter_for(teacher)
        assert adapter.head_layers() == [0, 2] and not adapter.is_attention(1)
        with pytest.raises(InterventionError, match="swapped in from a llamba model"):
            helpers.zero_heads(teacher, {1: [0]})
        with helpers.mask_last_row(teacher, 5):  # every attention layer: the teacher's own
            pass


def test_an_intervention_made_before_another_is_checked_again_on_entry():
    from test_validation import tiny_llama

    model = tiny_llama()  # 4 layers
    late = helpers.zero_heads(model, {3: [0]})
    with helpers.prune_top(model, 2):
        with pytest.raises(InterventionError, match="layers 0..1"), late:
            pass
