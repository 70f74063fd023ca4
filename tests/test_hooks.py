"""The one hook door (`helpers.hooks`): every site reads what passes it and can replace it, and
leaving the block, by error too, leaves the model with no hook and its outputs bit for bit."""

import pytest
import torch
from test_attention import tiny_mamba2
from test_validation import IDS, logits, tiny_llama

import helpers
from helpers import InterventionError
from helpers.hooks import HEAD, LAYER_IN, LAYER_OUT, MIXER, SSM, hooked


def hook_count(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_each_site_of_a_llama_layer_passes_the_tensor_its_name_says():
    model = tiny_llama()
    layer = model.model.layers[1]
    seen = {}
    with hooked(
        model,
        {
            (site, 1): (lambda x, site=site: seen.__setitem__(site, x.clone()))
            for site in (LAYER_IN, MIXER, HEAD, LAYER_OUT)
        },
    ):
        plain = logits(model, IDS)
    # The mixer is called with hidden_states= (a keyword), the head site positionally.
    torch.testing.assert_close(seen[MIXER], layer.input_layernorm(seen[LAYER_IN]))
    assert seen[HEAD].shape == (*IDS.shape, 4 * 8)
    assert seen[LAYER_OUT].shape == seen[LAYER_IN].shape and not torch.equal(
        seen[LAYER_OUT], seen[LAYER_IN]
    )
    assert torch.equal(plain, logits(model, IDS))


@pytest.mark.parametrize("site", [LAYER_IN, MIXER, HEAD, LAYER_OUT])
def test_an_edit_replaces_the_tensor_at_its_site_and_leaving_restores_the_model(site):
    model = tiny_llama()
    plain = logits(model, IDS)
    with hooked(model, {(site, 2): lambda x: x.clone()}):
        assert torch.equal(logits(model, IDS), plain)  # the same tensor back: the same outputs
    with hooked(model, {(site, 2): lambda x: 3 * x + 1}):
        assert not torch.allclose(logits(model, IDS), plain, atol=1e-4)
    assert hook_count(model) == 0 and torch.equal(logits(model, IDS), plain)


def test_an_error_inside_the_block_still_removes_every_hook():
    model = tiny_llama()
    plain = logits(model, IDS)
    with pytest.raises(RuntimeError, match="inside"):
        with hooked(model, {(HEAD, 0): torch.zeros_like, (LAYER_OUT, 3): torch.zeros_like}):
            raise RuntimeError("inside")
    assert hook_count(model) == 0 and torch.equal(logits(model, IDS), plain)


def test_the_ssm_site_carries_each_ssm_heads_output():
    model = tiny_mamba2()
    adapter = helpers.adapter_for(model)
    seen = {}
    with hooked(adapter, {(SSM, 1): lambda y: seen.__setitem__("y", y)}):
        logits(model, IDS)
    assert seen["y"].shape[-1] == adapter.n_heads(1) * adapter.head_dim(1)


def test_an_unknown_site_or_layer_is_refused_before_any_hook_is_installed():
    model = tiny_llama()
    with pytest.raises(InterventionError, match="the sites are"):
        with hooked(model, {(HEAD, 0): torch.zeros_like, ("heads", 1): torch.zeros_like}):
            pass
    with pytest.raises(InterventionError):
        with hooked(model, {(HEAD, 0): torch.zeros_like, (HEAD, 9): torch.zeros_like}):
            pass
    assert hook_count(model) == 0
