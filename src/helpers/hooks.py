"""The one door through which the package reaches into a model's forward pass.

A *site* is a named place in a layer where a tensor passes, in the spirit of TransformerLens's
hook points; the family's adapter says which module it is:

- `HEAD`: what enters the layer's output projection, every head's output side by side
  [batch, T, heads * head_dim] (`Adapter.head_site`). Heads are zeroed, replaced, patched,
  scaled and read here.
- `SSM`: where each SSM head's output enters the rest of its mixer (`Adapter.ssm_site`); masked
  hidden attention is written back here.
- `MIXER`: what enters the layer's mixer, attention or SSM (`Adapter.mixer`): the normalised
  residual stream, from which hidden attention is computed.
- `LAYER_IN`, `LAYER_OUT`: the residual stream entering and leaving the layer's block.

`hooked(model, {(site, layer): edit})` calls `edit(x)` on the tensor passing each site; an edit
returns the tensor to put in its place, or None to leave it (a tap that only reads). The modules
are found once, on entry, so that layers removed inside the block do not move them; leaving the
block, by error too, removes every hook, and the model is exactly as it was.

Two model changes do not pass a tensor through a site and stay where they are: attention maps and
masks swap the attention function of a layer (`attention._routed`, `attention._attached`), and
loading makes the unembedding's input contiguous once, for good (`models`).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, Mapping

import torch

from .adapters import Adapter, unwrap
from .errors import InterventionError

HEAD, SSM, MIXER, LAYER_IN, LAYER_OUT = "head", "ssm", "mixer", "layer_in", "layer_out"

Edit = Callable[[torch.Tensor], "torch.Tensor | None"]

# Which module carries each site; True where the tensor is the module's output, not its input.
_MODULES: dict[str, tuple[Callable[[Adapter, int], torch.nn.Module], bool]] = {
    HEAD: (lambda adapter, layer: adapter.head_site(layer), False),
    SSM: (lambda adapter, layer: adapter.ssm_site(layer), False),
    MIXER: (lambda adapter, layer: adapter.mixer(layer), False),
    LAYER_IN: (lambda adapter, layer: adapter.layers[adapter.check_layer(layer)], False),
    LAYER_OUT: (lambda adapter, layer: adapter.layers[adapter.check_layer(layer)], True),
}


def _before(edit: Edit):
    def hook(module, args, kwargs):
        new = edit(args[0] if args else kwargs["hidden_states"])
        if new is None:
            return None
        return (
            ((new,) + tuple(args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
        )

    return hook


def _after(edit: Edit):
    def hook(module, args, kwargs, output):
        new = edit(Adapter.layer_output(output))
        if new is None:
            return None
        return new if isinstance(output, torch.Tensor) else (new,) + tuple(output[1:])

    return hook


@contextmanager
def hooked(model, edits: Mapping[tuple[str, int], Edit]):
    """Run each `edits[(site, layer)]` on the tensor passing that site for the block (see the
    module's docstring); yields the model."""
    model, adapter = unwrap(model)
    if unknown := sorted({site for site, _ in edits} - set(_MODULES)):
        raise InterventionError(f"unknown hook site(s) {unknown}; the sites are {sorted(_MODULES)}")
    with ExitStack() as stack:
        for (site, layer), edit in edits.items():
            find, after = _MODULES[site]
            module = find(adapter, layer)
            handle = (
                module.register_forward_hook(_after(edit), with_kwargs=True)
                if after
                else module.register_forward_pre_hook(_before(edit), with_kwargs=True)
            )
            stack.callback(handle.remove)
        yield model
