"""Llamba (Cartesia's Llama-3.1 distilled into Mamba-2-style mixers), in pure PyTorch.

Neither PyPI's `cartesia-pytorch` nor transformers has Llamba, and the reference implementation
needs mamba-ssm's CUDA kernels. This module loads the published checkpoints
(`cartesia-ai/Llamba-8B-untied`, `goombalab/Llamba-8B-untied-unaligned`) by their own parameter
names and runs them anywhere: on CPU through a chunked scan written here, on GPU through
mamba-ssm's `mamba_chunk_scan_combined` when it is importable.

The mixer is DiscreteMamba2 (MOHAWK / phi-mamba): `in_proj` gives [x | B | C | z | A_log]; a short
depthwise convolution runs over [x | B | C]; each step decays the state by exp(-softplus(A_log))
per head and adds B_t x_t; the output is C_t . h_t + D x_t, gated by silu(z + z_bias).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from .errors import ConfigError, as_index
from .ssm import segment_sum, wide


class LlambaConfig(PretrainedConfig):
    model_type = "llamba"

    def __init__(
        self,
        vocab_size: int = 128256,
        d_model: int = 4096,
        n_layer: int = 32,
        tie_embeddings: bool = False,
        pad_vocab_size_multiple: int = 8,
        lm_head_bias: bool = False,
        norm_epsilon: float = 1e-5,
        mlp_cfg: dict | None = None,
        ssm_cfg: dict | None = None,
        kept_attention: dict | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # A hybrid that keeps some of its teacher's attention heads beside the mixer (the
        # follow-up's retrieval-aware distillation; `KeptAttention`): {"heads": {layer: n}, the
        # teacher's "head_dim", "rope_theta" and "conv_kernel", and its "conv_layers"}.
        self.kept_attention = kept_attention
        self.vocab_size, self.d_model, self.n_layer = vocab_size, d_model, n_layer
        self.tie_embeddings, self.pad_vocab_size_multiple = tie_embeddings, pad_vocab_size_multiple
        self.lm_head_bias, self.norm_epsilon = lm_head_bias, norm_epsilon
        self.mlp_cfg = {
            "intermediate_size": 14336,
            "bias": False,
            "act_fn": "silu",
            **(mlp_cfg or {}),
        }
        self.ssm_cfg = {
            "d_state": 64,
            "n_v_heads": 32,
            "n_qk_heads": 32,
            "expand": 1,
            "d_conv": 4,
            "chunk_size": 128,
            "activation": "identity",
            "bias": False,
            "conv_bias": True,
            **(ssm_cfg or {}),
        }
        self._check_shapes()

    def _check_shapes(self) -> None:
        """Llamba's own constraints, checked here rather than as a tensor-size error while the
        model is built: each value head is d_inner / n_v_heads channels wide, and the value
        heads share B and C in n_qk_heads groups."""
        ssm = self.ssm_cfg
        for name, value in [
            ("d_model", self.d_model),
            ("n_layer", self.n_layer),
            *(
                (f"ssm_cfg['{k}']", ssm[k])
                for k in ("expand", "n_v_heads", "n_qk_heads", "d_state", "chunk_size")
            ),
        ]:
            if as_index(value) is None or value < 1:
                raise ConfigError(f"Llamba's {name} must be a positive integer, got {value!r}")
        d_inner, v, qk = ssm["expand"] * self.d_model, ssm["n_v_heads"], ssm["n_qk_heads"]
        if d_inner % v:
            valid = [h for h in range(1, d_inner + 1) if d_inner % h == 0]
            raise ConfigError(
                f"Llamba's n_v_heads={v} must divide d_inner = expand * d_model = {d_inner} (each value "
                f"head is d_inner / n_v_heads channels); n_v_heads dividing {d_inner}: {valid}"
            )
        if v % qk:
            raise ConfigError(
                f"Llamba's n_v_heads={v} must be a multiple of n_qk_heads={qk} (value heads share B and "
                f"C in n_qk_heads groups)"
            )

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_size_multiple
        return (self.vocab_size + m - 1) // m * m


def ssd_scan(
    x: torch.Tensor, log_decay: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk: int
) -> torch.Tensor:
    """y_t = C_t . h_t with h_t = exp(log_decay_t) h_{t-1} + B_t x_t^T, per head, in chunks:
    quadratic inside a chunk, a recurrence over chunk states between chunks.
    x [b, T, h, p]; log_decay [b, T, h]; B, C [b, T, h, n] -> y [b, T, h, p]."""
    b, T, h, p = x.shape
    pad = (-T) % chunk
    if pad:
        x, log_decay, B, C = (
            F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, log_decay, B, C)
        )
    nc = x.shape[1] // chunk
    x, B, C = (t.reshape(b, nc, chunk, *t.shape[2:]) for t in (x, B, C))
    a = wide(log_decay).reshape(b, nc, chunk, h).permute(0, 3, 1, 2)  # [b, h, c, l]
    a_cum = a.cumsum(-1)
    # Decays are computed in float32 (see helpers.ssm), then meet x in its own dtype.
    decay = lambda log: torch.exp(log).to(x.dtype)
    y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, decay(segment_sum(a)), x)
    # State at the end of each chunk, from that chunk's inputs only.
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay(a_cum[..., -1:] - a_cum), x)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    carry = decay(segment_sum(F.pad(a_cum[..., -1], (1, 0))))  # [b, h, c+1, c+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", carry, states)[:, :-1]
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, decay(a_cum))
    return y.reshape(b, nc * chunk, h, p)[:, :T]


def ssd_recurrence(x, log_decay, B, C) -> torch.Tensor:
    """The same map as `ssd_scan`, one step at a time (the reference the tests compare with)."""
    b, T, h, p = x.shape
    state = x.new_zeros(b, h, p, B.shape[-1])
    ys = []
    for t in range(T):
        state = (
            torch.exp(log_decay[:, t]).to(x.dtype)[..., None, None] * state
            + x[:, t, :, :, None] * B[:, t, :, None, :]
        )
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, t]))
    return torch.stack(ys, dim=1)


class DiscreteMamba2(nn.Module):
    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        n_qk_heads: int = 32,
        n_v_heads: int = 32,
        d_conv: int = 4,
        expand: int = 1,
        activation: str = "identity",
        bias: bool = False,
        conv_bias: bool = True,
        chunk_size: int = 128,
        **_,
    ):
        super().__init__()
        self.d_inner = expand * d_model
        self.d_state, self.n_qk_heads, self.n_v_heads = d_state, n_qk_heads, n_v_heads
        self.head_dim = self.d_inner // n_v_heads
        self.chunk_size = chunk_size
        if n_v_heads % n_qk_heads or self.d_inner % n_v_heads:
            raise ValueError(
                f"n_v_heads={n_v_heads} must be a multiple of n_qk_heads={n_qk_heads} and divide {self.d_inner}"
            )
        self.in_proj = nn.Linear(
            d_model, 2 * self.d_inner + 2 * n_qk_heads * d_state + n_v_heads, bias=bias
        )
        self.z_bias = nn.Parameter(torch.zeros(self.d_inner)) if not bias else None
        conv_dim = self.d_inner + 2 * n_qk_heads * d_state
        self.conv1d = nn.Conv1d(
            conv_dim, conv_dim, d_conv, groups=conv_dim, padding=d_conv - 1, bias=conv_bias
        )
        self.act = {"identity": nn.Identity(), "silu": nn.SiLU(), "swish": nn.SiLU()}[activation]
        self.D = nn.Parameter(torch.ones(n_v_heads))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)

    def terms(self, u: torch.Tensor) -> dict[str, torch.Tensor]:
        """x [b,T,h,p], B and C [b,T,h,n] (shared by the value heads of a qk head), log_decay
        [b,T,h] = -softplus(A_log), and the gate's z [b,T,d_inner]."""
        T = u.shape[1]
        n, qk = self.d_state, self.n_qk_heads
        xbc, z, a_log = self.in_proj(u).split(
            [self.d_inner + 2 * qk * n, self.d_inner, self.n_v_heads], dim=-1
        )
        xbc = self.act(self.conv1d(xbc.transpose(1, 2))[..., :T].transpose(1, 2))
        x, B, C = xbc.split([self.d_inner, qk * n, qk * n], dim=-1)
        rep = self.n_v_heads // qk
        return dict(
            x=x.unflatten(-1, (self.n_v_heads, self.head_dim)),
            B=B.unflatten(-1, (qk, n)).repeat_interleave(rep, dim=2),
            C=C.unflatten(-1, (qk, n)).repeat_interleave(rep, dim=2),
            log_decay=-F.softplus(wide(a_log)),  # float32 at least: see helpers.ssm
            z=z,
        )

    def gate(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return y * F.silu(z + self.z_bias) if self.z_bias is not None else y * F.silu(z)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        t = self.terms(u)
        y = _kernel_scan(t, self.chunk_size) if u.is_cuda else None
        if y is None:
            y = ssd_scan(t["x"], t["log_decay"], t["B"], t["C"], self.chunk_size)
        y = y + self.D[:, None] * t["x"]
        return self.out_proj(self.gate(y.flatten(-2), t["z"]))


def _kernel_scan(t: dict, chunk: int) -> torch.Tensor | None:
    """mamba-ssm's fused chunked scan, when installed (GPU extra): with dt = softplus(A_log),
    A = -1 and x / dt as input it computes the same map as `ssd_scan`."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError:
        return None
    dt = -t["log_decay"]
    h = dt.shape[-1]
    return mamba_chunk_scan_combined(
        t["x"] / dt[..., None].to(t["x"].dtype),
        dt,
        -torch.ones(h, device=dt.device),
        t["B"],
        t["C"],
        chunk_size=chunk,
    )


class LlambaMLP(nn.Module):
    """Llama's gated MLP, down(act(gate(x)) * up(x)), under the checkpoint's names."""

    def __init__(
        self, d_model: int, intermediate_size: int, bias: bool = False, act_fn: str = "silu", **_
    ):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(d_model, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, d_model, bias=bias)
        self.act = ACT2FN[act_fn]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class KeptAttention(nn.Module):
    """Some of a Llama teacher's attention heads, kept beside a layer's mixer: causal softmax
    attention with the teacher's rotary embedding, its short convolution where the teacher's
    layer has one (`helpers.convllama`), and the kept heads' slices of its projections."""

    def __init__(
        self, d_model: int, n_heads: int, head_dim: int, rope_theta: float, conv_kernel: int = 0
    ):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

        from .convllama import ShortConv

        cfg = LlamaConfig(
            hidden_size=d_model,
            num_attention_heads=n_heads,
            num_key_value_heads=n_heads,
            head_dim=head_dim,
            rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
            attn_implementation="sdpa",
        )
        self.conv = ShortConv(d_model, conv_kernel) if conv_kernel else nn.Identity()
        self.attn = LlamaAttention(cfg, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        x = self.conv(u)
        positions = torch.arange(x.shape[1], device=x.device)[None]
        return self.attn(x, position_embeddings=self.rotary(x, positions), attention_mask=None)[0]


class LlambaBlock(nn.Module):
    def __init__(self, config: LlambaConfig, index: int = 0):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.d_model, eps=1e-5)
        self.mixer = DiscreteMamba2(config.d_model, **config.ssm_cfg)
        self.post_attention_layernorm = LlamaRMSNorm(config.d_model, eps=1e-5)
        self.mlp = LlambaMLP(config.d_model, **config.mlp_cfg)
        kept = config.kept_attention or {}
        n = kept.get("heads", {}).get(str(index), 0)
        # The kept heads' weights come from the teacher: building them leaves the random stream
        # where a plain student's build leaves it, so every hybrid starts from the same mixers.
        with torch.random.fork_rng(devices=[]):
            self.attention = (
                KeptAttention(
                    config.d_model,
                    n,
                    kept["head_dim"],
                    kept["rope_theta"],
                    kept["conv_kernel"] if index in kept["conv_layers"] else 0,
                )
                if n
                else None
            )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        u = self.input_layernorm(hidden)
        mixed = self.mixer(u) if self.attention is None else self.mixer(u) + self.attention(u)
        hidden = hidden + mixed
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlambaBackbone(nn.Module):
    def __init__(self, config: LlambaConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.padded_vocab_size, config.d_model)
        self.layers = nn.ModuleList(LlambaBlock(config, i) for i in range(config.n_layer))
        self.final_layernorm = LlamaRMSNorm(config.d_model, eps=config.norm_epsilon)

    def forward(self, input_ids: torch.Tensor, **_) -> BaseModelOutput:
        hidden = self.embedding(input_ids)
        for layer in self.layers:
            hidden = layer(hidden)
        return BaseModelOutput(last_hidden_state=self.final_layernorm(hidden))


class LlambaForCausalLM(nn.Module):
    """The checkpoint's module tree (`backbone.*`, `lm_head`), with the handful of transformers
    conventions the book relies on (`config`, `base_model`, `get_output_embeddings`)."""

    def __init__(self, config: LlambaConfig):
        super().__init__()
        self.config = config
        self.backbone = LlambaBackbone(config)
        self.lm_head = nn.Linear(config.d_model, config.padded_vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    @property
    def base_model(self) -> LlambaBackbone:
        return self.backbone

    def get_input_embeddings(self) -> nn.Embedding:
        return self.backbone.embedding

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, **_) -> CausalLMOutput:
        return CausalLMOutput(
            logits=self.lm_head(self.backbone(input_ids).last_hidden_state).float()
        )

    @classmethod
    def from_pretrained(
        cls, repo: str, dtype: torch.dtype = torch.bfloat16, revision: str | None = None
    ) -> "LlambaForCausalLM":
        """Load a published checkpoint (a hub id or a local folder) strictly by name. A checkpoint
        with tied embeddings (Llamba-3B) stores the embedding once and no `lm_head.weight`."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
        from safetensors.torch import load_file

        def fetch(name: str) -> Path:
            if Path(repo).is_dir():
                if not (Path(repo) / name).exists():
                    raise FileNotFoundError(Path(repo) / name)
                return Path(repo) / name
            return Path(hf_hub_download(repo, name, revision=revision))

        config = LlambaConfig(**json.loads(fetch("config.json").read_text()))
        with torch.device("meta"):
            model = cls(config)
        try:
            index = json.loads(fetch("model.safetensors.index.json").read_text())
            files = sorted(set(index["weight_map"].values()))
        except (FileNotFoundError, EntryNotFoundError):  # a single-file checkpoint
            files = ["model.safetensors"]
        state = {}
        for name in files:
            state.update(load_file(fetch(name)))
        tied = {"lm_head.weight"} if config.tie_embeddings else set()
        result = model.load_state_dict(
            {k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True
        )
        if set(result.missing_keys) - tied or result.unexpected_keys:
            raise KeyError(
                f"{repo} does not match Llamba's parameter names: missing "
                f"{sorted(set(result.missing_keys) - tied)}, unexpected {sorted(result.unexpected_keys)}"
            )
        if config.tie_embeddings:  # assign=True replaced the embedding: tie the head to the new one
            model.lm_head.weight = model.backbone.embedding.weight
        return model.eval()
