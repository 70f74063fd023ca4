"""Every architecture of the paper through one adapter interface: exact 8B shapes on the meta
device, Zamba2's shared attention handled per call site, and the hybrid swap."""

from functools import partial

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import helpers
from helpers.attention import attention_maps, mask_last_row
from helpers.hooks import MIXER, SSM, hooked
from helpers.llamba import LlambaConfig, LlambaForCausalLM
from helpers.ssm import mamba2_terms


@pytest.mark.parametrize(
    "name, family, n_layers, layer, heads, head_dim",
    [
        ("llama-3.1-8b", "llama", 32, 17, 32, 128),
        ("llamba-8b", "llamba", 32, 17, 32, 128),
        ("falcon-mamba-7b", "mamba", 64, 36, 8192, 1),
        ("zamba2-7b", "zamba2", 81, 6, 32, 224),
    ],
)
def test_paper_configs_resolve_every_layer_and_head_on_meta(
    name, family, n_layers, layer, heads, head_dim
):
    cfg = helpers.paper_config(name)
    with torch.device("meta"):
        model = (
            LlambaForCausalLM(cfg)
            if name.startswith("llamba")
            else AutoModelForCausalLM.from_config(cfg)
        )
    adapter = helpers.adapter_for(model)
    assert adapter.family == family and adapter.n_layers == n_layers
    assert (adapter.n_heads(layer), adapter.head_dim(layer)) == (heads, head_dim)
    assert adapter.head_site(layer).in_features == heads * head_dim
    assert all(p.device.type == "meta" for p in model.parameters())
    attention = [l for l in range(n_layers) if adapter.is_attention(l)]
    for l in attention or range(n_layers):
        assert adapter.head_site(l).in_features == adapter.n_heads(l) * adapter.head_dim(l)


def test_falcon_mamba_reported_channels_are_in_range():
    cfg = helpers.paper_config("falcon-mamba-7b")
    with torch.device("meta"):
        adapter = helpers.adapter_for(AutoModelForCausalLM.from_config(cfg))
    assert adapter.check_heads(35, [3186, 5143, 6607, 7305]) and adapter.check_heads(
        36, [1565, 1906, 3873, 4925]
    )


def tiny_zamba2():
    from transformers import Zamba2Config, Zamba2ForCausalLM

    torch.manual_seed(0)
    cfg = Zamba2Config(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=5,
        num_attention_heads=4,
        n_mamba_heads=4,
        mamba_d_state=8,
        mamba_ngroups=1,
        intermediate_size=48,
        chunk_size=8,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid", "mamba"],
        num_mem_blocks=1,
        use_mem_rope=True,
    )
    model = Zamba2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in range(5):
            mixer = helpers.adapter_for(model).mamba_heads().mixer(layer)
            mixer.A_log.uniform_(-1, 1)
            mixer.dt_bias.uniform_(-2, 1)
            mixer.D.normal_()
            # O(1) activations instead of the init's 0.02 scale
            mixer.in_proj.weight.normal_(0, 0.3)
    return model


def tiny_gemma3():
    """Gemma-3's two kinds of layer with a window of 4 positions, so that prompts of a dozen
    tokens differ between them; weights at O(1) so that a head moves the scores."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )
    model = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


@torch.inference_mode()
def test_gemma3_heads_are_the_query_heads_of_both_kinds_of_layer():
    model = tiny_gemma3()
    adapter = helpers.adapter_for(model)
    assert adapter.family == "gemma3" and adapter.n_layers == 3
    assert [adapter.n_heads(l) for l in range(3)] == [4, 4, 4]
    assert (
        adapter.head_dim(1) == 8 and adapter.head_site(1) is model.model.layers[1].self_attn.o_proj
    )
    # a layer run outside the model is the model's own layer, sliding window included
    ids = torch.randint(0, 50, (2, 12))
    out = model.model(input_ids=ids, output_hidden_states=True).hidden_states
    for layer in range(3):
        got = adapter.run_layer(adapter.block(layer), out[layer])
        if layer == 2:  # transformers' last hidden state is after the final norm
            got = adapter.final_norm(got)
        np.testing.assert_allclose(got, out[layer + 1], atol=1e-5)


@torch.inference_mode()
def test_zamba2_mamba_hidden_attention_reproduces_the_mixer():
    model = tiny_zamba2()
    mamba = helpers.adapter_for(model).mamba_heads()
    ids = torch.randint(0, 50, (2, 17))
    for layer in (2, 3):  # a Mamba layer and a hybrid layer's Mamba block
        mixer, seen = mamba.mixer(layer), {}
        with hooked(
            mamba,
            {
                (MIXER, layer): partial(seen.__setitem__, "u"),
                (SSM, layer): partial(seen.__setitem__, "y"),
            },
        ):
            model(ids)
        t = mamba2_terms(mixer, seen["u"])
        y = (
            torch.einsum("bhts,bshp->bthp", mamba.hidden_attention(layer, seen["u"]), t["x"])
            + mixer.D[:, None] * t["x"]
        )
        torch.testing.assert_close(y.reshape(seen["y"].shape), seen["y"], rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_zamba2_zeroing_heads_acts_on_one_call_of_the_shared_block():
    model = tiny_zamba2()
    adapter = helpers.adapter_for(model)
    assert adapter.hybrid_layers == [1, 3]
    # One shared block, two call sites: each layer has its own module, with tied weights.
    assert adapter.attention(1).o_proj is not adapter.attention(3).o_proj
    assert adapter.attention(1).o_proj.weight is adapter.attention(3).o_proj.weight
    ids = torch.randint(0, 50, (1, 9))

    def o_proj_inputs():
        seen = []
        hooks = [
            adapter.head_site(l).register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
            for l in (1, 3)
        ]
        logits = model(ids).logits
        for h in hooks:
            h.remove()
        return seen, logits

    plain, plain_logits = o_proj_inputs()
    with helpers.zero_heads(adapter, {3: [2]}):
        zeroed, logits = o_proj_inputs()
    assert not torch.equal(logits, plain_logits)
    # The first call (layer 1) sees the same input; the second (layer 3) has head 2 silenced, and
    # only it: its other heads change only through what layer 1 and 2 fed them (nothing here).
    assert torch.equal(zeroed[0], plain[0])
    dim = adapter.head_dim(3)
    assert torch.all(zeroed[1][..., 2 * dim : 3 * dim] == 0)
    torch.testing.assert_close(zeroed[1][..., : 2 * dim], plain[1][..., : 2 * dim])
    assert torch.equal(model(ids).logits, plain_logits)
    with pytest.raises(helpers.InterventionError, match=r"attention layers are \[1, 3\]"):
        with helpers.zero_heads(adapter, {2: [0]}):
            pass


@torch.inference_mode()
def test_zamba2_mask_last_row_changes_only_the_final_position():
    model = tiny_zamba2()
    ids = torch.randint(0, 50, (1, 9))
    plain = model(ids).logits
    with mask_last_row(model, ids.shape[1]):
        masked = model(ids).logits
    torch.testing.assert_close(masked[:, :-1], plain[:, :-1], rtol=0, atol=1e-5)
    assert not torch.allclose(masked[:, -1], plain[:, -1])
    assert torch.equal(model(ids).logits, plain)


@torch.inference_mode()
def test_zamba2_attention_maps_per_call_site():
    model = tiny_zamba2()
    ids = torch.randint(0, 50, (1, 7))
    maps = attention_maps(model, ids, [1, 3, 2])
    assert maps[1].shape == maps[3].shape == (1, 4, 7, 7)
    assert not torch.allclose(maps[1], maps[3])  # same weights, different inputs
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(1, 4, 7))
    assert maps[2].shape == (1, 4, 7, 7)  # hidden attention of the Mamba layer


def tiny_pair():
    """A tiny Llama (the teacher) and a tiny Llamba (the student) of the same width."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    teacher = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=60,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    student = LlambaForCausalLM(
        LlambaConfig(
            vocab_size=60,
            d_model=32,
            n_layer=3,
            mlp_cfg={"intermediate_size": 48},
            ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 4, "chunk_size": 8},
        )
    ).eval()
    return teacher, student


@torch.inference_mode()
def test_swap_runs_the_teachers_layer_inside_the_student_and_restores_both():
    teacher, student = tiny_pair()
    ids = torch.randint(0, 60, (2, 11))
    student_plain, teacher_plain = student(ids).logits, teacher(ids).logits
    with helpers.swap_layers(student, teacher, [1]):
        swapped = student(ids).logits
    # By hand: student layer 0, teacher layer 1 (with its rotary embeddings, causal), student layer 2.
    s = student.backbone
    h = s.layers[0](s.embedding(ids))
    seen = {}
    hook = teacher.model.layers[1].register_forward_hook(lambda m, a, out: seen.update(h=out))
    with helpers.keep_layers(teacher, [1]):  # the teacher's own forward runs its layer 1 on h
        teacher.model(inputs_embeds=h)
    hook.remove()
    by_hand = student.lm_head(s.final_layernorm(s.layers[2](seen["h"]))).float()
    torch.testing.assert_close(swapped, by_hand, rtol=1e-5, atol=1e-5)
    assert torch.equal(student(ids).logits, student_plain) and torch.equal(
        teacher(ids).logits, teacher_plain
    )
    assert all(type(l).__name__ == "LlambaBlock" for l in student.backbone.layers)


def test_swap_rejects_mismatched_width():
    teacher, _ = tiny_pair()
    other = LlambaForCausalLM(
        LlambaConfig(
            vocab_size=60,
            d_model=16,
            n_layer=3,
            mlp_cfg={"intermediate_size": 48},
            ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 4},
        )
    )
    with pytest.raises(helpers.InterventionError, match="width 16 .* and 32"):
        with helpers.swap_layers(other, teacher, [1]):
            pass


def ssm_models():
    from test_attention import tiny_mamba1, tiny_mamba2

    torch.manual_seed(0)
    llamba = LlambaForCausalLM(
        LlambaConfig(
            vocab_size=50,
            d_model=32,
            n_layer=2,
            mlp_cfg={"intermediate_size": 48},
            ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 2, "chunk_size": 8},
        )
    )
    return {
        "mamba2": tiny_mamba2(),
        "mamba": tiny_mamba1("mamba"),
        "falcon_mamba": tiny_mamba1("falcon_mamba"),
        "llamba": llamba.eval(),
        "zamba2-mamba": helpers.adapter_for(tiny_zamba2()).mamba_heads(),
    }


@pytest.mark.parametrize("kind", ["mamba2", "mamba", "falcon_mamba", "llamba", "zamba2-mamba"])
@torch.inference_mode()
def test_ssm_masking_through_hidden_attention(kind):
    model = ssm_models()[kind]
    adapter = model if isinstance(model, helpers.Adapter) else helpers.adapter_for(model)
    net = adapter.model
    ids = torch.randint(0, 50, (2, 12))
    T = ids.shape[1]
    plain = net(ids).logits
    # All-ones: the materialised form reproduces the scan, so nothing changes (to float tolerance).
    with helpers.mask_attention(adapter, 1, [0, 1], torch.ones(T, T)):
        torch.testing.assert_close(net(ids).logits, plain, rtol=1e-4, atol=1e-5)
    # Diagonal only: head 1 reads nothing but its own position; other heads are untouched.
    site, dim = adapter.ssm_site(1), adapter.head_dim(1)

    def site_input():
        seen = {}
        h = site.register_forward_pre_hook(lambda m, a: seen.update(y=a[0].clone()))
        net(ids)
        h.remove()
        return seen["y"]

    before = site_input()
    with helpers.mask_attention(adapter, 1, [1], torch.eye(T)):
        after = site_input()
    assert torch.equal(after[..., :dim], before[..., :dim]) and torch.equal(
        after[..., 2 * dim :], before[..., 2 * dim :]
    )
    assert not torch.allclose(after[..., dim : 2 * dim], before[..., dim : 2 * dim], atol=1e-6)
    assert torch.equal(net(ids).logits, plain)
    # The head's output is affine in the mask: f(ones) + f(zeros) = f(eye) + f(ones - eye).
    seen = {}
    with hooked(adapter, {(MIXER, 1): partial(seen.__setitem__, "u")}):
        net(ids)
    f = lambda m: adapter.masked_heads_output(1, seen["u"], [1], m)
    ones, eye = torch.ones(T, T), torch.eye(T)
    torch.testing.assert_close(f(ones) + f(ones * 0), f(eye) + f(ones - eye), rtol=1e-4, atol=1e-5)
