"""Reversible surgery, one API for every architecture.

Each intervention is a context manager: inside the block the model is changed, and leaving it
(normally or by an exception) puts the model back exactly as it was. Nothing edits weights:
layers are taken out of the block list and put back, heads are silenced by hooks.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Mapping

import torch
from torch import nn

from .adapters import InterventionError, unwrap


@contextmanager
def keep_layers(model, layers: Iterable[int]):
    """Run the model with only these layers, in their original order (the rest are skipped,
    as in the paper's layer pruning and its "minimal model")."""
    model, adapter = unwrap(model)
    keep = sorted({adapter.check_layer(i) for i in layers})
    if not keep:
        raise InterventionError("keep_layers needs at least one layer")
    owner, original = adapter.layer_owner, adapter.layers
    owner.layers = nn.ModuleList([original[i] for i in keep])
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
    plan = {layer: adapter.check_heads(layer, hs) for layer, hs in heads.items()}
    handles = []
    try:
        for layer, hs in plan.items():
            if not hs:
                continue
            dim, n = adapter.head_dim(layer), adapter.n_heads(layer)
            keep = torch.ones(n, dtype=torch.bool)
            keep[hs] = False

            def silence(module, args, keep=keep, dim=dim, n=n):
                x = args[0]
                mask = keep.to(x.device).repeat_interleave(dim).to(x.dtype)
                return (x * mask,) + tuple(args[1:])

            handles.append(adapter.head_site(layer).register_forward_pre_hook(silence))
        yield model
    finally:
        for h in handles:
            h.remove()
