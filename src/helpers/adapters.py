"""One adapter per architecture: where the layers are, what a "head" is, and where each head's
output enters the layer's output projection. Interventions and attention maps only talk to
adapters, so adding an architecture means adding one class here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from . import ssm
from .errors import InterventionError, as_index


class Adapter:
    family = "?"
    head_kind = "head"  # what one unit of `zero_heads` is called for this family

    def __init__(self, model: nn.Module):
        self.model = model

    # --- layers -----------------------------------------------------------------------------------
    @property
    def layer_owner(self) -> nn.Module:
        """The module whose `layers` attribute holds the block list."""
        return self.model.base_model

    @property
    def layers(self) -> nn.ModuleList:
        return self.layer_owner.layers

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def subset(self, indices: list[int]) -> nn.ModuleList:
        """A block list holding only these layers, in order (layer pruning and removal)."""
        return nn.ModuleList([self.layers[i] for i in indices])

    @property
    def final_norm(self) -> nn.Module:
        """The norm between the last layer and the unembedding."""
        raise NotImplementedError

    @staticmethod
    def layer_output(output) -> torch.Tensor:
        """The residual stream a layer's forward returns (some return tuples)."""
        return output if isinstance(output, torch.Tensor) else output[0]

    @property
    def width(self) -> int:
        """The residual stream's width."""
        return self.final_norm.weight.shape[0]

    # Whether `run_layer` honours `positions` and `allowed`, so that several continuations of one
    # context can share a row (attention models); recurrent mixers read the row in order.
    packs_candidates = False
    # Whether `run_layer` needs the rows' token embeddings beside the stream (Zamba2's hybrid
    # layers); the engine makes them only then.
    reads_embeddings = False

    def run_layer(
        self,
        block: nn.Module,
        hidden: torch.Tensor,
        positions: torch.Tensor | None = None,
        allowed: torch.Tensor | None = None,
        embeddings: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run one of this family's blocks on a residual stream, outside its own model (a
        transplanted layer in `swap_layers`, the layers above an ablation in `engine`).
        Attention families also take token `positions` [rows, T] and which keys each query may
        read, `allowed` [rows, T, T] (default: causal). Hybrid layers that read the token
        embeddings again beside the stream (Zamba2) take them as `embeddings` [rows, T, width]."""
        if allowed is not None:
            raise InterventionError(
                f"{self.family} layers read their input in order; they cannot take a packed mask"
            )
        return self.layer_output(block(hidden))

    def check_layer(self, layer: int) -> int:
        """The layer as a Python int, if this view of the model has it."""
        index = as_index(layer)
        if index is None or not 0 <= index < self.n_layers:
            problem = (
                "is out of range" if index is not None else "is not a layer index (an integer)"
            )
            raise InterventionError(
                f"layer {layer!r} {problem}: this {self.family} model has layers 0..{self.n_layers - 1}"
            )
        return index

    def check_layers(self, layers, what: str, increasing: bool = True) -> list[int]:
        """A list of layers as Python ints, each in range and none twice. With `increasing`, also
        in increasing order: an intervention on several layers runs them in the model's own
        order, so a list in another order would not mean what it says."""
        given = _as_list(layers)
        if given is None:  # a bare 5 too: keep_layers(model, 5) could mean layer 5 or 5 layers
            hint = f" (for one layer write [{layers}])" if as_index(layers) is not None else ""
            raise InterventionError(f"{what} takes a list of layer indices, got {layers!r}{hint}")
        checked = [self.check_layer(l) for l in given]
        twice = sorted({l for l in checked if checked.count(l) > 1})
        if twice:
            raise InterventionError(f"{what}: layer(s) {twice} listed more than once in {given}")
        if increasing and checked != sorted(checked):
            raise InterventionError(
                f"{what} takes layers in increasing order (they run in the model's order): "
                f"got {given}, write {sorted(checked)}"
            )
        return checked

    def _slot(self, layer: int) -> nn.Module:
        """What sits at this position of the block list (past Zamba2's index keeper)."""
        block = self.layers[self.check_layer(layer)]
        return block.layer if isinstance(block, OwnIndex) else block

    def donor_of(self, layer: int) -> "Adapter | None":
        """The adapter of the model this layer is swapped in from (`swap_layers`), else None."""
        donor = getattr(self._slot(layer), "donor", None)
        return donor if isinstance(donor, Adapter) else None

    def block(self, layer: int) -> nn.Module:
        """The layer's block, as this family builds it. A layer swapped in from another model is
        that model's block: its heads are reached through the donor's adapter."""
        donor = self.donor_of(layer)
        if donor is not None:
            raise InterventionError(
                f"layer {layer} of this {self.family} model is swapped in from a {donor.family} "
                f"model (swap_layers): reach its heads through that model's adapter"
            )
        return self._slot(layer)

    # --- heads ------------------------------------------------------------------------------------
    def n_heads(self, layer: int) -> int:
        raise NotImplementedError

    def head_dim(self, layer: int) -> int:
        raise NotImplementedError

    def head_site(self, layer: int) -> nn.Linear:
        """The linear map whose input is the concatenation of the layer's head outputs."""
        raise NotImplementedError

    def is_attention(self, layer: int) -> bool:
        """Whether the layer mixes with softmax attention (else an SSM mixer)."""
        return False

    def attention(self, layer: int) -> nn.Module:
        raise InterventionError(
            f"layer {layer} of this {self.family} model has no attention module"
        )

    def mixer(self, layer: int) -> nn.Module:
        """The sequence mixer of the layer (attention or SSM)."""
        raise NotImplementedError

    def hidden_attention(self, layer: int, mixer_input: torch.Tensor) -> torch.Tensor:
        """alpha [batch, heads, T, T] of an SSM layer's heads, given the mixer's input."""
        raise InterventionError(
            f"this {self.family} model has no hidden attention for layer {layer}"
        )

    def ssm_site(self, layer: int) -> nn.Module:
        """The module whose input carries each SSM head's output, in head order, `head_dim`
        channels per head (where `masked_heads_output` is written back)."""
        raise InterventionError(f"this {self.family} model has no SSM heads in layer {layer}")

    def masked_heads_output(
        self, layer: int, mixer_input: torch.Tensor, heads: list[int], allowed: torch.Tensor
    ) -> torch.Tensor:
        """What `ssm_site` receives for these heads [batch, T, heads * head_dim] when their
        hidden attention is multiplied by `allowed` ([T, T] or [heads, T, T])."""
        return self.masked_mixer_output(self.mixer(layer), mixer_input, heads, allowed)

    def masked_mixer_output(
        self, mixer: nn.Module, mixer_input: torch.Tensor, heads: list[int], allowed: torch.Tensor
    ) -> torch.Tensor:
        """`masked_heads_output` of the layer this mixer belongs to. `mask_attention` finds the
        mixer once, on entry, so that layers removed inside its block do not move it."""
        raise InterventionError(f"this {self.family} model has no hidden attention")

    def head_layers(self) -> list[int]:
        """The layers that have heads in this view of the model (not those swapped in)."""
        return [l for l in range(self.n_layers) if self.donor_of(l) is None]

    def check_heads(self, layer: int, heads) -> list[int]:
        """The heads of one layer as Python ints, in the order given: one head index or a list of
        them, each in range and none twice. An empty list is valid (nothing to do) and asks
        nothing of the layer beyond its index."""
        layer = self.check_layer(layer)
        listed = [heads] if as_index(heads) is not None else _as_list(heads)
        if listed is None:
            raise InterventionError(
                f"the {self.head_kind}s of layer {layer} are a {self.head_kind} index or a list "
                f"of them, got {heads!r}"
            )
        if not listed:
            return []
        n = self.n_heads(layer)
        indices = [as_index(h) for h in listed]
        bad = [h for h, i in zip(listed, indices) if i is None or not 0 <= i < n]
        if bad:
            problem = (
                "out of range"
                if all(as_index(h) is not None for h in bad)
                else "not valid (indices are integers)"
            )
            raise InterventionError(
                f"{self.head_kind} {bad} {problem}: layer {layer} of this {self.family} model has "
                f"{self.head_kind}s 0..{n - 1}"
            )
        twice = sorted({i for i in indices if indices.count(i) > 1})
        if twice:
            raise InterventionError(
                f"{self.head_kind}(s) {twice} of layer {layer} listed more than once"
            )
        return indices


def causal(rows: int, T: int, device) -> torch.Tensor:
    """[rows, T, T]: each query reads its own and earlier positions."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril().expand(rows, T, T)


def positions_and_mask(
    hidden: torch.Tensor, positions: torch.Tensor | None, allowed: torch.Tensor | None
):
    """Token positions [rows, T] (default 0..T-1) and the additive attention mask [rows, 1, T, T]
    that `allowed` gives (default causal): eager, SDPA and our own attention function all read an
    additive mask the same way."""
    R, T = hidden.shape[:2]
    if positions is None:
        positions = torch.arange(T, device=hidden.device).expand(R, T)
    if allowed is None:
        allowed = causal(R, T, hidden.device)
    mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
    return positions, mask.masked_fill(~allowed, torch.finfo(hidden.dtype).min)[:, None]


class LlamaAdapter(Adapter):
    """Llama-family attention (SmolLM2, Llama-3.1): heads are the query heads (grouped-query
    attention shares K/V, but each query head writes its own slice of `o_proj`'s input)."""

    family = "llama"

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.norm

    def is_attention(self, layer: int) -> bool:
        return self.donor_of(layer) is None

    def attention(self, layer: int) -> nn.Module:
        return self.block(layer).self_attn

    mixer = attention

    packs_candidates = True

    def run_layer(self, block, hidden, positions=None, allowed=None, embeddings=None):
        # A Llama block needs its model's rotary embeddings and an explicit mask.
        positions, mask, rotary = self.layer_inputs(
            block, self.pass_inputs(hidden, positions, allowed)
        )
        return self.layer_output(
            block(hidden, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
        )

    def new_pass(self, hidden, positions, allowed):
        """What every layer of a pass reads: (positions, additive mask, rotary embeddings)."""
        full, mask = positions_and_mask(hidden, positions, allowed)
        return full, mask, self.model.base_model.rotary_emb(hidden, position_ids=full)

    def layer_inputs(self, block, inputs):
        """The part of a pass's inputs (`new_pass`) this block reads: all of them."""
        return inputs

    def pass_inputs(self, hidden, positions, allowed):
        """What every layer of one pass reads (`new_pass`): made once per pass, not per layer
        (measured alone, a clean pass of 4 KV prompts on Qwen-1.5B ran 1.2x faster;
        `benchmarks/small_sets.py`). A pass hands each layer the same `positions` and `allowed`
        objects; the last pass's are kept with them, so that the same objects (and the same
        stream shape, dtype and grad mode) mean the same inputs."""
        key = (
            hidden.shape[:2],
            hidden.dtype,
            hidden.device,
            torch.is_inference_mode_enabled(),
            torch.is_grad_enabled(),
        )
        last = getattr(self, "_pass", None)
        if last is None or last[0] is not positions or last[1] is not allowed or last[2] != key:
            self._pass = (positions, allowed, key, self.new_pass(hidden, positions, allowed))
        return self._pass[3]

    def n_heads(self, layer: int) -> int:
        self.attention(layer)  # a layer swapped in from another model says so
        return self.model.config.num_attention_heads

    def head_dim(self, layer: int) -> int:
        return self.attention(layer).head_dim

    def head_site(self, layer: int) -> nn.Linear:
        return self.attention(layer).o_proj


class Gemma3Adapter(LlamaAdapter):
    """Gemma-3 attention: Llama's head site (`o_proj`, the query heads' outputs side by side;
    the 270M shares one K/V head among its 4), and two kinds of layer (`config.layer_types`):
    most attend only to the last `sliding_window` positions, with their own rotary base, and every
    sixth attends to all of them. Its blocks normalise around the mixer and the MLP as well as
    before them, inside the block, so a block runs as a Llama block does."""

    family = "gemma3"

    def new_pass(self, hidden, positions, allowed):
        R, T = hidden.shape[:2]
        if positions is None:
            positions = torch.arange(T, device=hidden.device).expand(R, T)
        if allowed is None:
            allowed = causal(R, T, hidden.device)
        config = self.model.config
        # a query reads a key at most `sliding_window - 1` positions back (transformers' rule)
        recent = positions[:, :, None] - positions[:, None, :] < config.sliding_window
        inputs = {}
        for kind in set(config.layer_types):
            kept = allowed & recent if kind == "sliding_attention" else allowed
            _, mask = positions_and_mask(hidden, positions, kept)
            rotary = self.model.base_model.rotary_emb(hidden, positions, kind)
            inputs[kind] = (positions, mask, rotary)
        return inputs

    def layer_inputs(self, block, inputs):
        return inputs[block.self_attn.layer_type]


class ConvLlamaAdapter(LlamaAdapter):
    """The toy zoo's Transformer (`helpers.convllama`): a Llama whose attention reads a short
    causal convolution of its input, so its rows are read in order and cannot be packed."""

    family = "conv_llama"
    packs_candidates = False


class SSMAdapter(Adapter):
    """A stack of `backbone.layers[i].mixer` blocks under a final `norm_f` (transformers' Mamba
    families), heads zeroed where they enter the mixer's `out_proj`."""

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.norm_f

    def mixer(self, layer: int) -> nn.Module:
        return self.block(layer).mixer

    def head_site(self, layer: int) -> nn.Linear:
        return self.mixer(layer).out_proj


class Mamba2Adapter(SSMAdapter):
    """Mamba-2 (transformers `Mamba2ForCausalLM`): heads of `head_dim` channels, zeroed after the
    gated norm, where they enter `out_proj`."""

    family = "mamba2"

    def n_heads(self, layer: int) -> int:
        return self.mixer(layer).num_heads

    def head_dim(self, layer: int) -> int:
        return self.mixer(layer).head_dim

    def _terms_and_alpha(self, mixer: nn.Module, mixer_input: torch.Tensor):
        t = ssm.mamba2_terms(mixer, mixer_input)
        return t, ssm.ssd_hidden_attention(t["C"], t["B"], t["dt"], t["A"])

    def hidden_attention(self, layer: int, mixer_input: torch.Tensor) -> torch.Tensor:
        return self._terms_and_alpha(self.mixer(layer), mixer_input)[1]

    def ssm_site(self, layer: int) -> nn.Module:
        return self.mixer(layer).norm  # the gated norm's input: the scan output plus D x

    def masked_mixer_output(self, mixer, mixer_input, heads, allowed):
        t, alpha = self._terms_and_alpha(mixer, mixer_input)
        x = t["x"][:, :, heads].to(alpha.dtype)  # alpha is float32 at least (see helpers.ssm)
        alpha = alpha[:, heads] * allowed.to(x.dtype)
        return (
            torch.einsum("bhts,bshp->bthp", alpha, x) + mixer.D[heads, None].to(x.dtype) * x
        ).flatten(-2)


class MambaAdapter(SSMAdapter):
    """Mamba-1 and Falcon-Mamba (transformers `MambaForCausalLM`, `FalconMambaForCausalLM`):
    every inner channel is its own SSM, so a "head" is one channel (width 1), as in the released
    code; `group` > 1 treats consecutive channels as one head."""

    family = "mamba"
    head_kind = "channel"

    def __init__(self, model: nn.Module, group: int = 1):
        super().__init__(model)
        channels = model.config.intermediate_size
        size = as_index(group)
        if size is None or size < 1 or channels % size:
            divisors = [d for d in range(1, channels + 1) if channels % d == 0]
            raise InterventionError(
                f"group={group!r}: a channel group must divide this {self.family} model's "
                f"{channels} channels per layer; valid groups: {divisors}"
            )
        self.group = size
        if size > 1:
            self.head_kind = "channel group"

    def n_heads(self, layer: int) -> int:
        return self.mixer(layer).intermediate_size // self.group

    def head_dim(self, layer: int) -> int:
        return self.group

    def hidden_attention(self, layer: int, mixer_input: torch.Tensor, heads=None) -> torch.Tensor:
        t = ssm.mamba1_terms(self.mixer(layer), mixer_input)
        heads = self.check_heads(layer, range(self.n_heads(layer)) if heads is None else heads)
        channels = [h * self.group + i for h in heads for i in range(self.group)]
        alpha = ssm.mamba1_hidden_attention(t["C"], t["B"], t["dt"], t["A"], channels)
        # A channel group's map is the mean of its channels' maps.
        return alpha.unflatten(1, (len(heads), self.group)).mean(2)

    def ssm_site(self, layer: int) -> nn.Module:
        return self.mixer(layer).out_proj  # the gated scan output

    def masked_mixer_output(self, mixer, mixer_input, heads, allowed):
        t = ssm.mamba1_terms(mixer, mixer_input)
        channels = [h * self.group + i for h in heads for i in range(self.group)]
        alpha = ssm.mamba1_hidden_attention(t["C"], t["B"], t["dt"], t["A"], channels)
        if allowed.dim() == 3:  # one pattern per head: repeat it over the head's channels
            allowed = allowed.repeat_interleave(self.group, dim=0)
        x = t["x"][..., channels].to(alpha.dtype)  # alpha is float32 at least (see helpers.ssm)
        y = (
            torch.einsum("bcts,bsc->btc", alpha * allowed.to(x.dtype), x)
            + mixer.D[channels].to(x.dtype) * x
        )
        return y * torch.nn.functional.silu(t["z"][..., channels].to(x.dtype))


class LlambaAdapter(Mamba2Adapter):
    """Llamba (our `helpers.llamba`): DiscreteMamba2 heads, zeroed where they enter `out_proj`
    (after the gate, as for Mamba-2)."""

    family = "llamba"

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.final_layernorm

    def n_heads(self, layer: int) -> int:
        return self.mixer(layer).n_v_heads

    def _terms_and_alpha(self, mixer: nn.Module, mixer_input: torch.Tensor):
        t = mixer.terms(mixer_input)
        return t, ssm.discrete_hidden_attention(t["log_decay"], t["B"], t["C"])

    def ssm_site(self, layer: int) -> nn.Module:
        return self.mixer(layer).out_proj  # the gated output, y * silu(z + z_bias)

    def masked_mixer_output(self, mixer, mixer_input, heads, allowed):
        t, alpha = self._terms_and_alpha(mixer, mixer_input)
        x = t["x"][:, :, heads].to(alpha.dtype)  # alpha is float32 at least (see helpers.ssm)
        alpha = alpha[:, heads] * allowed.to(x.dtype)
        y = torch.einsum("bhts,bshp->bthp", alpha, x) + mixer.D[heads, None].to(x.dtype) * x
        channels = torch.arange(mixer.d_inner).view(-1, mixer.head_dim)[heads].flatten()
        z = t["z"][..., channels] + (mixer.z_bias[channels] if mixer.z_bias is not None else 0)
        return y.flatten(-2) * torch.nn.functional.silu(z.to(x.dtype))


class Zamba2Adapter(Mamba2Adapter):
    """Zamba2 (transformers `Zamba2ForCausalLM`), attention view: the heads of a hybrid layer are
    the heads of the shared attention block it calls. Each hybrid layer holds its own copy of
    the block module with the shared (tied) weights, so hooks on that copy act on this layer's
    call only and no weight is ever edited. Its Mamba-2 heads are in `mamba_heads()`."""

    family = "zamba2"
    reads_embeddings = True

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.final_layernorm

    @property
    def hybrid_layers(self) -> list[int]:
        """The hybrid layers' positions in the block list as it stands (with layers removed, a
        hybrid layer's position, not its index in the full model)."""
        return [l for l in range(self.n_layers) if self.is_attention(l)]

    def is_attention(self, layer: int) -> bool:
        # this layer alone: a forward pass asks it of every hybrid layer it runs
        return self.donor_of(layer) is None and hasattr(self.block(layer), "shared_transformer")

    def attention(self, layer: int) -> nn.Module:
        if not self.is_attention(layer):
            self.block(layer)  # a swapped-in layer says so
            raise InterventionError(
                f"layer {layer} of this zamba2 model is a Mamba layer without attention; its attention "
                f"layers are {self.hybrid_layers}; for its Mamba heads use adapter.mamba_heads()"
            )
        return self.block(layer).shared_transformer.self_attn

    def run_layer(self, block, hidden, positions=None, allowed=None, embeddings=None):
        # Every Zamba2 layer takes the model's arguments in its order: the stream, the token
        # embeddings (a hybrid layer's shared block reads them beside the stream), its own index
        # (which picks the shared block's per-layer adapters), the Mamba and attention masks.
        if allowed is not None:
            raise InterventionError(
                "zamba2 layers read their input in order; they cannot take a packed mask"
            )
        # a Mamba layer needs none
        index = next((i for i, b in enumerate(self.layers) if b is block), None)
        if hasattr(getattr(block, "layer", block), "shared_transformer") and (
            embeddings is None or index is None
        ):
            raise InterventionError(
                "a zamba2 hybrid layer reads the token embeddings beside the stream and its "
                "shared block's adapters by its index: it runs only within its own model "
                "(its Mamba layers can be transplanted)"
            )
        positions, mask = positions_and_mask(hidden, positions, None)
        rotary = (
            self.model.base_model.rotary_emb(hidden, position_ids=positions)
            if self.model.config.use_mem_rope
            else None
        )
        return self.layer_output(
            block(
                hidden,
                embeddings,
                index,
                None,
                mask,
                position_embeddings=rotary,
                position_ids=positions,
            )
        )

    def mixer(self, layer: int) -> nn.Module:
        block = self.block(layer)  # a hybrid layer runs its Mamba block after the shared attention
        return block.mamba_decoder.mamba if hasattr(block, "mamba_decoder") else block.mamba

    def n_heads(self, layer: int) -> int:
        self.attention(layer)  # a layer swapped in from another model says so
        return self.model.config.num_attention_heads

    def head_dim(self, layer: int) -> int:
        return self.attention(layer).head_dim

    def head_site(self, layer: int) -> nn.Linear:
        return self.attention(layer).o_proj

    def head_layers(self) -> list[int]:
        return self.hybrid_layers

    def subset(self, indices: list[int]) -> nn.ModuleList:
        # transformers passes each layer its position in the block list, and a hybrid layer looks
        # its shared block's adapters and cache slot up by it: keep each layer's own index (the
        # full model's, when the list is already a subset).
        return nn.ModuleList(
            [
                self.layers[i]
                if isinstance(self.layers[i], OwnIndex)
                else OwnIndex(self.layers[i], i)
                for i in indices
            ]
        )

    def mamba_heads(self) -> "Zamba2MambaAdapter":
        return Zamba2MambaAdapter(self.model)


class OwnIndex(nn.Module):
    """A Zamba2 layer that is told its own index, whatever position its block list gives it."""

    def __init__(self, layer: nn.Module, index: int):
        super().__init__()
        self.layer, self.index = layer, index

    def forward(self, hidden_states, original_hidden_states, layer_idx, *args, **kwargs):
        return self.layer(hidden_states, original_hidden_states, self.index, *args, **kwargs)


class Zamba2MambaAdapter(Zamba2Adapter):
    """Zamba2, Mamba view: the Mamba-2 heads of every layer (hybrid layers included)."""

    def is_attention(self, layer: int) -> bool:
        return False

    head_layers = Adapter.head_layers
    n_heads = Mamba2Adapter.n_heads
    head_dim = Mamba2Adapter.head_dim
    head_site = Mamba2Adapter.head_site


ADAPTERS: dict[str, type[Adapter]] = {
    "zamba2": Zamba2Adapter,
    "llamba": LlambaAdapter,
    "llama": LlamaAdapter,
    "qwen2": LlamaAdapter,  # a Llama with biases on q, k, v: the same blocks and head site
    "gemma3_text": Gemma3Adapter,
    "conv_llama": ConvLlamaAdapter,
    "mamba2": Mamba2Adapter,
    "mamba": MambaAdapter,
    "falcon_mamba": MambaAdapter,
}


def adapter_for(model: nn.Module) -> Adapter:
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in ADAPTERS:
        raise InterventionError(
            f"no adapter for model_type {kind!r}; known: {', '.join(sorted(ADAPTERS))}"
        )
    return ADAPTERS[kind](model)


def unwrap(model_or_loaded) -> tuple[nn.Module, Adapter]:
    """Accept a `Loaded` bundle, an adapter, or a bare model."""
    if isinstance(model_or_loaded, Adapter):
        return model_or_loaded.model, model_or_loaded
    adapter = getattr(model_or_loaded, "adapter", None)
    if isinstance(adapter, Adapter):
        return adapter.model, adapter
    if not isinstance(model_or_loaded, nn.Module):
        raise InterventionError(
            f"expected a model, a Loaded bundle (helpers.load) or an Adapter, "
            f"got {type(model_or_loaded).__name__}"
        )
    return model_or_loaded, adapter_for(model_or_loaded)


def _as_list(values) -> list | None:
    """`values` as a list, or None for what is not a list of indices: a single value, None, text,
    a mapping."""
    if (
        values is None
        or isinstance(values, (str, bytes, Mapping))
        or getattr(values, "ndim", None) == 0
    ):
        return None
    try:
        return list(values)
    except TypeError:
        return None
