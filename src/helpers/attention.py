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

from contextlib import ExitStack, contextmanager, nullcontext
from functools import partial

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from .adapters import Adapter, unwrap
from .errors import InterventionError, as_index
from .hooks import MIXER, SSM, hooked

IMPLEMENTATION = "helpers"


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    record = getattr(module, "_helpers_record", None)
    allowed = getattr(module, "_helpers_allowed", None)
    if record is None and allowed is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    key = repeat_kv(key, query.shape[1] // key.shape[1])
    value = repeat_kv(value, query.shape[1] // value.shape[1])
    scores = (query @ key.transpose(2, 3)) * (
        scaling if scaling is not None else query.shape[-1] ** -0.5
    )
    t, s = scores.shape[-2:]
    visible = torch.ones(t, s, dtype=torch.bool, device=scores.device).tril(s - t)
    if attention_mask is not None:
        visible = visible & (
            attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        )
    if allowed is not None:
        _check_length(allowed, t, s)
        visible = visible & allowed.to(scores.device)
    probs = torch.softmax(scores.float().masked_fill(~visible, float("-inf")), dim=-1)
    # A query row with nothing left to attend to reads nothing (softmax of all -inf is NaN).
    probs = probs.nan_to_num(0.0).to(query.dtype)
    if record is not None:
        record(probs)
    return (probs @ value).transpose(1, 2).contiguous(), probs


def _check_length(allowed: torch.Tensor, queries: int, keys: int) -> None:
    """A mask is built for one input length T; only the forward pass knows the input's."""
    T = allowed.shape[-1]
    if (queries, keys) != (T, T):
        input_T = f"T={keys}" if queries == keys else f"{queries} queries over {keys} keys"
        raise InterventionError(
            f"mask_attention's mask is for T={T} tokens, but the input has {input_T}: "
            f"build the mask for the input's length"
        )


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


def _check_ids(model, input_ids) -> torch.Tensor:
    """Token ids [batch, T] inside the model's vocabulary."""
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dim() != 2
        or input_ids.is_floating_point()
        or input_ids.dtype == torch.bool
        or 0 in input_ids.shape
    ):
        shape = (
            list(input_ids.shape)
            if isinstance(input_ids, torch.Tensor)
            else type(input_ids).__name__
        )
        raise InterventionError(
            f"input_ids must be an integer tensor [batch, T] with T >= 1, got {shape} "
            "(for one sequence of ids use ids[None])"
        )
    vocab = model.get_input_embeddings().num_embeddings
    if input_ids.min() < 0 or input_ids.max() >= vocab:
        raise InterventionError(
            f"token ids must be in 0..{vocab - 1} (this model's vocabulary), "
            f"got {input_ids.min().item()}..{input_ids.max().item()}"
        )
    return input_ids


@torch.inference_mode()
def attention_maps(model, input_ids: torch.Tensor, layers: list[int]) -> dict[int, torch.Tensor]:
    """Attention probabilities [batch, heads, T, T] of each requested layer, one forward pass.
    SSM layers give their hidden attention instead (see the adapters' `hidden_attention`)."""
    model, adapter = unwrap(model)
    input_ids = _check_ids(model, input_ids)
    layers = adapter.check_layers(layers, "attention_maps", increasing=False)
    if not layers:
        return {}
    maps: dict[int, torch.Tensor] = {}
    taps: dict[int, torch.Tensor] = {}
    with ExitStack() as stack:
        for l in layers:
            if adapter.is_attention(l):
                stack.enter_context(
                    _attached(
                        adapter, l, "_helpers_record", lambda p, l=l: maps.__setitem__(l, p.float())
                    )
                )
        stack.enter_context(
            hooked(
                adapter,
                {
                    (MIXER, l): partial(taps.__setitem__, l)
                    for l in layers
                    if not adapter.is_attention(l)
                },
            )
        )
        stack.enter_context(_routed(model))
        model(input_ids=input_ids.to(next(model.parameters()).device))
    for l, u in taps.items():
        maps[l] = adapter.hidden_attention(l, u).float()
    return {l: maps[l] for l in layers}


def _check_mask(allowed, n_heads: int) -> torch.Tensor:
    """A [T, T] pattern for every head or one [T, T] pattern per head, of booleans (or 0/1)."""
    if not isinstance(allowed, torch.Tensor):
        raise InterventionError(
            f"the mask must be a torch tensor [T, T] or [heads, T, T], got {type(allowed).__name__}"
        )
    if (
        allowed.dim() not in (2, 3)
        or allowed.shape[-1] != allowed.shape[-2]
        or allowed.shape[-1] == 0
    ):
        raise InterventionError(
            f"the mask must be [T, T] or [heads, T, T] with T >= 1 (row t: what query t may "
            f"read), got shape {list(allowed.shape)}"
        )
    if allowed.dim() == 3 and allowed.shape[0] != n_heads:
        raise InterventionError(
            f"a [heads, T, T] mask needs one pattern per head: {n_heads}, not {allowed.shape[0]}"
        )
    if allowed.dtype != torch.bool and not ((allowed == 0) | (allowed == 1)).all():
        raise InterventionError(
            "the mask must hold booleans (or 0 and 1): True where a head may attend"
        )
    return allowed


def mask_attention(model, layer: int, heads: list[int], allowed: torch.Tensor):
    """Let these heads attend only where `allowed` [T, T] (or [heads, T, T]) is True.

    Attention heads: the masked scores are renormalised over what is left (a row with nothing
    allowed reads nothing); an all-True mask changes only the arithmetic path (eager instead of
    SDPA). SSM heads: their output is recomputed as (alpha * allowed) @ x + D x from the
    materialised hidden attention (no renormalisation: alpha is not a distribution). Other heads
    are untouched, and with no heads nothing changes at all. The input must have the mask's T
    tokens (checked at the forward pass)."""
    model, adapter = unwrap(model)
    layer = adapter.check_layer(layer)
    heads = adapter.check_heads(layer, heads)
    allowed = _check_mask(allowed, len(heads))
    if not heads:
        return nullcontext(model)
    if adapter.is_attention(layer):
        return _masked_attention(model, adapter, layer, heads, allowed)
    adapter.ssm_site(layer)  # raises for families without hidden attention
    return _masked_ssm(model, adapter, layer, heads, allowed)


@contextmanager
def _masked_attention(model, adapter: Adapter, layer: int, heads: list[int], allowed: torch.Tensor):
    heads = adapter.check_heads(layer, heads)  # again, against the model as it stands on entry
    full = torch.ones(adapter.n_heads(layer), *allowed.shape[-2:], dtype=torch.bool)
    full[heads] = (
        allowed.bool() if allowed.dim() == 3 else allowed.bool().expand(len(heads), -1, -1)
    )
    full = _with_earlier(adapter, layer, full)
    with _attached(adapter, layer, "_helpers_allowed", full), _routed(model):
        yield model


def _with_earlier(adapter: Adapter, layer: int, full: torch.Tensor) -> torch.Tensor:
    """`full` ([heads, T, T], or [batch, heads, T, T] per row) and the masks already in force on
    this layer, both kept: a head may attend where every mask allows."""
    earlier = adapter.attention(layer).__dict__.get("_helpers_allowed")
    if earlier is None:
        return full
    if earlier.shape[-1] != full.shape[-1]:
        raise InterventionError(
            f"layer {layer} already has a mask for T={earlier.shape[-1]} tokens; "
            f"this one is for T={full.shape[-1]}: masks used together must be for one length"
        )
    if earlier.dim() == full.dim() == 4 and earlier.shape[0] != full.shape[0]:
        raise InterventionError(
            f"layer {layer} already has a mask for a batch of {earlier.shape[0]} rows; "
            f"this one is for {full.shape[0]}: per-row masks used together must be for one batch"
        )
    return full & earlier  # [heads, T, T] with [batch, heads, T, T]: per row


@contextmanager
def _masked_ssm(model, adapter: Adapter, layer: int, heads: list[int], allowed: torch.Tensor):
    heads = adapter.check_heads(layer, heads)  # again, against the model as it stands on entry
    # The mixer is found once, here (the sites on entry too): layers removed inside the block must not move them.
    mixer, dim = adapter.mixer(layer), adapter.head_dim(layer)
    index = torch.arange(adapter.n_heads(layer) * dim).view(-1, dim)[heads].flatten()
    seen = {}

    def take_input(u):
        _check_length(allowed, u.shape[1], u.shape[1])
        seen["u"] = u

    def rewrite(x):
        out = x.clone()
        new = adapter.masked_mixer_output(mixer, seen["u"], heads, allowed.to(out.device))
        out[..., index.to(out.device)] = new.to(out.dtype)
        return out

    with hooked(adapter, {(MIXER, layer): take_input, (SSM, layer): rewrite}):
        yield model


def mask_last_row(model, length: int, layers: list[int] | None = None):
    """The released code's attention ablation for hybrids: every attention head of these layers
    (default: all attention layers) reads nothing at the final position of inputs of `length`
    tokens (unpadded inputs: the final position is the last column). An empty list of layers
    changes nothing."""
    model, adapter = unwrap(model)
    T = as_index(length)
    if T is None or T < 1:
        raise InterventionError(
            f"length must be a positive integer (the inputs' token count), got {length!r}"
        )
    if layers is None:
        layers = [l for l in range(adapter.n_layers) if adapter.is_attention(l)]
        if not layers:
            raise InterventionError(
                f"this {adapter.family} model has no attention layers for mask_last_row to mask"
            )
    layers = adapter.check_layers(layers, "mask_last_row", increasing=False)
    for l in layers:
        adapter.attention(l)  # raises, naming the attention layers, for a layer without attention
    allowed = torch.ones(T, T, dtype=torch.bool)
    allowed[-1] = False
    masks = [mask_attention(adapter, l, list(range(adapter.n_heads(l))), allowed) for l in layers]
    return _all_of(model, masks)


@contextmanager
def _all_of(model, contexts: list):
    """Enter every context, leave them in reverse order."""
    with ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        yield model


@contextmanager
def mask_final_rows(model, lengths, layers: list[int] | None = None, width: int | None = None):
    """`mask_last_row` for a right-padded batch: row i holds `lengths[i]` tokens, and every
    attention head of these layers (default: all attention layers) reads nothing at row i's
    final position, lengths[i] - 1 (the released code's ablation, where each row of an lm-eval
    batch ends at its own last non-pad token). The batch is `width` tokens wide (default: its
    longest row). For `evaluate.choice_loglikelihoods(..., per_batch=...)`, which passes each
    batch's row lengths and width."""
    model, adapter = unwrap(model)
    if layers is None:
        layers = [l for l in range(adapter.n_layers) if adapter.is_attention(l)]
    layers = adapter.check_layers(layers, "mask_final_rows", increasing=False)
    for l in layers:
        adapter.attention(l)  # raises, naming the attention layers, for a layer without attention
    given = (
        list(lengths)
        if isinstance(lengths, (list, tuple, range)) or getattr(lengths, "ndim", 0) == 1
        else None
    )
    indices = [as_index(n) for n in given or []]
    if not given or any(i is None or i < 1 for i in indices):
        raise InterventionError(
            f"mask_final_rows takes each row's token count, a non-empty list of positive "
            f"integers, got {lengths!r}"
        )
    lengths = torch.tensor(indices, dtype=torch.long)
    T = int(lengths.max()) if width is None else width
    if T < int(lengths.max()):
        raise InterventionError(
            f"mask_final_rows: a row of {int(lengths.max())} tokens in a batch {T} wide"
        )
    allowed = torch.ones(len(lengths), T, T, dtype=torch.bool)  # [batch, T, T]
    allowed[torch.arange(len(lengths)), lengths - 1] = False
    with ExitStack() as stack:
        for l in layers:
            # [batch, heads, T, T], a view
            full = allowed[:, None].expand(-1, adapter.n_heads(l), -1, -1)
            full = _with_earlier(adapter, l, full)
            stack.enter_context(_attached(adapter, l, "_helpers_allowed", full))
        stack.enter_context(_routed(model))
        yield model
