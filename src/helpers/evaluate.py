"""The plain scorer: log-likelihoods of every choice of every item, from whole forward passes of
the model as it stands (under whatever interventions are active), in lm-eval's conventions.

It is the reference the sweep engine is tested against, so it stays simple: the rows of
`packing.pack` (one per distinct model input), batched, run through the model, and the
vocabulary projection taken only where a continuation token is scored.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, ContextManager

import numpy as np
import torch

from .packing import batches, default_batch_tokens, pack
from .progress import bar
from .specs import Spec
from .stats import Score, mean_of
from .tasks import Item


@torch.inference_mode()
def choice_loglikelihoods(
    model,
    tokenizer,
    items: list[Item],
    batch_tokens: int | None = None,
    progress: bool = False,
    per_batch: Callable[[torch.Tensor, int], ContextManager] | None = None,
) -> list[np.ndarray]:
    """Log-likelihood of every choice of every item (one array per item). `per_batch(lengths,
    width)`, if given, is entered around each batch's forward pass with the batch's row lengths
    and width, for an intervention that depends on where each row ends
    (`attention.mask_final_rows`)."""
    device = next(model.parameters()).device
    rows, laid_out = batches(
        pack(items, tokenizer, shared_rows=False), batch_tokens or default_batch_tokens(device)
    )
    head = model.get_output_embeddings()
    flat = torch.zeros(rows.n_pairs, dtype=torch.float64)
    for b in bar(laid_out, desc="scoring", disable=not progress, leave=False):
        # Right padding: a causal model's outputs at real positions never see the pads. A filler
        # row (length 0) is given one token, so that `per_batch` sees only positive lengths.
        with per_batch(rows.lengths[b.rows].clamp(min=1), b.width) if per_batch else nullcontext():
            hidden = model.base_model(
                input_ids=rows.ids[b.rows, : b.width].to(device)
            ).last_hidden_state
        flat.index_add_(0, b.pair, b.logprobs(hidden, head).double().cpu())
    bounds = np.cumsum([0] + [len(it.pairs) for it in items])
    return [flat[a:z].numpy() for a, z in zip(bounds[:-1], bounds[1:])]


def from_loglikelihoods(lls: list[np.ndarray], items: list[Item]) -> Score:
    """lm-eval's `acc`: an item is right when its gold choice has the highest log-likelihood.
    Over MMLU items this equals lm-eval's subject-size-weighted group accuracy (weighting
    subjects by size is the plain mean over questions)."""
    return Score.of(
        [int(np.argmax(ll)) == it.gold for ll, it in zip(lls, items)],
        [ll[it.gold] - np.delete(ll, it.gold).max(initial=-np.inf) for ll, it in zip(lls, items)],
    )


def score(model, tokenizer, items: list[Item], spec: Spec | str | None = None, **kw) -> Score:
    """lm-eval's `acc` over the items, with a 95% interval (see `choice_loglikelihoods`), under
    `spec` (default: the model as it stands); the model is left as it was."""
    with Spec.parse(spec).applied(model):
        return from_loglikelihoods(choice_loglikelihoods(model, tokenizer, items, **kw), items)


def mean_over_tasks(table, by: str, name: str = "knowledge (mean)"):
    """For each value of `by`, the unweighted mean of the tasks' accuracies (rows of `table`
    with columns acc and n), as rows like the table's: by, benchmark, acc, lo, hi, n."""
    import pandas as pd

    rows = []
    for key, group in table.groupby(by):
        m, lo, hi = mean_of(group.acc, group.n)
        rows.append(
            {by: key, "benchmark": name, "acc": m, "lo": lo, "hi": hi, "n": int(group.n.sum())}
        )
    return pd.DataFrame(rows)
