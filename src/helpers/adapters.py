"""One adapter per architecture: where the layers are, what a "head" is, and where each head's
output enters the layer's output projection. Interventions and attention maps only talk to
adapters, so adding an architecture means adding one class here.
"""

from __future__ import annotations

import torch
from torch import nn


class InterventionError(ValueError):
    """An intervention that this model cannot take; the message says why and what is valid."""


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

    @property
    def final_norm(self) -> nn.Module:
        """The norm between the last layer and the unembedding."""
        raise NotImplementedError

    @staticmethod
    def layer_output(output) -> torch.Tensor:
        """The residual stream a layer's forward returns (some return tuples)."""
        return output if isinstance(output, torch.Tensor) else output[0]

    def check_layer(self, layer: int) -> int:
        if not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise InterventionError(f"layer {layer!r} is out of range: this {self.family} model has layers 0..{self.n_layers - 1}")
        return layer

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
        raise InterventionError(f"layer {layer} of this {self.family} model has no attention module")

    def mixer(self, layer: int) -> nn.Module:
        """The sequence mixer of the layer (attention or SSM)."""
        raise NotImplementedError

    def hidden_attention(self, layer: int, mixer_input: torch.Tensor) -> torch.Tensor:
        """alpha [batch, heads, T, T] of an SSM layer's heads, given the mixer's input."""
        raise InterventionError(f"this {self.family} model has no hidden attention for layer {layer}")

    def check_heads(self, layer: int, heads) -> list[int]:
        self.check_layer(layer)
        n = self.n_heads(layer)
        heads = [heads] if isinstance(heads, int) else list(heads)
        bad = [h for h in heads if not isinstance(h, int) or not 0 <= h < n]
        if bad:
            raise InterventionError(
                f"{self.head_kind} {bad} out of range: layer {layer} of this {self.family} model has "
                f"{self.head_kind}s 0..{n - 1}")
        return heads


class LlamaAdapter(Adapter):
    """Llama-family attention (SmolLM2, Llama-3.1): heads are the query heads (grouped-query
    attention shares K/V, but each query head writes its own slice of `o_proj`'s input)."""

    family = "llama"

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.norm

    def is_attention(self, layer: int) -> bool:
        return True

    def attention(self, layer: int) -> nn.Module:
        return self.layers[self.check_layer(layer)].self_attn

    mixer = attention

    def n_heads(self, layer: int) -> int:
        return self.model.config.num_attention_heads

    def head_dim(self, layer: int) -> int:
        return self.attention(layer).head_dim

    def head_site(self, layer: int) -> nn.Linear:
        return self.attention(layer).o_proj


class Mamba2Adapter(Adapter):
    """Mamba-2 (transformers `Mamba2ForCausalLM`): heads of `head_dim` channels, zeroed after the
    gated norm, where they enter `out_proj`."""

    family = "mamba2"

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.norm_f

    def mixer(self, layer: int) -> nn.Module:
        return self.layers[self.check_layer(layer)].mixer

    def n_heads(self, layer: int) -> int:
        return self.mixer(layer).num_heads

    def head_dim(self, layer: int) -> int:
        return self.mixer(layer).head_dim

    def head_site(self, layer: int) -> nn.Linear:
        return self.mixer(layer).out_proj

    def hidden_attention(self, layer: int, mixer_input: torch.Tensor) -> torch.Tensor:
        from .attention import mamba2_terms, ssd_hidden_attention

        t = mamba2_terms(self.mixer(layer), mixer_input)
        return ssd_hidden_attention(t["C"], t["B"], t["dt"], t["A"])


class MambaAdapter(Adapter):
    """Mamba-1 and Falcon-Mamba (transformers `MambaForCausalLM`, `FalconMambaForCausalLM`):
    every inner channel is its own SSM, so a "head" is one channel (width 1), as in the released
    code; `group` > 1 treats consecutive channels as one head."""

    family = "mamba"
    head_kind = "channel"

    def __init__(self, model: nn.Module, group: int = 1):
        super().__init__(model)
        self.group = group
        if group > 1:
            self.head_kind = "channel group"

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.norm_f

    def mixer(self, layer: int) -> nn.Module:
        return self.layers[self.check_layer(layer)].mixer

    def n_heads(self, layer: int) -> int:
        return self.mixer(layer).intermediate_size // self.group

    def head_dim(self, layer: int) -> int:
        return self.group

    def head_site(self, layer: int) -> nn.Linear:
        return self.mixer(layer).out_proj

    def hidden_attention(self, layer: int, mixer_input: torch.Tensor, heads=None) -> torch.Tensor:
        from .attention import mamba1_hidden_attention, mamba1_terms

        t = mamba1_terms(self.mixer(layer), mixer_input)
        heads = self.check_heads(layer, range(self.n_heads(layer)) if heads is None else heads)
        channels = [h * self.group + i for h in heads for i in range(self.group)]
        alpha = mamba1_hidden_attention(t["C"], t["B"], t["dt"], t["A"], channels)
        # A channel group's map is the mean of its channels' maps.
        return alpha.unflatten(1, (len(heads), self.group)).mean(2)


class LlambaAdapter(Mamba2Adapter):
    """Llamba (our `helpers.llamba`): DiscreteMamba2 heads, zeroed where they enter `out_proj`
    (after the gate, as for Mamba-2)."""

    family = "llamba"

    @property
    def final_norm(self) -> nn.Module:
        return self.model.base_model.final_layernorm

    def n_heads(self, layer: int) -> int:
        return self.mixer(layer).n_v_heads

    def hidden_attention(self, layer: int, mixer_input: torch.Tensor) -> torch.Tensor:
        from .llamba import discrete_hidden_attention

        t = self.mixer(layer).terms(mixer_input)
        return discrete_hidden_attention(t["log_decay"], t["B"], t["C"])


ADAPTERS: dict[str, type[Adapter]] = {
    "llamba": LlambaAdapter,
    "llama": LlamaAdapter,
    "mamba2": Mamba2Adapter,
    "mamba": MambaAdapter,
    "falcon_mamba": MambaAdapter,
}


def adapter_for(model: nn.Module) -> Adapter:
    kind = getattr(model.config, "model_type", None)
    if kind not in ADAPTERS:
        raise InterventionError(f"no adapter for model_type {kind!r}; known: {', '.join(sorted(ADAPTERS))}")
    return ADAPTERS[kind](model)


def unwrap(model_or_loaded) -> tuple[nn.Module, Adapter]:
    """Accept a `Loaded` bundle, an adapter, or a bare model."""
    if isinstance(model_or_loaded, Adapter):
        return model_or_loaded.model, model_or_loaded
    adapter = getattr(model_or_loaded, "adapter", None)
    if adapter is not None:
        return adapter.model, adapter
    return model_or_loaded, adapter_for(model_or_loaded)

