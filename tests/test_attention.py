"""Attention maps and SSM hidden attention, on SmolLM2 and on tiny random-weight models of the
real transformers classes."""

import pytest
import torch

import helpers
from helpers.attention import attention_maps, mask_attention
from helpers.ssm import mamba1_terms, mamba2_terms, segment_sum


@torch.inference_mode()
def test_attention_maps_equal_eager_attentions(smol, ids):
    maps = attention_maps(smol, ids, [0, 16])
    before = smol.model.config._attn_implementation
    smol.model.set_attn_implementation("eager")
    try:
        eager = smol.model(ids, output_attentions=True).attentions
    finally:
        smol.model.set_attn_implementation(before)
    assert smol.model.config._attn_implementation == before
    for layer in (0, 16):
        torch.testing.assert_close(maps[layer], eager[layer].float(), rtol=0, atol=1e-5)
        torch.testing.assert_close(maps[layer].sum(-1), torch.ones_like(maps[layer][..., 0]))


@torch.inference_mode()
def test_all_true_mask_equals_no_mask_and_restores(smol, ids):
    plain = smol.model(ids).logits
    T = ids.shape[1]
    with mask_attention(smol, 16, [0], torch.ones(T, T, dtype=torch.bool)):
        masked = smol.model(ids).logits
    torch.testing.assert_close(masked, plain, rtol=0, atol=1e-4)
    assert torch.equal(smol.model(ids).logits, plain)


@torch.inference_mode()
def test_mask_restricts_only_the_chosen_head(smol, ids):
    T = ids.shape[1]
    allowed = torch.zeros(T, T, dtype=torch.bool)
    allowed[:, 0] = True  # attend only to the first token
    with mask_attention(smol, 16, [0], allowed):
        p = attention_maps(smol, ids, [16])[16][0]
    assert torch.all(p[0, :, 0] == 1) and torch.all(p[0, :, 1:] == 0)
    assert not torch.all(p[1, 1:, 0] == 1)


def test_mask_attention_bad_input(smol):
    from test_adapters import tiny_zamba2

    with pytest.raises(
        helpers.InterventionError, match=r"Mamba layer without attention.*\[1, 3\].*mamba_heads"
    ):
        with mask_attention(tiny_zamba2(), 2, [0], torch.ones(4, 4)):
            pass
    with pytest.raises(helpers.InterventionError, match="one pattern per head: 2, not 3"):
        with mask_attention(smol, 16, [0, 1], torch.ones(3, 4, 4)):
            pass


def test_segment_sum():
    x = torch.tensor([1.0, 2.0, 3.0])
    s = segment_sum(x)
    assert s[2, 0] == 5 and s[2, 2] == 0 and s[1, 0] == 2 and s[0, 1] == float("-inf")


def tiny_mamba2():
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    cfg = Mamba2Config(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        state_size=8,
        expand=2,
        head_dim=16,
        num_heads=4,
        n_groups=2,
        conv_kernel=4,
        chunk_size=8,
    )
    model = Mamba2ForCausalLM(cfg).eval()
    with torch.no_grad():  # random, not the init's near-zero dt and unit A: make decays visible
        for layer in model.backbone.layers:
            layer.mixer.A_log.uniform_(-1, 1)
            layer.mixer.dt_bias.uniform_(-2, 1)
            layer.mixer.D.normal_()
    return model


@torch.inference_mode()
def test_mamba2_hidden_attention_reproduces_the_mixer():
    """alpha @ x + D x equals the scan output the mixer feeds its gated norm."""
    model = tiny_mamba2()
    adapter = helpers.adapter_for(model)
    ids = torch.randint(0, 50, (2, 21))
    seen = {}
    mixer = adapter.mixer(1)
    h1 = mixer.register_forward_pre_hook(lambda m, a: seen.update(u=a[0]))
    h2 = mixer.norm.register_forward_pre_hook(lambda m, a: seen.update(y=a[0]))
    model(ids)
    h1.remove(), h2.remove()
    terms = mamba2_terms(mixer, seen["u"])
    alpha = adapter.hidden_attention(1, seen["u"])
    y = torch.einsum("bhts,bshp->bthp", alpha, terms["x"]) + mixer.D[:, None] * terms["x"]
    torch.testing.assert_close(y.reshape(seen["y"].shape), seen["y"], rtol=1e-4, atol=1e-5)
    maps = attention_maps(model, ids, [1])
    torch.testing.assert_close(maps[1], alpha)


@torch.inference_mode()
def test_mamba2_zero_head_and_restore():
    model = tiny_mamba2()
    ids = torch.randint(0, 50, (1, 12))
    plain = model(ids).logits
    with helpers.zero_heads(model, {0: []}):
        assert torch.equal(model(ids).logits, plain)
    with helpers.zero_heads(model, {0: [1]}):
        assert not torch.equal(model(ids).logits, plain)
    assert torch.equal(model(ids).logits, plain)
    with pytest.raises(helpers.InterventionError, match="heads 0..3"):
        with helpers.zero_heads(model, {0: [4]}):
            pass


def tiny_mamba1(kind):
    from transformers import (
        FalconMambaConfig,
        FalconMambaForCausalLM,
        MambaConfig,
        MambaForCausalLM,
    )

    config_cls, model_cls = {
        "mamba": (MambaConfig, MambaForCausalLM),
        "falcon_mamba": (FalconMambaConfig, FalconMambaForCausalLM),
    }[kind]
    torch.manual_seed(0)
    cfg = config_cls(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        state_size=4,
        expand=2,
        conv_kernel=4,
        time_step_rank=4,
        use_mambapy=False,
    )
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for layer in model.backbone.layers:
            layer.mixer.D.normal_()
            layer.mixer.dt_proj.bias.uniform_(-2, 1)
    return model


@pytest.mark.parametrize("kind", ["mamba", "falcon_mamba"])
@torch.inference_mode()
def test_mamba1_hidden_attention_reproduces_the_mixer(kind):
    """(alpha @ x + D x) * silu(z) equals what the mixer feeds its out_proj."""
    model = tiny_mamba1(kind)
    adapter = helpers.adapter_for(model)
    ids = torch.randint(0, 50, (2, 13))
    mixer = adapter.mixer(1)
    seen = {}
    h1 = mixer.register_forward_pre_hook(lambda m, a: seen.update(u=a[0]))
    h2 = mixer.out_proj.register_forward_pre_hook(lambda m, a: seen.update(y=a[0]))
    model(ids)
    h1.remove(), h2.remove()
    t = mamba1_terms(mixer, seen["u"])
    alpha = adapter.hidden_attention(1, seen["u"])  # [b, channels, T, T]
    y = (
        torch.einsum("bcts,bsc->btc", alpha, t["x"]) + mixer.D * t["x"]
    ) * torch.nn.functional.silu(t["z"])
    torch.testing.assert_close(y, seen["y"], rtol=1e-4, atol=1e-5)
    grouped = (
        helpers.adapter_for(model)
        .__class__(model, group=4)
        .hidden_attention(1, seen["u"], heads=[1])
    )
    torch.testing.assert_close(grouped[:, 0], alpha[:, 4:8].mean(1))


@torch.inference_mode()
def test_masks_on_two_heads_of_one_layer_compose_and_unwind(smol, ids):
    T = ids.shape[1]
    first = torch.zeros(T, T, dtype=torch.bool)
    first[:, 0] = True
    with mask_attention(smol, 16, [0], first), mask_attention(smol, 16, [1], first):
        p = attention_maps(smol, ids, [16])[16][0]
    assert (
        torch.all(p[0, :, 0] == 1)
        and torch.all(p[1, :, 0] == 1)
        and not torch.all(p[2, 1:, 0] == 1)
    )
    assert not hasattr(smol.adapter.attention(16), "_helpers_allowed")
