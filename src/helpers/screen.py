"""The attribution screen: an estimate of what zeroing each head does, for every head at once,
and the ranking that confirms the screen's best candidates exactly.

Attribution patching estimates the change of the mean gold margin (`SweepEngine.margins`) when a
head is zeroed as -(gradient x output), summed over the head's slice of its layer's output
projection input. Taken at the clean model (alpha=1, one pass for all layers) this first-order
estimate can miss heads whose effect is far from linear, even the most harmful one: on SmolLM2's
KV retrieval it ranks that head 269th of 270. Taking each layer's gradient with that layer's
heads at half strength (alpha=0.5, one midpoint of integrated gradients along the layer's path
to zero) finds it; `benchmarks/sweep.py` measures both. As AtP* advises, the screen only
proposes: `rank_heads` sweeps the layers it points to exactly.
"""

from __future__ import annotations

import pandas as pd
import torch

from .adapters import unwrap
from .engine import SweepEngine
from .errors import InterventionError
from .heads import Head, layers_to_sweep, ranking_table
from .packing import default_batch_tokens
from .progress import bar
from .specs import Spec

# a gradient pass's activations per batch on CPU (a 1.5B model: ~170 tokens; 2 GB peaked at 16.7 GB)
GRAPH_BYTES = 1024**3


def gradient_batch_tokens(model) -> int:
    """Tokens per batch for a forward and backward pass through every layer: some three dozen
    float32 activations per hidden unit per layer are kept for the backward pass (attention's
    inputs and outputs, a gated MLP's four tensors of about six times the width), so the budget
    is split by layers x width. On a GPU, the engine's own budget (a share of free memory) stands."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        return default_batch_tokens(device)
    return int(
        max(64, min(default_batch_tokens(device), GRAPH_BYTES // graph_bytes_per_token(model)))
    )


def graph_bytes_per_token(model) -> int:
    """What a gradient pass through every layer keeps per token (see `gradient_batch_tokens`),
    from the adapter's layers and width (every family's, our Llamba's included, whose config
    names them otherwise)."""
    _, adapter = unwrap(model)
    return 36 * 4 * len(adapter.layers) * adapter.width


def needs_checkpoint(engine: SweepEngine, batch) -> bool:
    """Whether a CPU gradient pass recomputes this batch's activations layer by layer rather than
    keeping them: where its graph would exceed GRAPH_BYTES. A batch is at least one row, and a row
    of MMLU questions behind their shared prefix (up to 2,048 tokens) can be ten times the budget
    (Qwen-1.5B, 1,699 tokens: 7.4 GB kept, measured); smaller batches keep their graph (the
    recomputation costs about one more forward pass)."""
    return (
        engine.device.type == "cpu"
        and batch.width * len(batch.rows) * graph_bytes_per_token(engine.model) > GRAPH_BYTES
    )


def attribution(
    engine: SweepEngine,
    within: Spec = Spec(),
    alpha: float = 0.5,
    progress: bool = True,
    checkpoint: bool | None = None,
) -> dict[Head, float]:
    """For every head of the layers the model runs (all, or those `within` runs): the estimated
    change of the mean gold margin when it is zeroed. alpha=1: one pass for all layers. Otherwise, per layer: a pass that weighs
    each log-likelihood in the margin, then a forward and backward pass from the cached residual
    stream entering the layer, batch by batch (memory: one batch's graph; with `checkpoint`, by
    default where `needs_checkpoint`, one layer's activations of it, the same numbers)."""
    adapter = engine.adapter
    model_layers = within.check(adapter)
    if within.replaced:
        raise InterventionError(f"the screen estimates heads of a model that runs layers: {within}")
    layers = [l for l in adapter.head_layers() if l in model_layers]
    groups = [layers] if alpha == 1 else [[l] for l in layers]
    out = {}
    for group in bar(groups, desc="attribution", disable=not progress or len(groups) == 1):
        start = engine.first_recomputed(model_layers, group)
        out.update(_attribute(engine, group, model_layers, start, alpha, checkpoint))
    return out


def _attribute(
    engine: SweepEngine,
    group: list[int],
    model_layers: list[int],
    start: int,
    alpha: float,
    checkpoint: bool | None,
) -> dict[Head, float]:
    """`attribution` of one group of layers, their heads scaled by alpha, from the stream cached at `start`."""
    adapter = engine.adapter
    scales = {
        l: torch.full((1, adapter.n_heads(l) * adapter.head_dim(l)), float(alpha)) for l in group
    }
    with torch.inference_mode():
        flat = engine.scaled_loglikelihoods(scales, model_layers)[0]
    flat = flat.clone().requires_grad_(True)
    engine.margins(flat).mean().backward()
    weight = flat.grad  # d(mean margin) / d(each pair's log-likelihood)
    effect = {l: 0 for l in group}
    seen: dict[int, list] = {}
    with engine.scaling(scales, seen), torch.enable_grad():
        for i, (b, h) in enumerate(zip(engine.batches, engine.residual(start))):
            seen.clear()  # a recomputed layer records its site again, after this batch's pop
            recompute = needs_checkpoint(engine, b) if checkpoint is None else checkpoint
            # The real rows only: a gradient through the filler rows that keep the batch's shape
            # (`packing.batches`) would cost their backward too, for an estimate.
            real = torch.arange(engine.batches[i].n_real)
            lls = engine.pair_loglikelihoods(
                engine.run_layers(h[real], b, model_layers[start:], recompute, real), i
            )[0]
            sites = [seen.pop(l)[0] for l in group]
            grads = torch.autograd.grad((lls * weight).sum(), [scaled for _, scaled in sites])
            for l, (x, _), g in zip(group, sites, grads):
                effect[l] = effect[l] - (g * x).sum(dim=tuple(range(x.dim() - 1))).double().cpu()
    return {
        Head(l, head): value
        for l in group
        for head, value in enumerate(effect[l].view(adapter.n_heads(l), -1).sum(-1).tolist())
    }


def rank_heads(
    engine: SweepEngine,
    top: int = 10,
    layers: list[int] | None = None,
    within: Spec = Spec(),
    alpha: float = 0.5,
    progress: bool = True,
    also: list[int] = (),
) -> pd.DataFrame:
    """Heads ranked by ablation: the screen estimates every head, then the layers of its `top`
    heads (at least two; or `layers`), and the layers in `also` whatever the screen says, are
    swept exactly, every head of them. One row per head, the exactly measured ones first, most
    harmful first (`heads.ranking_table`)."""
    estimate = attribution(engine, within, alpha, progress)
    layers = sorted(set(layers if layers else layers_to_sweep(estimate, top)) | set(also))
    exact = engine.head_sweep(layers=layers, within=within, progress=progress)
    return ranking_table(estimate, exact)
