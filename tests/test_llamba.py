"""Our pure-PyTorch Llamba: the chunked scan, the step-by-step recurrence and the materialised
hidden attention compute the same map, and the model loads a checkpoint by its own names."""

import pytest
import torch

import helpers
from helpers.llamba import LlambaConfig, LlambaForCausalLM, ssd_recurrence, ssd_scan
from helpers.specs import Spec
from helpers.ssm import discrete_hidden_attention


def tiny_config(**ssm):
    return LlambaConfig(
        vocab_size=60,
        d_model=32,
        n_layer=2,
        mlp_cfg={"intermediate_size": 48},
        ssm_cfg={"d_state": 8, "n_v_heads": 4, "n_qk_heads": 2, "chunk_size": 8, **ssm},
    )


def random_terms(T=21, h=3, p=5, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, h, p, generator=g, dtype=torch.float64)
    log_decay = -torch.rand(2, T, h, generator=g, dtype=torch.float64)
    B = torch.randn(2, T, h, n, generator=g, dtype=torch.float64)
    C = torch.randn(2, T, h, n, generator=g, dtype=torch.float64)
    return x, log_decay, B, C


@pytest.mark.parametrize("chunk", [1, 4, 8, 32])
def test_scan_recurrence_and_materialised_form_agree(chunk):
    x, a, B, C = random_terms()
    ref = ssd_recurrence(x, a, B, C)
    torch.testing.assert_close(ssd_scan(x, a, B, C, chunk), ref)
    alpha = discrete_hidden_attention(a, B, C)
    torch.testing.assert_close(torch.einsum("bhts,bshp->bthp", alpha, x), ref)


@torch.inference_mode()
def test_hidden_attention_reproduces_the_mixer():
    torch.manual_seed(0)
    model = LlambaForCausalLM(tiny_config()).eval()
    adapter = helpers.adapter_for(model)
    mixer = adapter.mixer(1)
    with torch.no_grad():
        mixer.D.normal_()
        mixer.z_bias.normal_()
    ids = torch.randint(0, 60, (2, 19))
    seen = {}
    h1 = mixer.register_forward_pre_hook(lambda m, a: seen.update(u=a[0]))
    h2 = mixer.out_proj.register_forward_pre_hook(lambda m, a: seen.update(y=a[0]))
    model(ids)
    h1.remove(), h2.remove()
    t = mixer.terms(seen["u"])
    alpha = adapter.hidden_attention(1, seen["u"])
    y = torch.einsum("bhts,bshp->bthp", alpha, t["x"]) + mixer.D[:, None] * t["x"]
    torch.testing.assert_close(mixer.gate(y.flatten(-2), t["z"]), seen["y"], rtol=1e-4, atol=1e-5)


@torch.inference_mode()
def test_llamba_interventions_restore(tmp_path):
    torch.manual_seed(0)
    model = LlambaForCausalLM(tiny_config()).eval()
    ids = torch.randint(0, 60, (1, 10))
    plain = model(ids).logits
    with helpers.zero_heads(model, {1: [3]}):
        assert not torch.equal(model(ids).logits, plain)
    with helpers.prune_top(model, 1):
        assert not torch.equal(model(ids).logits, plain)
    assert torch.equal(model(ids).logits, plain)
    with pytest.raises(helpers.InterventionError, match="heads 0..3"):
        with helpers.zero_heads(model, {0: [4]}):
            pass


def test_loads_checkpoint_by_its_names(tmp_path):
    import json

    from safetensors.torch import save_file

    torch.manual_seed(0)
    cfg = tiny_config()
    model = LlambaForCausalLM(cfg).eval()
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "vocab_size": 60,
                "d_model": 32,
                "n_layer": 2,
                "mlp_cfg": cfg.mlp_cfg,
                "ssm_cfg": cfg.ssm_cfg,
            }
        )
    )
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "model.safetensors"
    )
    # The checkpoint's names, as the released Llamba uses them.
    names = set(model.state_dict())
    assert {
        "backbone.embedding.weight",
        "backbone.layers.0.mixer.in_proj.weight",
        "backbone.layers.0.mixer.z_bias",
        "backbone.layers.0.mixer.conv1d.weight",
        "backbone.layers.0.mixer.D",
        "backbone.layers.0.mlp.gate_proj.weight",
        "backbone.layers.1.post_attention_layernorm.weight",
        "backbone.final_layernorm.weight",
        "lm_head.weight",
    } <= names
    loaded = LlambaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    ids = torch.randint(0, 60, (1, 9))
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_llamba_8b_shapes_on_meta():
    cfg = helpers.paper_config("llamba-8b")
    with torch.device("meta"):
        model = LlambaForCausalLM(cfg)
    adapter = helpers.adapter_for(model)
    assert adapter.n_layers == 32 and adapter.n_heads(17) == 32 and adapter.head_dim(17) == 128
    assert adapter.check_heads(17, [3, 9]) == [3, 9]
    mixer = adapter.mixer(16)
    assert mixer.in_proj.weight.shape == (2 * 4096 + 2 * 32 * 64 + 32, 4096)


def test_sweep_engine_runs_on_llamba_and_equals_the_plain_scorer():
    """The SSM chapter's paper profile sweeps Llamba's heads with the engine (it used to raise
    AttributeError: LlambaForCausalLM had no get_input_embeddings)."""
    import numpy as np
    from test_engine import CharTokenizer

    from helpers.engine import SweepEngine

    torch.manual_seed(0)
    model = LlambaForCausalLM(tiny_config()).eval()
    items = [
        helpers.Item((("ab:1 cd:2 ab:", "1"), ("ab:1 cd:2 ab:", "2")), 0),
        helpers.Item((("xy", " z"), ("xyw", " z")), 1),
    ]
    engine = SweepEngine(model, CharTokenizer(), items)
    for spec in ("none", "zero L1H2"):
        with Spec.parse(spec).applied(model):
            ref = np.concatenate(helpers.choice_loglikelihoods(model, CharTokenizer(), items))
        np.testing.assert_allclose(engine.loglikelihoods([spec])[0], ref, rtol=0, atol=1e-5)


def test_the_screen_runs_on_llamba():
    """The attribution screen sizes its CPU graph from the adapter (Llamba's config names its
    layers n_layer and its width d_model: the rehearsal's screen once stopped on that), and
    recomputing layer by layer gives the same estimates."""
    from test_engine import CharTokenizer

    from helpers import screen
    from helpers.engine import SweepEngine

    torch.manual_seed(0)
    model = LlambaForCausalLM(tiny_config()).eval()
    assert screen.graph_bytes_per_token(model) == 36 * 4 * 2 * 32
    items = [helpers.Item((("ab:1 cd:2 ab:", "1"), ("ab:1 cd:2 ab:", "2")), 0)]
    engine = SweepEngine(model, CharTokenizer(), items)
    kept, recomputed = (
        screen.attribution(engine, alpha=1.0, progress=False, checkpoint=c) for c in (False, True)
    )
    assert kept == recomputed and len(kept) == sum(engine.adapter.n_heads(l) for l in range(2))
    # the default decides by size
    assert screen.attribution(engine, alpha=1.0, progress=False) == kept


def test_tied_checkpoint_loads_without_a_head_and_ties_it(tmp_path):
    """Llamba-3B stores its embedding once (tie_embeddings): no lm_head.weight in the file."""
    import json

    from safetensors.torch import save_file

    config = tiny_config()
    config.tie_embeddings = True
    torch.manual_seed(0)
    model = LlambaForCausalLM(config)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    loaded = LlambaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    assert loaded.lm_head.weight is loaded.backbone.embedding.weight
    assert torch.equal(loaded.lm_head.weight, model.backbone.embedding.weight)
    (tmp_path / "model.safetensors").unlink()
    save_file(
        {k: v for k, v in state.items() if "mixer.D" not in k}, tmp_path / "model.safetensors"
    )
    with pytest.raises(KeyError, match="missing.*mixer.D"):
        LlambaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
