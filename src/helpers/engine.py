"""Exact ablation sweeps, several times faster than a forward pass of the whole set per ablation.

What an ablation at layer L cannot change is computed once:

- the residual stream entering each layer is computed once for the whole evaluation set; an
  ablation in layer L reruns only layers L and up from there;
- in attention models, all choices of a question share one row: the context, then each
  choice's continuation tokens, with a mask that lets a continuation read the context and itself
  only, and positions that restart after the context for each continuation (exact: the same
  queries meet the same keys at the same positions as in separate sequences);
- the vocabulary projection runs only where a continuation token is scored;
- several ablations of one layer run side by side as copies of the rows, each copy with its own
  heads silenced.

The results equal `evaluate.score` under `interventions.zero_heads` (tested); recurrent models
take the same path without the shared rows.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from .adapters import InterventionError, unwrap
from .evaluate import Score, _score, default_batch_tokens, encode_pair
from .tasks import FEWSHOT_DELIMITER, Item, kv_items


@dataclass
class Rows:
    """The evaluation set as model rows, longest first. For each scored token: its row, the
    position whose output predicts it, its id, and the (item, choice) pair it belongs to."""

    ids: torch.Tensor  # [R, T], right-padded
    lengths: torch.Tensor  # [R]
    positions: torch.Tensor  # [R, T]
    allowed: torch.Tensor | None  # [R, T, T] keys each query may read; None: causal
    row: torch.Tensor
    pos: torch.Tensor
    target: torch.Tensor
    pair: torch.Tensor
    n_pairs: int


def _shared_prefix(tokenizer, context: str, ctx: list[int]) -> tuple[int, ...]:
    """The context's tokens up to about its last few-shot delimiter (MMLU's description and
    solved examples): the longest run of the delimited text's tokens that the whole context
    also starts with (tokenisers may split the delimiter differently before the question)."""
    cut = context.rfind(FEWSHOT_DELIMITER)
    if cut < 0:
        return ()
    prefix = tokenizer.encode(context[: cut + len(FEWSHOT_DELIMITER)])
    k = 0
    while k < min(len(prefix), len(ctx) - 1) and prefix[k] == ctx[k]:
        k += 1
    return tuple(ctx[:k])


def pack(items: list[Item], tokenizer, shared_rows: bool, max_row_tokens: int = 2048) -> Rows:
    """Rows for `items`.

    shared_rows=False: one row per distinct model input, as `evaluate.loglikelihoods` runs them.
    shared_rows=True (attention models): one row holds a shared few-shot prefix once, then
    several questions, each followed by its choices' continuations; a mask lets a question read
    the prefix and itself, and a continuation the prefix, its question and itself, with
    positions numbered as if each stood alone."""
    encoded = [encode_pair(tokenizer, c, x, it.verbatim) for it in items for c, x in it.pairs]
    contexts = [c for it in items for c, _ in it.pairs]
    units: dict[tuple, list[int]] = {}  # a model input (shared rows: a context) -> its pairs
    for p, (ctx, cont) in enumerate(encoded):
        units.setdefault(tuple(ctx) if shared_rows else tuple(ctx + cont[:-1]), []).append(p)
    groups: dict[tuple, list[tuple]] = {}  # shared prefix -> units behind it
    for key, pairs in units.items():
        prefix = _shared_prefix(tokenizer, contexts[pairs[0]], list(key)) if shared_rows else ()
        groups.setdefault(prefix, []).append(key)

    rows = []  # (tokens, positions, unit per token, choice per token, scored)
    for prefix, keys in groups.items():
        row = None
        for key in keys:
            body = list(key[len(prefix):])
            size = len(body) + sum(len(encoded[p][1]) - 1 for p in units[key])
            if row is None or (prefix and len(row[0]) + size > max_row_tokens) or not prefix:
                row = (list(prefix), list(range(len(prefix))), [-1] * len(prefix), [0] * len(prefix), [])
                rows.append(row)
            tokens, pos, unit, choice, scored = row
            u = max(unit, default=-1) + 1
            tokens += body
            pos += range(len(prefix), len(key))
            unit += [u] * len(body)
            choice += [0] * len(body)
            last = len(tokens) - 1  # the position that predicts each continuation's first token
            for j, p in enumerate(units[key], start=1):
                cont = encoded[p][1]
                if shared_rows:
                    start = len(tokens)
                    tokens += cont[:-1]
                    pos += range(len(key), len(key) + len(cont) - 1)
                    unit += [u] * (len(cont) - 1)
                    choice += [j] * (len(cont) - 1)
                    preds = [last] + list(range(start, start + len(cont) - 1))
                else:
                    preds = list(range(len(encoded[p][0]) - 1, len(encoded[p][0]) - 1 + len(cont)))
                scored += [(q, t, p) for q, t in zip(preds, cont)]
    rows.sort(key=lambda r: -len(r[0]))
    T = len(rows[0][0])
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r[0] + [pad] * (T - len(r[0])) for r in rows])
    positions = torch.tensor([r[1] + list(range(len(r[1]), T)) for r in rows])
    allowed = None
    if shared_rows:
        unit = torch.tensor([r[2] + [-2] * (T - len(r[2])) for r in rows])
        choice = torch.tensor([r[3] + [0] * (T - len(r[3])) for r in rows])
        uq, uk = unit[:, :, None], unit[:, None, :]
        cq, ck = choice[:, :, None], choice[:, None, :]
        same = (uk == -1) | ((uk == uq) & ((ck == 0) | (ck == cq)))
        allowed = torch.ones(T, T, dtype=torch.bool).tril() & same & (uk != -2)
        allowed |= torch.eye(T, dtype=torch.bool)  # pads read themselves (no empty softmax rows)
    scored = [(i, q, t, p) for i, r in enumerate(rows) for q, t, p in r[4]]
    r, q, t, p = (torch.tensor(c) for c in zip(*scored))
    return Rows(ids, torch.tensor([len(r[0]) for r in rows]), positions, allowed, r, q, t, p, len(encoded))


class SweepEngine:
    """Exact scores of a model under head ablations on one evaluation set.

        engine = SweepEngine(loaded, items)
        engine.score({16: [0]})             # one ablation, any heads in any layers
        engine.head_sweep(layers=[16, 17])  # every head of these layers, one at a time
    """

    def __init__(self, model, tokenizer, items: list[Item], batch_tokens: int | None = None,
                 shared_rows: bool | None = None):
        self.model, self.adapter = unwrap(model)
        self.tokenizer, self.items = tokenizer, items
        self.device = next(self.model.parameters()).device
        shared = self.adapter.packs_candidates if shared_rows is None else shared_rows
        if shared and not self.adapter.packs_candidates:
            raise InterventionError(f"{self.adapter.family} models cannot share rows between choices")
        self.rows = pack(items, tokenizer, shared)
        self.batch_tokens = batch_tokens or default_batch_tokens(self.device)
        self._residuals: dict[int, list[torch.Tensor]] = {}
        self._choices = np.cumsum([0] + [len(it.pairs) for it in items])
        # Rows come longest first: fill each batch up to the token budget at its own length.
        r = self.rows
        self.batches, start = [], 0
        while start < len(r.ids):
            rows = max(1, self.batch_tokens // int(r.lengths[start]))
            self.batches.append(torch.arange(start, min(start + rows, len(r.ids))))
            start += rows
        # Each batch's scored tokens: (row within the batch, position, target id, pair index).
        self._scored = []
        for b in self.batches:
            sel = (r.row >= b[0]) & (r.row <= b[-1])
            self._scored.append((r.row[sel] - b[0], r.pos[sel], r.target[sel], r.pair[sel]))

    def _width(self, batch: torch.Tensor) -> int:
        return int(self.rows.lengths[batch[0]])

    def _run(self, hidden: torch.Tensor, batch: torch.Tensor, layers) -> torch.Tensor:
        r, dev, T = self.rows, self.device, self._width(batch)
        allowed = None if r.allowed is None else r.allowed[batch, :T, :T].to(dev)
        reps = hidden.shape[0] // len(batch)
        if reps > 1 and allowed is not None:
            allowed = allowed.repeat(reps, 1, 1)
        positions = r.positions[batch, :T].to(dev).repeat(reps, 1)
        for layer in layers:
            hidden = self.adapter.run_layer(self.adapter.layers[layer], hidden, positions, allowed)
        return hidden

    @torch.inference_mode()
    def residual(self, layer: int) -> list[torch.Tensor]:
        """The residual stream entering `layer`, per batch. Computed from the nearest cached layer
        below; sweeps go upwards, so only the newest is kept (memory stays one stream)."""
        if layer not in self._residuals:
            below = max([l for l in self._residuals if l < layer], default=None)
            embed = self.model.get_input_embeddings()
            start = [self._residuals[below][i] if below is not None
                     else embed(self.rows.ids[b, : self._width(b)].to(self.device))
                     for i, b in enumerate(self.batches)]
            self._residuals = {layer: [self._run(h, b, range(below or 0, layer)) for h, b in zip(start, self.batches)]}
        return self._residuals[layer]

    def _pair_loglik(self, hidden: torch.Tensor, i: int) -> torch.Tensor:
        """Per-pair log-likelihoods [replicas, n_pairs] from the final-layer outputs of batch i."""
        rows, pos, target, pair = self._scored[i]
        reps = hidden.shape[0] // len(self.batches[i])
        hidden = self.adapter.final_norm(hidden).unflatten(0, (reps, -1))
        head = self.model.get_output_embeddings()
        out = torch.zeros(reps, self.rows.n_pairs, dtype=torch.float64)
        for k in range(reps):
            logp = torch.log_softmax(head(hidden[k, rows.to(self.device), pos.to(self.device)]).float(), -1)
            out[k].index_add_(0, pair, logp.gather(-1, target.to(self.device)[:, None])[:, 0].double().cpu())
        return out

    def _start(self, layers: list[int], touched: list[int]) -> int:
        """Index in `layers` from which a run must be recomputed: the first layer that differs
        from the full model's order, or the first touched one; below it is the cached stream."""
        start = next((k for k, l in enumerate(layers) if l != k), len(layers))
        return min([start] + [layers.index(l) for l in touched])

    @contextmanager
    def _scaling(self, scales: dict[int, torch.Tensor], seen: dict[int, list] | None = None):
        """Head-site inputs multiplied by `scales[layer]` ([copies, heads * head_dim]), each copy of
        the rows by its own row. With `seen`, each call is recorded as `seen[layer]` =
        [(input, scaled input), ...], the scaled input requiring gradients (so that they can be
        taken with respect to it; gradients still flow through it from layers above)."""
        with ExitStack() as stack:
            for layer, scale in scales.items():
                def hook(module, args, scale=scale, layer=layer):
                    x, m = args[0], scale.to(args[0].device, args[0].dtype)
                    scaled = (x.unflatten(0, (len(m), -1)) * m[:, None, None, :]).flatten(0, 1)
                    if seen is not None:
                        if not scaled.requires_grad:  # the lowest scaled site: nothing below needs gradients
                            scaled.requires_grad_(True)
                        seen.setdefault(layer, []).append((x.detach(), scaled))
                    return (scaled,) + tuple(args[1:])
                stack.callback(self.adapter.head_site(layer).register_forward_pre_hook(hook).remove)
            yield

    def _loglikelihoods(self, scales: dict[int, torch.Tensor], layers: list[int]) -> torch.Tensor:
        copies = len(next(iter(scales.values()))) if scales else 1
        start = self._start(layers, list(scales))
        out = torch.zeros(copies, self.rows.n_pairs, dtype=torch.float64)
        with self._scaling(scales):
            for i, (b, h) in enumerate(zip(self.batches, self.residual(start))):
                out += self._pair_loglik(self._run(h.repeat(copies, 1, 1), b, layers[start:]), i)
        return out

    def _layers(self, layers: list[int] | None) -> list[int]:
        return list(range(self.adapter.n_layers)) if layers is None else [self.adapter.check_layer(l) for l in layers]

    @torch.inference_mode()
    def loglikelihoods(self, ablations: list[dict[int, list[int]]], layers: list[int] | None = None) -> np.ndarray:
        """[len(ablations), n_pairs] log-likelihoods, each ablation `{layer: [heads]}` applied
        alone, all run side by side. `layers`: the layers the model runs, in order (default all;
        a prefix is a pruned model, a gap a removed layer). Everything below the first ablated
        or missing layer comes from the cached residual stream."""
        layers = self._layers(layers)
        plans = [{l: self.adapter.check_heads(l, hs) for l, hs in a.items() if hs} for a in ablations]
        ablated = sorted({l for p in plans for l in p})
        if set(ablated) - set(layers):
            raise InterventionError(f"heads of layers {sorted(set(ablated) - set(layers))} are ablated but not run")
        scales = {}
        for layer in ablated:
            keep = torch.ones(len(plans), self.adapter.n_heads(layer))
            for k, p in enumerate(plans):
                keep[k, p.get(layer, [])] = 0
            scales[layer] = keep.repeat_interleave(self.adapter.head_dim(layer), dim=1)
        if not scales:
            return self._loglikelihoods({}, layers).repeat(len(plans), 1).numpy()
        return self._loglikelihoods(scales, layers).numpy()

    def score_loglikelihoods(self, flat: np.ndarray) -> Score:
        """The score of one row of `loglikelihoods` (one ablation)."""
        lls = [flat[a:b] for a, b in zip(self._choices[:-1], self._choices[1:])]
        return _score(lls, self.items)

    def score(self, ablation: dict[int, list[int]] | None = None, layers: list[int] | None = None) -> Score:
        return self.score_loglikelihoods(self.loglikelihoods([ablation or {}], layers)[0])

    @torch.inference_mode()
    def score_by_depth(self, depths) -> dict[int, Score]:
        """Scores of the model cut to its bottom d layers, for every d: each cut is the final
        norm and head applied to the residual stream after layer d, walked up once."""
        out = {}
        for d in sorted(depths):
            flat = sum(self._pair_loglik(h, i)[0] for i, h in enumerate(self.residual(self.adapter.check_layer(d - 1) + 1)))
            out[d] = self.score_loglikelihoods(flat.numpy())
        return out

    def layer_sweep(self, remove: list[int], layers: list[int] | None = None,
                    progress: bool = True) -> dict[int, Score]:
        """Remove each of `remove` alone from the model that runs `layers` (default all)."""
        layers = list(range(self.adapter.n_layers)) if layers is None else list(layers)
        return {l: self.score(layers=[k for k in layers if k != l])
                for l in tqdm(sorted(remove), desc="layer removal", disable=not progress)}

    def head_sweep(self, layers: list[int] | None = None, side_by_side: int | None = None,
                   progress: bool = True, model_layers: list[int] | None = None) -> dict[tuple[int, int], Score]:
        """Zero each head of these layers alone (default: every layer with heads) in the model
        that runs `model_layers` (default all); `side_by_side` heads of a layer run together
        (default: as many as fit the batch budget)."""
        layers = self.adapter.head_layers() if layers is None else sorted(layers)
        cells = [(l, h) for l in layers for h in range(self.adapter.n_heads(l))]
        # As many copies of the rows as the token budget holds beside the largest batch.
        k = side_by_side or max(1, self.batch_tokens // (self._width(self.batches[0]) * len(self.batches[0])))
        out = {}
        with tqdm(total=len(cells), desc="head sweep", disable=not progress) as bar:
            for layer in layers:
                heads = list(range(self.adapter.n_heads(layer)))
                for i in range(0, len(heads), k):
                    chunk = heads[i:i + k]
                    lls = self.loglikelihoods([{layer: [h]} for h in chunk], model_layers)
                    for h, ll in zip(chunk, lls):
                        out[layer, h] = self.score_loglikelihoods(ll)
                    bar.update(len(chunk))
        return out

    def _margins(self, flat):
        """Per item: log-softmax of the gold choice over the choices' log-likelihoods (torch)."""
        return [flat[a + it.gold] - torch.logsumexp(flat[a:z], 0)
                for a, z, it in zip(self._choices[:-1], self._choices[1:], self.items)]

    def margins(self, flat: np.ndarray) -> np.ndarray:
        """Per item: log-softmax of the gold choice over the choices' log-likelihoods."""
        return torch.stack(self._margins(torch.as_tensor(flat))).numpy()

    def attribution(self, model_layers: list[int] | None = None, alpha: float = 0.5,
                    progress: bool = True) -> dict[tuple[int, int], float]:
        """Attribution patching: for every head, an estimate of how zeroing it changes the mean
        gold margin (see `margins`): -(gradient x output), summed over its slice of the head site.

        The gradient of each layer's heads is taken with that layer's heads all scaled by
        `alpha` (one midpoint of integrated gradients along the layer's path to zero). At
        alpha=1 (plain attribution patching, the clean model's gradient, one pass for all
        layers) the first-order estimate can miss heads whose effect is far from linear, even
        the most harmful one (`benchmarks/sweep.py` ranks the exact sweep's heads both ways).
        Otherwise, per layer: a pass that weighs each log-likelihood in the margin, then a
        forward and backward pass from the cached residual stream entering the layer, batch by
        batch (memory: one batch's graph). `model_layers`: the layers the model runs (default
        all)."""
        model_layers = self._layers(model_layers)
        layers = [l for l in self.adapter.head_layers() if l in model_layers]
        groups = [layers] if alpha == 1 else [[l] for l in layers]
        out = {}
        for group in tqdm(groups, desc="attribution", disable=not progress or len(groups) == 1):
            scales = {l: torch.full((1, self.adapter.n_heads(l) * self.adapter.head_dim(l)), float(alpha))
                      for l in group}
            with torch.inference_mode():
                flat = self._loglikelihoods(scales, model_layers)[0]
            flat = flat.clone().requires_grad_(True)
            torch.stack(self._margins(flat)).mean().backward()
            weight = flat.grad  # d(mean margin) / d(each pair's log-likelihood)
            start = self._start(model_layers, group)
            effect = {l: 0 for l in group}
            seen: dict[int, list] = {}
            with self._scaling(scales, seen), torch.enable_grad():
                for i, (b, h) in enumerate(zip(self.batches, self.residual(start))):
                    lls = self._pair_loglik(self._run(h.clone(), b, model_layers[start:]), i)[0]
                    sites = [seen.pop(l)[0] for l in group]
                    grads = torch.autograd.grad((lls * weight).sum(), [scaled for _, scaled in sites])
                    for l, (x, _), g in zip(group, sites, grads):
                        effect[l] = effect[l] - (g * x).sum(dim=tuple(range(x.dim() - 1))).double().cpu()
            for l in group:
                for head, value in enumerate(effect[l].view(self.adapter.n_heads(l), -1).sum(-1).tolist()):
                    out[l, head] = value
        return out

    def rank_heads(self, top: int = 10, layers: list[int] | None = None,
                   model_layers: list[int] | None = None, alpha: float = 0.5) -> "pd.DataFrame":
        """Heads ranked by ablation. The attribution screen estimates every head; the layers
        of its `top` heads (at least two; or `layers`) are then swept exactly, every head of them. One row per
        head, the exactly measured ones first, most harmful first; `acc` is empty elsewhere."""
        import pandas as pd

        estimate = self.attribution(model_layers, alpha)
        if not layers:
            order = [l for l, _ in sorted(estimate, key=estimate.get)]
            layers = sorted(set(order[:top]))
            if len(layers) < 2:  # a Gather/Aggregate pair needs two layers: the next one in the screen's order
                layers = sorted(layers + [l for l in order if l not in layers][:1])
        exact = self.head_sweep(layers=layers, model_layers=model_layers, progress=False)
        rows = [dict(layer=l, head=h, estimate=e, **({"acc": exact[l, h].acc, "lo": exact[l, h].lo,
                                                      "hi": exact[l, h].hi, "n": exact[l, h].n} if (l, h) in exact else {}))
                for (l, h), e in estimate.items()]
        return pd.DataFrame(rows).sort_values(["acc", "estimate"], na_position="last").reset_index(drop=True)


def gather_aggregate_pair(ranking) -> tuple[tuple[int, int], tuple[int, int]]:
    """A candidate Gather/Aggregate pair from a ranking: the most harmful measured head and the
    most harmful measured head of another layer, the lower one as Gather (G&A spans two layers,
    Gather below Aggregate)."""
    measured = ranking.dropna(subset=["acc"])
    best = tuple(int(v) for v in measured[["layer", "head"]].iloc[0])
    other = measured[measured.layer != best[0]]
    if other.empty:
        raise ValueError(f"only layer {best[0]} was swept exactly; a Gather/Aggregate pair needs two: "
                         "sweep more layers (a larger `top`, or name `layers`)")
    second = tuple(int(v) for v in other[["layer", "head"]].iloc[0])
    return tuple(sorted([best, second]))


def kv_head_ranking(loaded, pairs: int = 8, n: int = 40, seed: int = 0, query: str = "repeat", top: int = 10,
                    trailing_space: bool = False, alpha: float = 0.5):
    """The KV-retrieval head ranking (`SweepEngine.rank_heads`) that several chapters share,
    kept in the results store so that it is computed once per setting."""
    import pandas as pd

    from .sweep import Store, results_dir, sweep

    def run(cell):
        items = kv_items(pairs, n, seed=seed, query=query, trailing_space=trailing_space)
        engine = SweepEngine(loaded, loaded.tokenizer, items)
        clean = engine.score()
        return {"clean": [clean.acc, clean.lo, clean.hi, clean.n],
                "table": engine.rank_heads(top, alpha=alpha).to_dict("records")}

    store = Store(results_dir("head_ranking") / f"{loaded.name}.jsonl")
    cell = dict(pairs=pairs, n=n, seed=seed, query=query, top=top, trailing_space=trailing_space, alpha=alpha)
    row = sweep(store, [cell], run, desc="head ranking")[0]
    return row["clean"], pd.DataFrame(row["table"])
