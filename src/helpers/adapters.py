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


ADAPTERS: dict[str, type[Adapter]] = {"llama": LlamaAdapter, "mamba2": Mamba2Adapter}


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

