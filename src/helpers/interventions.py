"""Reversible surgery, one API for every architecture.

Each intervention is a context manager: inside the block the model is changed, and leaving it
(normally or by an exception) puts the model back exactly as it was. Nothing edits weights:
layers are taken out of the block list and put back, heads are silenced by hooks.

Arguments are checked when the intervention is called, before anything is touched (and again
on entry, against the model as it then stands), and a mistake raises `InterventionError` naming
what is valid. Layer lists are increasing and name
each layer once; an empty list of heads or layers is an exact no-op.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Callable, Iterable, Mapping

import torch
from torch import nn

from .adapters import Adapter, unwrap
from .errors import InterventionError, as_index
from .hooks import HEAD, hooked


@contextmanager
def _layers_replaced(adapter: Adapter, build: Callable[[], nn.ModuleList]):
    """Run the model with the block list `build` makes, then put its own back (also after an
    exception). `build` runs on entry and checks its indices again against the model as it then
    stands: an intervention made before another one was entered still gets a clear error."""
    owner, original = adapter.layer_owner, adapter.layers
    owner.layers = build()
    try:
        yield adapter.model
    finally:
        owner.layers = original


def _kept(adapter: Adapter, layers) -> list[int]:
    keep = adapter.check_layers(layers, "keep_layers")
    if not keep:
        raise InterventionError("keep_layers needs at least one layer")
    return keep


def _removed(adapter: Adapter, layers) -> list[int]:
    drop = adapter.check_layers(layers, "remove_layers")
    if len(drop) == adapter.n_layers:
        raise InterventionError(
            f"remove_layers would remove all {adapter.n_layers} layers: keep at least one"
        )
    return drop


def keep_layers(model, layers: Iterable[int]):
    """Run the model with only these layers (an increasing list; the rest are skipped, as in the
    paper's layer pruning and its "minimal model")."""
    _, adapter = unwrap(model)
    keep = _kept(adapter, layers)
    return _layers_replaced(adapter, lambda: adapter.subset(_kept(adapter, keep)))


def remove_layers(model, layers: Iterable[int]):
    """Skip these layers (an increasing list; the paper's one-layer-at-a-time removal)."""
    model, adapter = unwrap(model)
    drop = _removed(adapter, layers)
    if not drop:
        return nullcontext(model)

    def rest() -> nn.ModuleList:
        gone = _removed(adapter, drop)
        return adapter.subset([i for i in range(adapter.n_layers) if i not in gone])

    return _layers_replaced(adapter, rest)


def prune_top(model, n_kept: int):
    """Keep the bottom `n_kept` layers (progressive pruning from the top, Fig. 2)."""
    _, adapter = unwrap(model)
    n = as_index(n_kept)
    if n is None or not 1 <= n <= adapter.n_layers:
        raise InterventionError(
            f"n_kept must be an integer in 1..{adapter.n_layers} (layers kept from the bottom), "
            f"got {n_kept!r}"
        )
    return keep_layers(adapter, range(n))


def _head_plan(adapter: Adapter, heads) -> dict[int, list[int]]:
    """{layer: heads} with every index checked, layers with no heads left out."""
    if not isinstance(heads, Mapping):
        raise InterventionError(
            f"zero_heads takes {{layer: [{adapter.head_kind}, ...]}}, got {heads!r}"
        )
    plan: dict[int, list[int]] = {}
    for layer, listed in heads.items():
        index = adapter.check_layer(layer)
        if index in plan:  # 16 and numpy's 16 are one key, but a tensor(16) key is another
            raise InterventionError(f"zero_heads: layer {index} is given twice")
        plan[index] = adapter.check_heads(index, listed)
    return {layer: hs for layer, hs in plan.items() if hs}


def zero_heads(model, heads: Mapping[int, Iterable[int] | int]):
    """Zero the output of these heads, `{layer: [head, ...]}`, where they enter the layer's
    output projection. An empty mapping, or a layer with no heads, changes nothing."""
    model, adapter = unwrap(model)
    plan = _head_plan(adapter, heads)
    zeros = {layer: torch.zeros(()) for layer in plan}  # zero ablation is replacement by zeros
    return _replaced(model, adapter, plan, zeros) if plan else nullcontext(model)


def _kept_channels(adapter: Adapter, layer: int, heads: list[int]) -> torch.Tensor:
    """The output projection's input channels of `layer` that `heads` do not own (True: kept)."""
    keep = torch.ones(adapter.n_heads(layer), dtype=torch.bool)
    keep[heads] = False
    return keep.repeat_interleave(adapter.head_dim(layer))


def working_dtype(block: nn.Module) -> torch.dtype:
    """The dtype most of a block's weights are in: what it computes in. (A bfloat16 Mamba keeps a
    few parameters, and its residual stream, in float32, so the first parameter may not say.)"""
    sizes: dict[torch.dtype, int] = {}
    for p in block.parameters():
        if p.is_floating_point():
            sizes[p.dtype] = sizes.get(p.dtype, 0) + p.numel()
    return max(sizes, key=sizes.get) if sizes else torch.get_default_dtype()


class Transplant(nn.Module):
    """A block of another model, run as its own model runs it, whatever the host passes: the
    stream enters in the block's working dtype and leaves in the dtype the host passed it in
    (Mamba and Falcon-Mamba keep it in float32 between bfloat16 layers)."""

    def __init__(self, block: nn.Module, donor):
        super().__init__()
        self.block = block
        self.dtype = working_dtype(block)
        object.__setattr__(self, "donor", donor)  # not a submodule: the donor stays its own model

    def forward(self, hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.donor.run_layer(self.block, hidden.to(self.dtype)).to(hidden.dtype)


def _check_swappable(host: Adapter, donor: Adapter, layers: list[int]) -> None:
    """The donor's layers must read and write the host's residual stream as it is."""
    if host.width != donor.width:
        raise InterventionError(
            f"cannot swap layers between models of width {host.width} ({host.family}) "
            f"and {donor.width} ({donor.family}): residual streams must match"
        )
    missing = [i for i in layers if i >= donor.n_layers]
    if missing:
        raise InterventionError(
            f"the donor ({donor.family}) has layers 0..{donor.n_layers - 1}: it has no layer {missing}"
        )
    for i in layers:  # each layer against the one it replaces
        ours, theirs = host.layers[i], donor.layers[i]
        here = (working_dtype(ours), next(ours.parameters()).device)
        there = (working_dtype(theirs), next(theirs.parameters()).device)
        if here != there:
            raise InterventionError(
                f"cannot swap layer {i} from a {donor.family} model in {there[0]} on {there[1]} into a "
                f"{host.family} model in {here[0]} on {here[1]}: load both alike"
            )


def swap_layers(host, donor, layers: Iterable[int]):
    """Run `host` with the donor's layer i in place of its own layer i, for each i of an
    increasing list (the paper's hybrid swap: a Llama-3.1 layer into Llamba). Both models are
    left as they were; an empty list changes nothing."""
    host_model, host_adapter = unwrap(host)
    _, donor_adapter = unwrap(donor)

    def checked(layers) -> list[int]:
        layers = host_adapter.check_layers(layers, "swap_layers")
        _check_swappable(host_adapter, donor_adapter, layers)
        return layers

    layers = checked(layers)
    if not layers:
        return nullcontext(host_model)

    def swapped() -> nn.ModuleList:
        swap = checked(layers)
        return nn.ModuleList(
            [
                Transplant(donor_adapter.layers[i], donor_adapter) if i in swap else block
                for i, block in enumerate(host_adapter.layers)
            ]
        )

    return _layers_replaced(host_adapter, swapped)


# --- replacing heads' outputs (mean and resample ablation) -------------------------------------


def replaced_site(x: torch.Tensor, keep: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A head site's input `x` [..., heads * head_dim] with the channels where `keep` is False
    taken from `value` (broadcast against x: one vector, e.g. a head's mean output, or a tensor of
    x's shape, e.g. another prompt's outputs position by position). The one replacement rule of
    the package: `zero_heads`, `replace_heads` and the sweep engine's `SweepEngine.replaced` apply it."""
    return torch.where(keep.to(x.device), x, value.to(x.device, x.dtype))


def site_width(adapter: Adapter, layer: int) -> int:
    """Channels entering `layer`'s head site (its output projection): heads x head_dim."""
    return adapter.n_heads(layer) * adapter.head_dim(layer)


def replace_heads(
    model, heads: Mapping[int, Iterable[int] | int], values: Mapping[int, torch.Tensor]
):
    """Replace the output of these heads, `{layer: [head, ...]}`, where they enter the layer's
    output projection, by `values[layer]`: a vector of the site's width (heads x head_dim; only
    the named heads' channels are used: a mean ablation), or a tensor of the site input's own
    shape [batch, positions, width] (a resample ablation, position by position). Zeros give
    zero ablation (equal to `zero_heads`, tested). Leaving the block restores the model."""
    model, adapter = unwrap(model)
    plan = _head_plan(adapter, heads)
    if missing := [l for l in plan if l not in values]:
        raise InterventionError(
            f"replace_heads: no replacement values for layer(s) {missing}; pass values={{layer: tensor}}"
        )
    for layer in plan:
        width, value = site_width(adapter, layer), values[layer]
        if not isinstance(value, torch.Tensor) or value.shape[-1:] != (width,):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise InterventionError(
                f"replace_heads: values[{layer}] must be a tensor whose last dimension is the site's "
                f"width {width} ({adapter.n_heads(layer)} x {adapter.head_dim(layer)}), got {shape}"
            )
    return _replaced(model, adapter, plan, values) if plan else nullcontext(model)


@contextmanager
def _replaced(
    model, adapter: Adapter, plan: dict[int, list[int]], values: Mapping[int, torch.Tensor]
):
    plan = _head_plan(adapter, plan)  # again, against the model as it stands on entry

    def replace(x, layer, keep):
        value = values[layer]
        if value.dim() > 1 and value.shape != x.shape:
            raise InterventionError(
                f"replace_heads: values[{layer}] has shape {tuple(value.shape)} but the "
                f"site's input has {tuple(x.shape)}: pass one vector or the input's shape"
            )
        return replaced_site(x, keep, value)

    edits = {
        (HEAD, layer): partial(replace, layer=layer, keep=_kept_channels(adapter, layer, hs))
        for layer, hs in plan.items()
    }
    with hooked(adapter, edits):
        yield model
