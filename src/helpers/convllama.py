"""The toy zoo's Transformer: a Llama whose attention reads a short causal convolution of its
input (as in Primer and H3's shift). A plain tiny Llama did not learn sparse retrieval on the zoo's
tasks in 600 s here, while the same model with a width-4 convolution before attention did; every
Mamba layer has such a convolution anyway."""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


class ShortConv(nn.Module):
    """x + a causal depthwise convolution of x, over the sequence ([B, T, D] -> [B, T, D])."""

    def __init__(self, width: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(width, width, kernel, groups=width, padding=kernel - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


class ConvLlamaConfig(LlamaConfig):
    model_type = "conv_llama"

    def __init__(self, conv_kernel: int = 4, conv_layers: list[int] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.conv_kernel, self.conv_layers = (
            conv_kernel,
            [0] if conv_layers is None else list(conv_layers),
        )


class ConvLlamaForCausalLM(LlamaForCausalLM):
    """Llama whose attention in `conv_layers` reads a short causal convolution of its normed
    input (the convolution follows `input_layernorm`, which only feeds attention)."""

    config_class = ConvLlamaConfig

    def __init__(self, config: ConvLlamaConfig):
        super().__init__(config)
        for i in config.conv_layers:
            layer = self.model.layers[i]
            layer.input_layernorm = nn.Sequential(
                layer.input_layernorm, ShortConv(config.hidden_size, config.conv_kernel)
            )
