"""Reversible surgery, one API for every architecture.

Each intervention is a context manager: inside the block the model is changed, and leaving it
(normally or by an exception) puts the model back exactly as it was. Nothing edits weights:
layers are taken out of the block list and put back, heads are silenced by hooks.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Iterable, Mapping

import torch
from torch import nn

from .adapters import unwrap
from .errors import InterventionError


@contextmanager
def keep_layers(model, layers: Iterable[int]):
    """Run the model with only these layers, in their original order (the rest are skipped,
    as in the paper's layer pruning and its "minimal model")."""
    model, adapter = unwrap(model)
    keep = sorted({adapter.check_layer(i) for i in layers})
    if not keep:
        raise InterventionError("keep_layers needs at least one layer")
    owner, original = adapter.layer_owner, adapter.layers
    owner.layers = adapter.subset(keep)
    try:
        yield model
    finally:
        owner.layers = original


@contextmanager
def remove_layers(model, layers: Iterable[int]):
    """Skip these layers (the paper's one-layer-at-a-time removal)."""
    model, adapter = unwrap(model)
    drop = {adapter.check_layer(i) for i in layers}
    with keep_layers(adapter, [i for i in range(adapter.n_layers) if i not in drop]):
        yield model


def prune_top(model, n_kept: int):
    """Keep the bottom `n_kept` layers (progressive pruning from the top, Fig. 2)."""
    _, adapter = unwrap(model)
    if not 1 <= n_kept <= adapter.n_layers:
        raise InterventionError(f"n_kept must be in 1..{adapter.n_layers}, got {n_kept}")
    return keep_layers(adapter, range(n_kept))


@contextmanager
def zero_heads(model, heads: Mapping[int, Iterable[int] | int]):
    """Zero the output of these heads, `{layer: [head, ...]}`, where they enter the layer's
    output projection. An empty mapping changes nothing."""
    model, adapter = unwrap(model)
    plan = {layer: adapter.check_heads(layer, hs) for layer, hs in heads.items() if hs != []}
    with ExitStack() as stack:
        for layer, hs in plan.items():
            keep = torch.ones(adapter.n_heads(layer), dtype=torch.bool)
            keep[hs] = False
            mask = keep.repeat_interleave(adapter.head_dim(layer))

            def silence(module, args, mask=mask):
                return (args[0] * mask.to(args[0].device, args[0].dtype),) + tuple(args[1:])

            stack.callback(adapter.head_site(layer).register_forward_pre_hook(silence).remove)
        yield model


class Transplant(nn.Module):
    """A block of another model, run as its own model runs it, whatever the host passes."""

    def __init__(self, block: nn.Module, donor):
        super().__init__()
        self.block = block
        object.__setattr__(self, "donor", donor)  # not a submodule: the donor stays its own model

    def forward(self, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.donor.run_layer(self.block, hidden)


@contextmanager
def swap_layers(host, donor, layers: Iterable[int]):
    """Run `host` with the donor's layer i in place of its own layer i, for each i (the paper's
    hybrid swap: a Llama-3.1 layer into Llamba). Both models are left as they were."""
    host_model, host_adapter = unwrap(host)
    _, donor_adapter = unwrap(donor)
    if host_adapter.width != donor_adapter.width:
        raise InterventionError(
            f"cannot swap layers between models of width {host_adapter.width} ({host_adapter.family}) "
            f"and {donor_adapter.width} ({donor_adapter.family}): residual streams must match")
    layers = [host_adapter.check_layer(i) for i in layers]
    for i in layers:
        donor_adapter.check_layer(i)
    owner, original = host_adapter.layer_owner, host_adapter.layers
    swapped = list(original)
    for i in layers:
        swapped[i] = Transplant(donor_adapter.layers[i], donor_adapter)
    owner.layers = nn.ModuleList(swapped)
    try:
        yield host_model
    finally:
        owner.layers = original
