"""Batched log-likelihood scoring in lm-eval's conventions, and accuracies with intervals.

lm-eval (0.4, `HFLM`) encodes context+continuation together and splits at the context's
length, after moving the context's trailing whitespace into the continuation; it adds a BOS
only when the tokenizer does; a continuation's score is the sum of its tokens' log-probs. We do
the same, with two savings that do not change a number: choices whose model input is the same
(one-token continuations such as MMLU's letters) share one forward pass, and the vocabulary
projection runs only at the positions that are scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from .adapters import adapter_for
from .tasks import Item


def encode_pair(tokenizer, context: str, continuation: str, verbatim: bool = False) -> tuple[list[int], list[int]]:
    if not verbatim:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer.encode(context + continuation)
    ctx = tokenizer.encode(context)
    return ctx, whole[len(ctx):]


def default_batch_tokens(device: torch.device) -> int:
    """Tokens per forward batch, from the memory there is: activations of a 135M model on CPU,
    or a share of the free GPU memory for the 8B models."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(max(2048, min(65536, free // (2 * 1024 * 1024))))
    return 4096


@torch.inference_mode()
def loglikelihoods(model, tokenizer, pairs: list[tuple[str, str]], verbatim: list[bool] | None = None,
                   batch_tokens: int | None = None, progress: bool = False,
                   depths: list[int] | None = None) -> np.ndarray:
    """Sum of log-probs of each continuation given its context, one float per pair.

    With `depths`, an array [len(depths), len(pairs)]: row d holds the scores of the model cut
    to its bottom d layers (final norm and head applied to the residual stream after layer d),
    all from one forward pass. This equals running `prune_top(model, d)` (tested)."""
    verbatim = verbatim or [False] * len(pairs)
    device = next(model.parameters()).device
    batch_tokens = batch_tokens or default_batch_tokens(device)
    # Each pair needs the model's input (context + continuation minus its last token) and the
    # positions/targets of its continuation tokens; identical inputs run once.
    inputs: dict[tuple[int, ...], int] = {}
    requests = []  # (input index, first scored position, target ids)
    for (ctx, cont), vb in zip(pairs, verbatim):
        c, t = encode_pair(tokenizer, ctx, cont, vb)
        if not c or not t:
            raise ValueError(f"empty context or continuation after tokenisation: {ctx[-40:]!r} / {cont!r}")
        full = c + t
        key = tuple(full[:-1])
        requests.append((inputs.setdefault(key, len(inputs)), len(c) - 1, t))
    seqs = list(inputs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    by_input: dict[int, list[int]] = {}
    for r, (i, _, _) in enumerate(requests):
        by_input.setdefault(i, []).append(r)

    decoder, head = model.base_model, model.get_output_embeddings()
    taps: dict[int, torch.Tensor] = {}
    handles = []
    if depths is not None:
        adapter = adapter_for(model)
        for d in depths:
            if not 1 <= d <= adapter.n_layers:
                raise ValueError(f"depth {d} out of range 1..{adapter.n_layers}")
        norm = adapter.final_norm
        for d in sorted(set(depths)):
            def tap(module, args, output, d=d):
                taps[d] = adapter.layer_output(output)
            handles.append(adapter.layers[d - 1].register_forward_hook(tap))
    out = np.zeros((len(depths) if depths is not None else 1, len(pairs)))
    bar = tqdm(total=len(order), desc="scoring", disable=not progress, leave=False)
    try:
        start = 0
        while start < len(order):
            longest = len(seqs[order[start]])
            batch = order[start:start + max(1, batch_tokens // longest)]
            start += len(batch)
            ids = torch.full((len(batch), longest), tokenizer.pad_token_id, dtype=torch.long)
            for b, i in enumerate(batch):
                ids[b, : len(seqs[i])] = torch.tensor(seqs[i])
            # Right padding: a causal model's outputs at real positions never see the pads.
            last = decoder(input_ids=ids.to(device)).last_hidden_state
            # Every scored token of the batch: its row, position, target id and request.
            rows_, pos, tgt, req = [], [], [], []
            for b, i in enumerate(batch):
                for r in by_input[i]:
                    _, first, target = requests[r]
                    rows_ += [b] * len(target)
                    pos += range(first, first + len(target))
                    tgt += target
                    req += [r] * len(target)
            rows_t, pos_t = torch.tensor(rows_, device=device), torch.tensor(pos, device=device)
            tgt_t, req_t = torch.tensor(tgt, device=device)[:, None], torch.tensor(req)
            finals = [last] if depths is None else [norm(taps[d]) for d in depths]
            for row, hidden in enumerate(finals):
                logp = torch.log_softmax(head(hidden[rows_t, pos_t]).float(), dim=-1).gather(-1, tgt_t)[:, 0]
                sums = torch.zeros(len(pairs), dtype=torch.float64).index_add_(0, req_t, logp.double().cpu())
                done = req_t.unique().numpy()
                out[row, done] = sums.numpy()[done]
            bar.update(len(batch))
    finally:
        bar.close()
        for h in handles:
            h.remove()
    return out if depths is not None else out[0]


@dataclass
class Score:
    """Accuracy over `n` items with a 95% Wilson interval."""

    acc: float
    lo: float
    hi: float
    n: int
    correct: np.ndarray = field(repr=False)
    acc_norm: float = float("nan")

    def __str__(self) -> str:
        return f"{self.acc:.3f} [{self.lo:.3f}, {self.hi:.3f}] (n={self.n})"


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # At k = 0 or k = n one bound is exactly 0 or 1; say so rather than leave rounding error.
    return (0.0 if k == 0 else float(centre - half)), (1.0 if k == n else float(centre + half))


def choice_loglikelihoods(model, tokenizer, items: list[Item], **kw) -> list[np.ndarray]:
    """Log-likelihood of every choice of every item (one array per item; with `depths`, each
    array is [len(depths), n_choices])."""
    pairs = [p for it in items for p in it.pairs]
    verbatim = [it.verbatim for it in items for _ in it.pairs]
    flat = loglikelihoods(model, tokenizer, pairs, verbatim, **kw)
    out, i = [], 0
    for it in items:
        out.append(flat[..., i:i + len(it.pairs)])
        i += len(it.pairs)
    return out


def _score(lls: list[np.ndarray], items: list[Item]) -> Score:
    correct = np.array([int(np.argmax(ll)) == it.gold for ll, it in zip(lls, items)])
    lengths = [np.array([len(c) for _, c in it.pairs]) for it in items]
    norm = np.array([int(np.argmax(ll / n)) == it.gold for ll, n, it in zip(lls, lengths, items)])
    lo, hi = wilson(correct.sum(), len(items))
    return Score(float(correct.mean()), lo, hi, len(items), correct, float(norm.mean()))


def score(model, tokenizer, items: list[Item], **kw) -> Score:
    """lm-eval's `acc` (argmax of log-likelihood) and `acc_norm` (per character of the
    continuation) over the items. Over MMLU items this equals lm-eval's subject-size-weighted
    group accuracy, since weighting subjects by size is the plain mean over questions."""
    return _score(choice_loglikelihoods(model, tokenizer, items, **kw), items)


def score_by_depth(model, tokenizer, items: list[Item], depths: list[int], **kw) -> dict[int, Score]:
    """`score` of the model pruned to its bottom d layers, for every d in `depths`, from one
    forward pass per batch (see `loglikelihoods`)."""
    lls = choice_loglikelihoods(model, tokenizer, items, depths=list(depths), **kw)
    return {d: _score([ll[row] for ll in lls], items) for row, d in enumerate(depths)}


def _mean_with_interval(accs, ns) -> tuple[float, float, float]:
    """Unweighted mean of accuracies and a normal 95% interval from their binomial variances."""
    accs, ns = np.asarray(accs, dtype=float), np.asarray(ns, dtype=float)
    half = 1.96 * math.sqrt((accs * (1 - accs) / ns).sum() / len(accs) ** 2)
    m = float(accs.mean())
    return m, max(0.0, m - half), min(1.0, m + half)


def mean_over_tasks(table, by: str, name: str = "knowledge (mean)"):
    """For each value of `by`, the unweighted mean of the tasks' accuracies (rows of `table`
    with columns acc and n), as rows like the table's: by, benchmark, acc, lo, hi, n."""
    import pandas as pd

    rows = []
    for key, group in table.groupby(by):
        m, lo, hi = _mean_with_interval(group.acc, group.n)
        rows.append({by: key, "benchmark": name, "acc": m, "lo": lo, "hi": hi, "n": int(group.n.sum())})
    return pd.DataFrame(rows)


def mean_of_tasks(scores: dict[str, Score]) -> Score:
    """Unweighted mean of per-task accuracies (the release's knowledge score) with a normal
    95% interval from the tasks' binomial variances."""
    m, lo, hi = _mean_with_interval([s.acc for s in scores.values()], [s.n for s in scores.values()])
    correct = np.concatenate([s.correct for s in scores.values()])
    return Score(m, lo, hi, int(sum(s.n for s in scores.values())), correct)
