"""Per-head attention of attention layers, and hidden attention of SSM heads.

Attention layers run through transformers' attention interface under the name "helpers": a layer
with nothing attached calls transformers' own SDPA function (so the model computes exactly what it
computes under "sdpa"); a layer with a recorder or a mask attached computes eager attention, hands
its probabilities to the recorder and applies the mask before the softmax.

SSM heads have no softmax, but unrolling the recurrence gives a matrix alpha with y = alpha @ x
(Ali, Zimerman, Wolf 2024, "hidden attention"). For Mamba-2 (SSD) heads

    alpha[t, s] = (C_t . B_s) * dt_s * exp(A * sum_{k=s+1..t} dt_k)   for s <= t,

computed here from segment sums, with no loop over time.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .adapters import unwrap
from .errors import InterventionError

IMPLEMENTATION = "helpers"


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    record = getattr(module, "_helpers_record", None)
    allowed = getattr(module, "_helpers_allowed", None)
    if record is None and allowed is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    key = repeat_kv(key, query.shape[1] // key.shape[1])
    value = repeat_kv(value, query.shape[1] // value.shape[1])
    scores = (query @ key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    t, s = scores.shape[-2:]
    visible = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril(s - t)
    if attention_mask is not None:
        visible = visible & (attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0)
    if allowed is not None:
        visible = visible & allowed.to(scores.device)
    probs = torch.softmax(scores.float().masked_fill(~visible, float("-inf")), dim=-1)
    # A query row with nothing left to attend to reads nothing (softmax of all -inf is NaN).
    probs = probs.nan_to_num(0.0).to(query.dtype)
    if record is not None:
        record(probs)
    return (probs @ value).transpose(1, 2).contiguous(), probs


AttentionInterface.register(IMPLEMENTATION, _attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


@contextmanager
def _routed(model):
    """Route the model's attention through `_attention` for the block, then restore it."""
    before = model.config._attn_implementation
    model.config._attn_implementation = IMPLEMENTATION
    try:
        yield
    finally:
        model.config._attn_implementation = before


def mixer_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a mixer was called with (positionally, or as `hidden_states=`)."""
    return args[0] if args else kwargs["hidden_states"]


@contextmanager
def _attached(adapter, layer: int, name: str, value):
    """Give the layer's attention module the attribute `name` for the block, then put back
    what it had (nested interventions on one module unwind in order)."""
    module = adapter.attention(layer)
    before = module.__dict__.get(name)
    setattr(module, name, value)
    try:
        yield
    finally:
        if before is None:
            delattr(module, name)
        else:
            setattr(module, name, before)


@torch.inference_mode()
def attention_maps(model, input_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """Attention probabilities [batch, heads, T, T] of each requested layer, one forward pass.
    SSM layers give their hidden attention instead (see the adapters' `hidden_attention`)."""
    model, adapter = unwrap(model)
    maps: dict[int, torch.Tensor] = {}
    taps: dict[int, torch.Tensor] = {}
    with ExitStack() as stack:
        for l in layers:
            if adapter.is_attention(adapter.check_layer(l)):
                stack.enter_context(_attached(adapter, l, "_helpers_record",
                                              lambda p, l=l: maps.__setitem__(l, p.float())))
            else:
                handle = adapter.mixer(l).register_forward_pre_hook(
                    lambda m, a, kw, l=l: taps.__setitem__(l, mixer_input(a, kw)), with_kwargs=True)
                stack.callback(handle.remove)
        stack.enter_context(_routed(model))
        model(input_ids=input_ids.to(next(model.parameters()).device))
    for l, u in taps.items():
        maps[l] = adapter.hidden_attention(l, u).float()
    return {l: maps[l] for l in layers}


@contextmanager
def mask_attention(model, layer: int, heads: list[int], allowed: torch.Tensor):
    """Let these heads attend only where `allowed` [T, T] (or [heads, T, T]) is True.

    Attention heads: the masked scores are renormalised over what is left (a row with nothing
    allowed reads nothing); an all-True mask changes only the arithmetic path (eager instead of
    SDPA). SSM heads: their output is recomputed as (alpha * allowed) @ x + D x from the
    materialised hidden attention (no renormalisation: alpha is not a distribution). Other heads
    are untouched."""
    model, adapter = unwrap(model)
    heads = adapter.check_heads(layer, heads)
    if allowed.dim() == 3 and allowed.shape[0] != len(heads):
        raise InterventionError(f"a [heads, T, T] mask needs one pattern per head: {len(heads)}, not {allowed.shape[0]}")
    if adapter.is_attention(layer):
        full = torch.ones(adapter.n_heads(layer), *allowed.shape[-2:], dtype=torch.bool)
        full[heads] = allowed.bool() if allowed.dim() == 3 else allowed.bool().expand(len(heads), -1, -1)
        earlier = adapter.attention(layer).__dict__.get("_helpers_allowed")
        if earlier is not None:  # masks on other heads of this layer already in force: keep them
            full = full & earlier
        with _attached(adapter, layer, "_helpers_allowed", full), _routed(model):
            yield model
        return
    site = adapter.ssm_site(layer)  # raises for families without hidden attention
    dim = adapter.head_dim(layer)
    index = torch.arange(adapter.n_heads(layer) * dim).view(-1, dim)[heads].flatten()
    seen = {}

    def take_input(module, args, kwargs):
        seen["u"] = mixer_input(args, kwargs)

    def rewrite(module, args):
        out = args[0].clone()
        new = adapter.masked_heads_output(layer, seen["u"], heads, allowed.to(out.device))
        out[..., index.to(out.device)] = new.to(out.dtype)
        return (out,) + tuple(args[1:])

    with ExitStack() as stack:
        stack.callback(adapter.mixer(layer).register_forward_pre_hook(take_input, with_kwargs=True).remove)
        stack.callback(site.register_forward_pre_hook(rewrite).remove)
        yield model


@contextmanager
def mask_last_row(model, length: int, layers: list[int] | None = None):
    """The released code's attention ablation for hybrids: every attention head of these layers
    (default: all attention layers) reads nothing at the final position of inputs of `length`
    tokens (unpadded inputs: the final position is the last column)."""
    model, adapter = unwrap(model)
    layers = [l for l in range(adapter.n_layers) if adapter.is_attention(l)] if layers is None else layers
    allowed = torch.ones(length, length, dtype=torch.bool)
    allowed[-1] = False
    with ExitStack() as stack:
        for l in layers:
            stack.enter_context(mask_attention(adapter, l, list(range(adapter.n_heads(l))), allowed))
        yield model


@contextmanager
def mask_final_rows(model, lengths, layers: list[int] | None = None):
    """`mask_last_row` for a right-padded batch: row i holds `lengths[i]` tokens, and every
    attention head of these layers (default: all attention layers) reads nothing at row i's
    final position, lengths[i] - 1 (the released code's ablation, where each row of an lm-eval
    batch ends at its own last non-pad token). For `evaluate.choice_loglikelihoods(...,
    per_batch=...)`, which passes each batch's row lengths."""
    model, adapter = unwrap(model)
    layers = [l for l in range(adapter.n_layers) if adapter.is_attention(l)] if layers is None else layers
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    T = int(lengths.max())
    allowed = torch.ones(len(lengths), T, T, dtype=torch.bool)  # [batch, T, T]
    allowed[torch.arange(len(lengths)), lengths - 1] = False
    with ExitStack() as stack:
        for l in layers:
            full = allowed[:, None].expand(-1, adapter.n_heads(l), -1, -1)  # [batch, heads, T, T], a view
            earlier = adapter.attention(l).__dict__.get("_helpers_allowed")
            if earlier is not None:  # masks already in force on this layer: keep them
                full = full & earlier
            stack.enter_context(_attached(adapter, l, "_helpers_allowed", full))
        stack.enter_context(_routed(model))
        yield model
