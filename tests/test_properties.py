"""Properties of every intervention over random small architectures of every family the book
runs: transformers' Llama (head counts, grouped-query ratios, odd widths), Mamba and
Falcon-Mamba (channels, channel groups), Mamba-2 (heads, groups), Zamba2 (hybrid positions,
shared blocks), our Llamba (qk and v heads), the toy zoo's conv-Llama; random sequence lengths.

- leaving any intervention, normally or by an exception, restores the model bit for bit;
- an empty intervention is bit-identical to none;
- zeroing heads changes exactly their slices of the output projection's input;
- an SSM head's hidden attention reproduces what its mixer computes.

Hypothesis draws a bounded number of examples per property and family (`EXAMPLES`; many more
with `pytest --slow`).
"""

import math
import os
from contextlib import ExitStack, suppress
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import helpers
from helpers import book
from helpers.adapters import Adapter, MambaAdapter
from helpers.attention import mask_attention, mask_last_row
from helpers.hooks import MIXER, SSM, hooked
from helpers.ssm import mamba1_terms, mamba2_terms

# The settings are fixed when a test is decorated, so `--slow` (tests/conftest.py) reaches this
# module through the environment, set before collection.
EXAMPLES = 300 if os.environ.get("GA_SLOW_TESTS") else 20
settings.register_profile(
    "properties",
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PROPERTIES = settings.get_profile("properties")

VOCAB = 32
FAMILIES = ["llama", "conv_llama", "mamba", "falcon_mamba", "mamba2", "zamba2", "llamba"]
SSM_FAMILIES = ["mamba", "falcon_mamba", "mamba2", "zamba2", "llamba"]


class Arch:
    """A random model and the views of it the interventions take (a plain class: hypothesis
    would print a dataclass field by field, the whole module tree included)."""

    def __init__(
        self, model: torch.nn.Module, heads: Adapter, ssm: Adapter | None, ids: torch.Tensor
    ):
        self.model = model
        self.heads = heads  # attention heads where the family has them, else its SSM heads
        self.ssm = ssm  # the SSM heads (None for attention-only families)
        self.ids = ids  # [batch, T]

    @property
    def T(self) -> int:
        return self.ids.shape[1]

    def __repr__(self) -> str:  # what a falsifying example reports: shapes, not the module tree
        views = [self.heads] + ([self.ssm] if self.ssm not in (None, self.heads) else [])
        heads = "; ".join(
            f"{v.head_kind}s {[v.n_heads(l) for l in v.head_layers()]} x {v.head_dim(v.head_layers()[0])}"
            for v in views
        )
        return (
            f"{type(self.model).__name__}(width {self.heads.width}, layers {self.heads.n_layers}, {heads}, "
            f"ids {list(self.ids.shape)})"
        )


# --- random architectures -------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def llama_config(draw, width: int | None = None, layers: int | None = None) -> dict:
    # transformers wants the width a multiple of the head count, whatever the heads' own width
    heads = draw(
        st.sampled_from([h for h in range(1, 5) if h in divisors(width)] if width else range(1, 5))
    )
    return dict(
        vocab_size=VOCAB,
        hidden_size=width or heads * draw(st.integers(1, 6)),  # odd widths too
        num_hidden_layers=layers or draw(st.integers(1, 3)),
        num_attention_heads=heads,
        num_key_value_heads=draw(st.sampled_from(divisors(heads))),  # every GQA ratio
        head_dim=draw(st.sampled_from([2, 4, 6])),  # rotary needs an even head width
        intermediate_size=draw(st.integers(4, 24)),
        attention_bias=draw(st.booleans()),
    )


def build_llama(draw, width=None, layers=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**llama_config(draw, width, layers)))


def build_conv_llama(draw):
    from helpers.convllama import ConvLlamaConfig, ConvLlamaForCausalLM

    fields = llama_config(draw)
    conv = draw(st.lists(st.integers(0, fields["num_hidden_layers"] - 1), unique=True))
    return ConvLlamaForCausalLM(
        ConvLlamaConfig(conv_kernel=draw(st.integers(2, 4)), conv_layers=conv, **fields)
    )


def build_mamba1(draw, family, width=None, layers=None):
    from transformers import (
        FalconMambaConfig,
        FalconMambaForCausalLM,
        MambaConfig,
        MambaForCausalLM,
    )

    config, model = {
        "mamba": (MambaConfig, MambaForCausalLM),
        "falcon_mamba": (FalconMambaConfig, FalconMambaForCausalLM),
    }[family]
    net = model(
        config(
            vocab_size=VOCAB,
            hidden_size=width or draw(st.integers(2, 12)),
            num_hidden_layers=layers or draw(st.integers(1, 3)),
            expand=draw(st.integers(1, 3)),
            state_size=draw(st.integers(1, 4)),
            conv_kernel=draw(st.integers(2, 4)),
            time_step_rank=draw(st.integers(1, 4)),
            use_mambapy=False,
        )
    )
    with torch.no_grad():  # decays and skips away from the init's near-constant values
        for block in net.backbone.layers:
            block.mixer.D.normal_()
            block.mixer.dt_proj.bias.uniform_(-2, 1)
    return net


def build_mamba2(draw):
    from transformers import Mamba2Config, Mamba2ForCausalLM

    heads, head_dim, expand = (
        draw(st.integers(1, 4)),
        draw(st.integers(1, 4)),
        draw(st.sampled_from([1, 2])),
    )
    if heads * head_dim % expand:
        expand = 1
    net = Mamba2ForCausalLM(
        Mamba2Config(
            vocab_size=VOCAB,
            hidden_size=heads * head_dim // expand,
            expand=expand,
            num_heads=heads,
            head_dim=head_dim,
            n_groups=draw(st.sampled_from(divisors(heads))),
            state_size=draw(st.integers(1, 4)),
            conv_kernel=draw(st.integers(2, 4)),
            chunk_size=draw(st.integers(1, 6)),
            num_hidden_layers=draw(st.integers(1, 3)),
        )
    )
    with torch.no_grad():
        for block in net.backbone.layers:
            randomise_ssd(block.mixer)
    return net


def randomise_ssd(mixer) -> None:
    mixer.A_log.uniform_(-1, 1)
    mixer.dt_bias.uniform_(-2, 1)
    mixer.D.normal_()


def build_zamba2(draw):
    from transformers import Zamba2Config, Zamba2ForCausalLM

    attention, mamba = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    # Attention heads are 2 * hidden / heads wide (even, for rotary), Mamba heads
    # expand * hidden / mamba heads: both counts divide the hidden size.
    hidden = math.lcm(attention, mamba) * draw(st.integers(1, 2))
    kinds = draw(st.lists(st.sampled_from(["mamba", "hybrid"]), min_size=2, max_size=5))
    kinds[draw(st.integers(0, len(kinds) - 1))] = "hybrid"  # at least one attention layer
    net = Zamba2ForCausalLM(
        Zamba2Config(
            vocab_size=VOCAB,
            hidden_size=hidden,
            num_hidden_layers=len(kinds),
            layers_block_type=kinds,
            num_attention_heads=attention,
            n_mamba_heads=mamba,
            mamba_ngroups=draw(st.sampled_from(divisors(mamba))),
            mamba_expand=draw(st.sampled_from([1, 2])),
            mamba_d_state=draw(st.integers(1, 4)),
            intermediate_size=draw(st.integers(4, 16)),
            chunk_size=draw(st.integers(1, 6)),
            num_mem_blocks=draw(st.integers(1, 2)),
            use_mem_rope=draw(st.booleans()),
            use_shared_attention_adapter=draw(st.booleans()),
            adapter_rank=2,
        )
    )
    mamba_view = helpers.adapter_for(net).mamba_heads()
    with torch.no_grad():
        for layer in range(len(kinds)):
            randomise_ssd(mamba_view.mixer(layer))
            mamba_view.mixer(layer).in_proj.weight.normal_(0, 0.3)  # O(1) activations
    return net


def build_llamba(draw, width=None, layers=None):
    from helpers.llamba import LlambaConfig, LlambaForCausalLM

    if width:  # a donor of a given width: value heads that divide it
        v_heads = draw(st.sampled_from(divisors(width)[:4]))
        qk_heads, expand, d_model = draw(st.sampled_from(divisors(v_heads))), 1, width
    else:
        qk_heads, per_qk, head_dim = (
            draw(st.integers(1, 3)),
            draw(st.integers(1, 2)),
            draw(st.integers(1, 4)),
        )
        v_heads = qk_heads * per_qk
        expand = draw(st.sampled_from([e for e in (1, 2) if v_heads * head_dim % e == 0]))
        d_model = v_heads * head_dim // expand
    return LlambaForCausalLM(
        LlambaConfig(
            vocab_size=VOCAB,
            d_model=d_model,
            n_layer=layers or draw(st.integers(1, 3)),
            mlp_cfg={"intermediate_size": draw(st.integers(4, 16))},
            ssm_cfg={
                "d_state": draw(st.integers(1, 4)),
                "n_v_heads": v_heads,
                "n_qk_heads": qk_heads,
                "expand": expand,
                "d_conv": draw(st.integers(2, 4)),
                "chunk_size": draw(st.integers(1, 6)),
                "bias": draw(st.booleans()),
            },
        )
    )


@st.composite
def architectures(draw, family: str) -> Arch:
    torch.manual_seed(draw(st.integers(0, 2**16)))
    if family == "llama":
        model = build_llama(draw)
    elif family == "conv_llama":
        model = build_conv_llama(draw)
    elif family in ("mamba", "falcon_mamba"):
        model = build_mamba1(draw, family)
    else:
        model = {"mamba2": build_mamba2, "zamba2": build_zamba2, "llamba": build_llamba}[family](
            draw
        )
    model.eval()
    adapter = helpers.adapter_for(model)
    if family in ("mamba", "falcon_mamba"):  # a "head" is a group of channels
        adapter = MambaAdapter(
            model, group=draw(st.sampled_from(divisors(model.config.intermediate_size)))
        )
    ssm = (
        adapter.mamba_heads() if family == "zamba2" else adapter if family in SSM_FAMILIES else None
    )
    batch, T = draw(st.integers(1, 2)), draw(st.integers(1, 10))
    ids = torch.randint(
        0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    )
    return Arch(model, adapter, ssm, ids)


def donor_for(draw, arch: Arch) -> torch.nn.Module:
    """A model of another family (or the same) with the host's width and layer count."""
    width, layers = arch.heads.width, arch.heads.n_layers
    family = draw(st.sampled_from(["llama", "llamba", "mamba"]))
    if family == "llama":
        return build_llama(draw, width, layers).eval()
    if family == "llamba":
        return build_llamba(draw, width, layers).eval()
    return build_mamba1(draw, "mamba", width, layers).eval()


# --- random interventions -------------------------------------------------------------------------


def some(draw, values: list) -> list:
    """A random non-empty subset of `values`, in their order."""
    picked = draw(st.sets(st.sampled_from(values), min_size=1, max_size=len(values)))
    return [v for v in values if v in picked]


def head_layers(adapter: Adapter) -> list[int]:
    return [l for l in adapter.head_layers() if adapter.n_heads(l) > 0]


def zeroing(draw, adapter: Adapter) -> dict[int, list[int]]:
    layers = some(draw, head_layers(adapter))
    return {l: some(draw, list(range(adapter.n_heads(l)))) for l in layers}


def random_mask(draw, T: int, n: int | None) -> torch.Tensor:
    """A boolean [T, T] mask, or [n, T, T]: one per head."""
    shape = (T, T) if n is None else (n, T, T)
    size = math.prod(shape)
    return torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size))).view(shape)


def masking(draw, arch: Arch, adapter: Adapter):
    layer = draw(st.sampled_from(head_layers(adapter)))
    heads = some(draw, list(range(adapter.n_heads(layer))))
    per_head = draw(st.booleans())
    return mask_attention(
        adapter, layer, heads, random_mask(draw, arch.T, len(heads) if per_head else None)
    )


def interventions(draw, arch: Arch):
    """One random intervention this architecture takes, as a context manager."""
    adapter = arch.heads
    n = adapter.n_layers
    kinds = ["keep_layers", "prune_top", "swap_layers"]
    kinds += ["zero_heads", "mask_attention"] if head_layers(adapter) else []
    kinds += ["remove_layers"] if n > 1 else []
    kinds += ["mask_last_row"] if any(adapter.is_attention(l) for l in range(n)) else []
    kinds += (
        ["ssm zero_heads", "ssm mask_attention"]
        if arch.ssm not in (None, adapter) and head_layers(arch.ssm)
        else []
    )
    kind = draw(st.sampled_from(kinds))
    if kind == "zero_heads":
        return helpers.zero_heads(adapter, zeroing(draw, adapter))
    if kind == "ssm zero_heads":
        return helpers.zero_heads(arch.ssm, zeroing(draw, arch.ssm))
    if kind == "keep_layers":
        return helpers.keep_layers(adapter, some(draw, list(range(n))))
    if kind == "remove_layers":
        return helpers.remove_layers(adapter, some(draw, list(range(n)))[: n - 1])
    if kind == "prune_top":
        return helpers.prune_top(adapter, draw(st.integers(1, n)))
    if kind == "swap_layers":
        return helpers.swap_layers(adapter, donor_for(draw, arch), some(draw, list(range(n))))
    if kind == "mask_attention":
        return masking(draw, arch, adapter)
    if kind == "ssm mask_attention":
        return masking(draw, arch, arch.ssm)
    return mask_last_row(adapter, arch.T)


# --- what "restored" means ------------------------------------------------------------------------


@torch.inference_mode()
def logits(arch: Arch) -> torch.Tensor:
    return arch.model(arch.ids).logits


def snapshot(arch: Arch) -> dict:
    """Everything an intervention may touch: weights, the block list, hooks, attributes, config."""
    modules = list(arch.model.modules())
    return dict(
        state={k: v.clone() for k, v in arch.model.state_dict().items()},
        layers=[id(block) for block in arch.heads.layers],
        modules=[id(m) for m in modules],
        hooks=[(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in modules],
        attributes=[sorted(k for k in vars(m) if k.startswith("_helpers")) for m in modules],
        attention=getattr(arch.model.config, "_attn_implementation", None),
    )


def assert_restored(arch: Arch, before: dict, plain: torch.Tensor) -> None:
    after = snapshot(arch)
    assert after.keys() == before.keys()
    for key in ("layers", "modules", "hooks", "attributes", "attention"):
        assert after[key] == before[key], key
    assert all(torch.equal(before["state"][k], v) for k, v in after["state"].items())
    assert torch.equal(logits(arch), plain)


class Interrupted(Exception):
    pass


# --- properties -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@PROPERTIES
@given(data=st.data())
def test_every_intervention_restores_the_model_bit_for_bit(family, data):
    """One to three interventions, each made inside the ones before (its indices name layers of
    the model as it then stands), left normally or by an exception."""
    arch = data.draw(architectures(family))
    plain, before = logits(arch), snapshot(arch)
    interrupted = data.draw(st.booleans(), label="interrupted")
    with suppress(Interrupted), ExitStack() as stack:
        for _ in range(data.draw(st.integers(1, 3), label="stacked")):
            stack.enter_context(interventions(data.draw, arch))
            logits(arch)
        if interrupted:
            raise Interrupted
    assert_restored(arch, before, plain)


@pytest.mark.parametrize("family", FAMILIES)
@PROPERTIES
@given(data=st.data())
def test_an_empty_intervention_is_bit_identical_to_none(family, data):
    arch = data.draw(architectures(family))
    plain, before = logits(arch), snapshot(arch)
    adapter = arch.heads
    layer = data.draw(st.sampled_from(head_layers(adapter)))
    empties = [
        helpers.zero_heads(adapter, {}),
        helpers.zero_heads(adapter, {layer: []}),
        mask_attention(adapter, layer, [], torch.ones(arch.T, arch.T, dtype=torch.bool)),
        mask_last_row(adapter, arch.T, layers=[]),
        helpers.swap_layers(adapter, donor_for(data.draw, arch), []),
    ]
    if adapter.n_layers > 1:
        empties.append(helpers.remove_layers(adapter, []))
    with ExitStack() as stack:
        for empty in data.draw(st.permutations(empties))[: data.draw(st.integers(1, len(empties)))]:
            stack.enter_context(empty)
        assert torch.equal(logits(arch), plain)
    assert_restored(arch, before, plain)


def site_input(arch: Arch, site: torch.nn.Module) -> torch.Tensor:
    """What `site` receives, after every pre-hook (a forward hook sees the hooked arguments)."""
    seen = {}
    handle = site.register_forward_hook(lambda m, args, out: seen.update(x=args[0].clone()))
    logits(arch)
    handle.remove()
    return seen["x"]


@pytest.mark.parametrize("family", FAMILIES)
@PROPERTIES
@given(data=st.data())
def test_zeroing_heads_changes_exactly_their_slices_of_the_output_projection_input(family, data):
    arch = data.draw(architectures(family))
    views = [arch.heads] + (
        [arch.ssm] if arch.ssm is not None and arch.ssm is not arch.heads else []
    )
    adapter = data.draw(st.sampled_from(views))
    layer = data.draw(st.sampled_from(head_layers(adapter)))
    heads = some(data.draw, list(range(adapter.n_heads(layer))))
    site, width = adapter.head_site(layer), adapter.head_dim(layer)
    plain = site_input(arch, site)
    with helpers.zero_heads(adapter, {layer: heads}):
        zeroed = site_input(arch, site)
    silenced = torch.zeros(plain.shape[-1], dtype=torch.bool)
    for h in heads:
        silenced[h * width : (h + 1) * width] = True
    assert (
        silenced.sum() == len(heads) * width and plain.shape[-1] == adapter.n_heads(layer) * width
    )
    assert torch.all(zeroed[..., silenced] == 0)
    assert torch.equal(zeroed[..., ~silenced], plain[..., ~silenced])


def mixer_io(arch: Arch, adapter: Adapter, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixer's input u and what it feeds its `ssm_site` (its heads' outputs)."""
    seen = {}
    with hooked(
        adapter,
        {
            (MIXER, layer): partial(seen.__setitem__, "u"),
            (SSM, layer): partial(seen.__setitem__, "y"),
        },
    ):
        logits(arch)
    return seen["u"], seen["y"]


def from_hidden_attention(adapter: Adapter, layer: int, u: torch.Tensor) -> torch.Tensor:
    """y = alpha @ x + D x (gated as the family gates it before `ssm_site`), from the adapter's
    hidden attention alone: [batch, T, channels]."""
    mixer = adapter.mixer(layer)
    if isinstance(adapter, MambaAdapter):  # per channel: alpha of one-channel groups
        t = mamba1_terms(mixer, u)
        alpha = MambaAdapter(adapter.model).hidden_attention(layer, u)
        return (torch.einsum("bcts,bsc->btc", alpha, t["x"]) + mixer.D * t["x"]) * F.silu(t["z"])
    t = mixer.terms(u) if adapter.family == "llamba" else mamba2_terms(mixer, u)
    alpha = adapter.hidden_attention(layer, u)
    y = (
        torch.einsum("bhts,bshp->bthp", alpha, t["x"].to(alpha.dtype)) + mixer.D[:, None] * t["x"]
    ).flatten(-2)
    return mixer.gate(y, t["z"]) if adapter.family == "llamba" else y


@pytest.mark.parametrize("family", SSM_FAMILIES)
@PROPERTIES
@given(data=st.data())
def test_hidden_attention_reproduces_the_mixer(family, data):
    arch = data.draw(architectures(family))
    adapter = arch.ssm
    layer = data.draw(st.sampled_from(head_layers(adapter)))
    u, y = mixer_io(arch, adapter, layer)
    with torch.inference_mode():
        by_hand = from_hidden_attention(adapter, layer, u)
        masked = adapter.masked_heads_output(
            layer, u, list(range(adapter.n_heads(layer))), torch.ones(arch.T, arch.T)
        )
    scale = max(1.0, y.abs().max().item())
    torch.testing.assert_close(
        by_hand.to(y.dtype).reshape(y.shape), y, rtol=1e-4, atol=1e-5 * scale
    )
    torch.testing.assert_close(masked.to(y.dtype).reshape(y.shape), y, rtol=1e-4, atol=1e-5 * scale)


# --- every chapter's Config: random parameters are taken or refused at once ---------------------------

CHAPTERS = [md.stem for md in book.chapters()]  # every chapter of _toc.yml


def parameter_values():
    """What a reader or papermill may pass: numbers of every size and sign, text, lists, heads,
    model names, None (the default)."""
    names = sorted(helpers.MODELS)
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 40),
        st.integers(10**5, 10**13),
        st.floats(-1, 2),
        st.sampled_from(names),
        st.lists(st.sampled_from(names), min_size=1, max_size=2),
        st.text(max_size=4),
        st.lists(st.integers(-2, 120), max_size=4),
        st.sampled_from(["L1H0", "L40H2", [3, -1], [[1, 0]], ["L0H0"], ["L2H1", "L1H0"]]),
        st.sampled_from(["kv", "mmlu", "paper", "repeat", "layer ablation", "none"]),
    )


@pytest.mark.parametrize("name", CHAPTERS)
@settings(
    max_examples=max(10, EXAMPLES // 2),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_chapter_config_takes_or_refuses_random_parameters_at_once(name, data):
    """Either a Config, or a ConfigError naming the parameter, in under a second: never another
    error (a KeyError, a StopIteration, a torch error) and never a config that fails later for
    what it was given (those are the tests of test_validation)."""
    import importlib
    import time

    from helpers import ConfigError
    from helpers.protocol import checks

    chapter = importlib.import_module(f"helpers.experiments.{name}")
    fields = [f for f in chapter.Config.__dataclass_fields__ if f not in ("profile", "smoke")]
    chosen = data.draw(st.lists(st.sampled_from(fields), unique=True, max_size=3), label="fields")
    overrides = {f: data.draw(parameter_values(), label=f) for f in chosen}
    checks.shape("smollm2-135m-instruct")  # read once per process
    start = time.perf_counter()
    try:
        chapter.Config.for_profile("cpu", smoke=True, **overrides)
    except ConfigError as e:
        assert any(f in str(e) for f in chosen) or "profile" in str(e) or "gather" in str(e), str(e)
    assert time.perf_counter() - start < 1
