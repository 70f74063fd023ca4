"""Exact ablation sweeps, several times faster than a forward pass of the whole set per ablation.

What an ablation at layer L cannot change is computed once:

- the residual stream entering each layer is computed once for the whole evaluation set; an
  ablation in layer L reruns only layers L and up from there;
- in attention models, all choices of a question share one row: the context, then each
  choice's continuation tokens, with a mask that lets a continuation read the context and itself
  only, and positions that restart after the context for each continuation (exact: the same
  queries meet the same keys at the same positions as in separate sequences);
- the vocabulary projection runs only where a continuation token is scored.

Every pass has the shape `packing.batches` gives the clean run's batches, whatever the
ablation, so an item's log-likelihoods in bfloat16 are the same alone, in any set and under an
ablation beside any other (`tests/test_batch_invariance.py`, exactly), wherever its row holds it
alone (0-shot questions, KV prompts; few-shot questions share a row behind their prefix).

The results equal `evaluate.score` under the same spec (tested in float32, to 2e-4);
recurrent models take the same path without the shared rows. In bfloat16 (the paper's models,
the CPU models) the two sum in other orders and agree to its rounding only, which is as far from
float32 as lm-eval's own bfloat16 scores: measured on 100 items each, mean |bfloat16 - float32|
over every choice, engine / plain scorer / lm-eval one request per pass: Qwen-1.5B letter
questions 0.035 / 0.037 / 0.037 nats (largest 0.15 / 0.17 / 0.22, no pick changed), SmolLM2 KV
prompts of 8 keys 0.151 / 0.153 / 0.156 (largest 1.14 / 1.27 / 1.16; 2 / 6 / 4 picks of 100
changed: a near tie falls either way in bfloat16 whatever computes it).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import numpy as np
import torch
import torch.utils.checkpoint

from .adapters import unwrap
from .errors import InterventionError, as_index
from .evaluate import from_loglikelihoods
from .heads import Head, ablation
from .hooks import HEAD, hooked
from .interventions import replaced_site, site_width
from .packing import batches, default_batch_tokens, default_row_tokens, pack
from .progress import bar
from .specs import Spec
from .stats import Score
from .tasks import Item


class SweepEngine:
    """Exact scores of a model under interventions (`specs.Spec`) on one evaluation set.

    engine = SweepEngine(loaded, loaded.tokenizer, items)
    engine.score("zero L16H0,L17H3")     # one intervention (`specs.Spec` or its text)
    engine.score_each({"G": g, "A": a})  # several, side by side where batches have room
    engine.head_sweep(layers=[16, 17])   # every head of these layers, one at a time
    """

    def __init__(
        self,
        model,
        tokenizer,
        items: list[Item],
        batch_tokens: int | None = None,
        shared_rows: bool | None = None,
    ):
        self.model, self.adapter = unwrap(model)
        self.tokenizer, self.items = tokenizer, items
        self.device = next(self.model.parameters()).device
        shared = self.adapter.packs_candidates if shared_rows is None else shared_rows
        if shared and not self.adapter.packs_candidates:
            raise InterventionError(
                f"{self.adapter.family} models cannot share rows between choices"
            )
        self.batch_tokens = batch_tokens or default_batch_tokens(self.device)
        self.rows, self.batches = batches(
            pack(items, tokenizer, shared, default_row_tokens(self.device)), self.batch_tokens
        )
        self._residuals: dict[int, list[torch.Tensor]] = {}
        self._choices = np.cumsum([0] + [len(it.pairs) for it in items])

    def run_layers(
        self,
        hidden: torch.Tensor,
        batch,
        layers,
        checkpoint: bool = False,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run `layers` on a batch's residual stream, whose rows hold the batch's rows `slots`
        (default: each its own; see `slots`). With
        `checkpoint`, a gradient pass keeps only each layer's input and recomputes the layer's
        activations when its backward runs (`torch.utils.checkpoint`: the same operations on the
        same inputs, so the same values), so that its graph holds one layer's activations, not
        every layer's: a 1,700-token row of Qwen-1.5B holds some 10 GB otherwise."""
        r, dev, T = self.rows, self.device, batch.width
        rows = batch.rows if slots is None else batch.rows[slots]
        allowed = None if r.allowed is None else r.allowed[rows, :T, :T].to(dev)  # [rows, T, T]
        positions = r.positions[rows, :T].to(dev)  # [rows, T]
        embeddings = None
        if self.adapter.reads_embeddings:
            embeddings = (
                self.embeddings(batch) if slots is None else self.embeddings(batch)[slots.to(dev)]
            )
        for layer in layers:
            block = self.adapter.layers[layer]
            if checkpoint and torch.is_grad_enabled():
                hidden = torch.utils.checkpoint.checkpoint(
                    self.adapter.run_layer,
                    block,
                    hidden,
                    positions,
                    allowed,
                    embeddings,
                    use_reentrant=False,
                )
            else:
                # [rows, T, width] in and out
                hidden = self.adapter.run_layer(block, hidden, positions, allowed, embeddings)
        return hidden

    @torch.inference_mode()
    def residual(self, layer: int) -> list[torch.Tensor]:
        """The residual stream entering `layer`, per batch. Computed from the nearest cached layer
        below; sweeps go upwards, so only the newest is kept (memory stays one stream)."""
        if layer not in self._residuals:
            below = max([l for l in self._residuals if l < layer], default=None)
            start = [
                self._residuals[below][i] if below is not None else self.embeddings(b)
                for i, b in enumerate(self.batches)
            ]
            self._residuals = {
                layer: [
                    self.run_layers(h, b, range(below or 0, layer))
                    for h, b in zip(start, self.batches)
                ]
            }
        return self._residuals[layer]

    def embeddings(self, batch) -> torch.Tensor:
        """The token embeddings of a batch's rows: the residual stream entering layer 0 (and what
        Zamba2's hybrid layers read again, `adapter.reads_embeddings`)."""
        with torch.no_grad():
            ids = self.rows.ids[batch.rows, : batch.width].to(self.device)  # [rows, T]
            return self.model.get_input_embeddings()(ids)  # [rows, T, width]

    def pair_loglikelihoods(self, hidden: torch.Tensor, i: int, copies: int = 1) -> torch.Tensor:
        """Per-pair log-likelihoods [copies, n_pairs] from the final-layer outputs of batch i
        whose rows hold `copies` copies of its real rows (`slots`)."""
        b = self.batches[i]
        hidden = self.adapter.final_norm(hidden)
        head = self.model.get_output_embeddings()
        out = torch.zeros(copies, self.rows.n_pairs, dtype=torch.float64)  # [copies, n_pairs]
        for k in range(copies):
            out[k].index_add_(
                0,
                b.pair,
                b.logprobs(hidden, head, offset=k * self.batches[i].n_real * b.width)
                .double()
                .cpu(),
            )
        return out

    def fits(self, i: int) -> int:
        """How many copies of batch i's real rows its height holds."""
        return len(self.batches[i].rows) // self.batches[i].n_real

    def slots(self, i: int, copies: int) -> torch.Tensor:
        """Which of batch i's rows each row of a pass holds: its real rows `copies` times side by
        side, then its filler rows to its height. Each ablation of a pass is one copy, so several
        run at once where a batch has room (a small set), in the clean run's shape: an item rounds
        alike whatever runs beside it (`packing.batches`)."""
        n, height = self.batches[i].n_real, len(self.batches[i].rows)
        # [height]: copies * n real rows, then the fillers
        return torch.cat([torch.arange(n).repeat(copies), torch.arange(copies * n, height)])

    def per_row(self, values: torch.Tensor, i: int, fill) -> torch.Tensor:
        """Per-copy values [copies, ...] as per-row values [height, ...] of batch i's pass
        (`slots`): each copy's rows take its value, filler rows `fill`."""
        n, height = self.batches[i].n_real, len(self.batches[i].rows)
        rest = torch.full((height - len(values) * n, *values.shape[1:]), fill, dtype=values.dtype)
        return torch.cat([values.repeat_interleave(n, 0), rest])

    def first_recomputed(self, layers: list[int], touched: list[int]) -> int:
        """Index in `layers` from which a run must be recomputed: the first layer that differs
        from the full model's order, or the first touched one; below it is the cached stream."""
        start = next((k for k, l in enumerate(layers) if l != k), len(layers))
        return min([start] + [layers.index(l) for l in touched])

    @contextmanager
    def scaling(self, scales: dict[int, torch.Tensor], seen: dict[int, list] | None = None):
        """Head-site inputs multiplied by `scales[layer]` ([copies, heads * head_dim]), each copy of
        the rows by its own row. With `seen`, each call is recorded as `seen[layer]` =
        [(input, scaled input), ...], the scaled input requiring gradients (so that they can be
        taken with respect to it; gradients still flow through it from layers above)."""

        def scale_rows(x, scale, layer):
            m = scale.to(x.device, x.dtype)  # [copies, heads * head_dim]
            # x [copies * rows, T, heads * head_dim] -> [copies, rows, T, ...] scaled -> back
            scaled = (x.unflatten(0, (len(m), -1)) * m[:, None, None, :]).flatten(0, 1)
            if seen is not None:
                # the lowest scaled site: nothing below needs gradients
                if not scaled.requires_grad:
                    scaled.requires_grad_(True)
                seen.setdefault(layer, []).append((x.detach(), scaled))
            return scaled

        with hooked(
            self.adapter,
            {
                (HEAD, layer): partial(scale_rows, scale=scale, layer=layer)
                for layer, scale in scales.items()
            },
        ):
            yield

    def scaled_loglikelihoods(
        self, scales: dict[int, torch.Tensor], layers: list[int]
    ) -> torch.Tensor:
        """[copies, n_pairs] log-likelihoods with each layer's head-site input multiplied by
        `scales[layer]` ([copies, heads * head_dim]; see `scaling`). The copies share a batch's
        passes as far as its height holds them (`slots`), in the clean run's shapes, so that in
        bfloat16 an item rounds alike under every ablation and beside any other (`packing.batches`)."""
        copies = len(next(iter(scales.values()))) if scales else 1
        start = self.first_recomputed(layers, list(scales))
        out = torch.zeros(copies, self.rows.n_pairs, dtype=torch.float64)
        for i, (b, h) in enumerate(zip(self.batches, self.residual(start))):
            for k in range(0, copies, self.fits(i)):
                chunk = slice(k, min(copies, k + self.fits(i)))
                slots = self.slots(i, chunk.stop - k)
                with self.scaling(
                    {layer: self.per_row(scale[chunk], i, 1.0) for layer, scale in scales.items()}
                ):
                    out[chunk] += self.pair_loglikelihoods(
                        self.run_layers(h[slots], b, layers[start:], slots=slots), i, chunk.stop - k
                    )
        return out

    def specs(self, specs) -> list[tuple[Spec, list[int]]]:
        """Each spec (or its text) read and checked against the model, with the layers it runs."""
        out = []
        for spec in map(Spec.parse, specs):
            out.append((spec, spec.check(self.adapter)))
        return out

    @torch.inference_mode()
    def loglikelihoods(self, specs: list[Spec | str]) -> np.ndarray:
        """[len(specs), n_pairs] log-likelihoods, each spec (its zeroed heads and the layers it
        runs) applied alone, side by side: specs that run the same layers share passes.
        Everything below a spec's first zeroed or missing layer comes from the cached residual
        stream. Heads replaced by values: `replaced`."""
        checked = self.specs(specs)
        if others := [str(s) for s, _ in checked if s.replaced != s.zero]:
            raise InterventionError(
                f"{others[0]}: heads replaced by values are scored by `replaced`, which takes "
                "the values; `loglikelihoods` zeroes heads and runs layers"
            )
        groups: dict[tuple[int, ...], list[int]] = {}
        for k, (_, runs) in enumerate(checked):
            groups.setdefault(tuple(runs), []).append(k)
        out = np.zeros((len(checked), self.rows.n_pairs))
        for runs, members in groups.items():
            out[members] = self.zeroed([checked[k][0].ablation for k in members], list(runs))
        return out

    def zeroed(self, plans: list[dict[int, list[int]]], layers: list[int]) -> np.ndarray:
        """[len(plans), n_pairs] log-likelihoods with each plan's heads ({layer: [heads]},
        checked) zeroed, in the model that runs `layers` (checked)."""
        scales = {}
        for layer in sorted({l for p in plans for l in p}):
            keep = torch.ones(len(plans), self.adapter.n_heads(layer))  # [specs, heads]
            for k, p in enumerate(plans):
                keep[k, p.get(layer, [])] = 0
            # [specs, heads * head_dim]
            scales[layer] = keep.repeat_interleave(self.adapter.head_dim(layer), dim=1)
        if not scales:
            return self.scaled_loglikelihoods({}, layers).repeat(len(plans), 1).numpy()
        return self.scaled_loglikelihoods(scales, layers).numpy()

    def score_loglikelihoods(self, flat: np.ndarray) -> Score:
        """The score of one row of `loglikelihoods` (one ablation)."""
        lls = [flat[a:b] for a, b in zip(self._choices[:-1], self._choices[1:])]
        return from_loglikelihoods(lls, self.items)

    def score(self, spec: Spec | str | None = None) -> Score:
        """The score under one spec (default: the model as it is)."""
        return self.score_loglikelihoods(self.loglikelihoods([Spec.parse(spec)])[0])

    @torch.inference_mode()
    def score_by_depth(self, depths) -> dict[int, Score]:
        """Scores of the model cut to its bottom d layers, for every d: each cut is the final
        norm and head applied to the residual stream after layer d, walked up once."""
        n = self.adapter.n_layers
        checked = [as_index(d) for d in depths]
        if bad := [d for d, k in zip(depths, checked) if k is None or not 1 <= k <= n]:
            raise InterventionError(
                f"score_by_depth takes depths 1..{n} (how many bottom layers the cut model keeps), "
                f"got {bad}"
            )
        out = {}
        for d in sorted(checked):
            flat = sum(self.pair_loglikelihoods(h, i)[0] for i, h in enumerate(self.residual(d)))
            out[d] = self.score_loglikelihoods(flat.numpy())
        return out

    def layer_sweep(
        self, remove: list[int], within: Spec = Spec(), progress: bool = True
    ) -> dict[int, Score]:
        """Remove each of `remove` alone from the model `within` runs (default: all layers)."""
        return {
            l: self.score(within.removing(l))
            for l in bar(sorted(remove), desc="layer removal", disable=not progress)
        }

    def score_each(self, specs: dict[str, Spec | str]) -> dict[str, Score]:
        """The score under each named spec. Specs that run the same layers run lowest recomputed
        layer first: the residual cache keeps only its newest stream, so a run starting below it
        would recompute the model from the embedding (the clean model first, then a head of layer
        22, then one of 21, cost three full passes where one and their tails do). Specs that
        recompute from the same layer share passes (`loglikelihoods`); so do those of nearby
        layers, as many as every batch has room for, from the lowest of them (a small set: filler
        rows otherwise)."""
        checked = dict(zip(specs, self.specs(specs.values())))
        start = lambda name: self.first_recomputed(
            checked[name][1], list(checked[name][0].ablation)
        )
        room = min(self.fits(i) for i in range(len(self.batches)))
        by_layers: dict[tuple[int, ...], list[str]] = {}
        for name, (_, runs) in checked.items():
            by_layers.setdefault(tuple(runs), []).append(name)
        groups: list[list[str]] = []
        for names in by_layers.values():
            groups.append([])
            for name in sorted(names, key=start):
                if not groups[-1] or len(groups[-1]) < room or start(name) == start(groups[-1][0]):
                    groups[-1].append(name)
                else:
                    groups.append([name])
        out = {}
        for group in groups:
            for name, ll in zip(group, self.loglikelihoods([checked[n][0] for n in group])):
                out[name] = self.score_loglikelihoods(ll)
        return {name: out[name] for name in specs}

    def head_sweep(
        self, layers: list[int] | None = None, progress: bool = True, within: Spec = Spec()
    ) -> dict[Head, Score]:
        """Zero each head of these layers alone (default: every layer with heads) in the model
        `within` runs (default: as it is; its own zeroed heads stay zeroed)."""
        return {
            head: self.score_loglikelihoods(ll)
            for head, ll in self.head_loglikelihoods(layers, progress, within).items()
        }

    def head_loglikelihoods(
        self, layers: list[int] | None = None, progress: bool = True, within: Spec = Spec()
    ) -> dict[Head, np.ndarray]:
        """`head_sweep` before its scoring: per head zeroed alone, its row of `loglikelihoods`,
        from which both the score (`score_loglikelihoods`) and the gold answer's margin (`margins`)
        are read."""
        layers = self.adapter.head_layers() if layers is None else sorted(layers)
        out = {}
        with bar(
            total=sum(self.adapter.n_heads(l) for l in layers),
            desc="head sweep",
            disable=not progress,
        ) as meter:
            # a layer's heads in one call, side by side where a batch has room (`slots`)
            for layer in layers:
                heads = [Head(layer, h) for h in range(self.adapter.n_heads(layer))]
                for head, ll in zip(heads, self.loglikelihoods([within.zeroing(h) for h in heads])):
                    out[head] = ll
                meter.update(len(heads))
        return out

    def margins(self, flat: torch.Tensor) -> torch.Tensor:
        """Per item: log-softmax of the gold choice over the choices' log-likelihoods, from one
        row of `loglikelihoods` (differentiable: the screen takes its gradient)."""
        flat = torch.as_tensor(flat)
        return torch.stack(
            [
                flat[a + it.gold] - torch.logsumexp(flat[a:z], 0)
                for a, z, it in zip(self._choices[:-1], self._choices[1:], self.items)
            ]
        )

    # --- mean and resample ablation: heads' outputs replaced, not zeroed ------------------------

    @torch.inference_mode()
    def site_inputs(self, layer: int) -> list[torch.Tensor]:
        """What enters `layer`'s head site (its output projection) in the unablated model, per
        batch [rows, T, heads * head_dim] (padding included; `valid` says which tokens are real)."""
        seen: list[torch.Tensor] = []
        with hooked(self.adapter, {(HEAD, layer): lambda x: seen.append(x.clone())}):
            for b, h in zip(self.batches, self.residual(layer)):
                self.run_layers(h, b, [layer])
        return seen

    def valid(self, i: int) -> torch.Tensor:
        """[rows, T] True at batch i's real tokens (not right padding)."""
        b = self.batches[i]
        return torch.arange(b.width)[None, :] < self.rows.lengths[b.rows][:, None]

    def site_mean(self, layer: int) -> torch.Tensor:
        """The mean of `layer`'s head-site input over every real token of every row (contexts and
        continuations): [heads * head_dim], float64 summed (a mean ablation's value)."""
        total, count = 0, 0
        for i, x in enumerate(self.site_inputs(layer)):
            keep = self.valid(i).to(x.device)
            total = total + x[keep].double().sum(0)
            count += int(keep.sum())
        return (total / count).float().cpu()

    def same_layout(self, other: "SweepEngine") -> bool:
        """Whether `other`'s rows line up with ours token by token (same rows, lengths, positions,
        masks and scored tokens' places): then its site inputs can stand in for ours batch by
        batch, position by position (a resample ablation)."""
        a, b = self.rows, other.rows
        same = lambda x, y: (
            (x is None and y is None)
            or (x is not None and y is not None and x.shape == y.shape and bool((x == y).all()))
        )
        return (
            all(
                same(getattr(a, f), getattr(b, f))
                for f in ("lengths", "positions", "allowed", "row", "pos", "pair")
            )
            and a.ids.shape == b.ids.shape
            and self.batch_tokens == other.batch_tokens
        )

    @torch.inference_mode()
    def replaced(
        self,
        specs: list[Spec | str],
        values: dict[int, torch.Tensor | list[torch.Tensor]],
    ) -> np.ndarray:
        """[len(specs), n_pairs] log-likelihoods with each spec's heads replaced, not
        zeroed (`interventions.replaced_site`): `values[layer]` is one vector [heads * head_dim]
        (zeros: zero ablation; `site_mean` of a reference set: mean ablation) or, per batch, a
        tensor [rows, T, heads * head_dim] (`site_inputs` of another engine whose rows have our
        layout, `same_layout`: resample ablation, patching), in the full model, one after another
        (as in `scaled_loglikelihoods`). Whichever kind a spec names its heads by (zero, mean,
        resample, patch), what replaces them is `values`: the caller computed them for that kind."""
        checked = self.specs(specs)
        layers = list(range(self.adapter.n_layers))
        if pruned := [str(s) for s, runs in checked if runs != layers]:
            raise InterventionError(f"{pruned[0]}: heads are replaced in the full model only")
        plans = [ablation(s.replaced) for s, _ in checked]
        touched = sorted({l for p in plans for l in p})
        if missing := [l for l in touched if l not in values]:
            raise InterventionError(f"no replacement values for layer(s) {missing}")
        keeps = {}
        for layer in touched:
            # [ablations, heads]
            keep = torch.ones(len(plans), self.adapter.n_heads(layer), dtype=torch.bool)
            for k, p in enumerate(plans):
                keep[k, p.get(layer, [])] = False
            # [ablations, heads * head_dim]
            keeps[layer] = keep.repeat_interleave(self.adapter.head_dim(layer), dim=1)
            v = values[layer]
            per_batch = isinstance(v, (list, tuple))
            if per_batch and len(v) != len(self.batches):
                raise InterventionError(
                    f"values[{layer}] holds {len(v)} batches, the engine has {len(self.batches)}"
                )
            widths = [t.shape[-1] for t in (v if per_batch else [v])]
            if any(w != site_width(self.adapter, layer) for w in widths):
                raise InterventionError(
                    f"values[{layer}] must end in the site's width {site_width(self.adapter, layer)}"
                )
        start = self.first_recomputed(layers, touched)
        out = torch.zeros(len(plans), self.rows.n_pairs, dtype=torch.float64)
        current = {}  # what the hooks apply in this pass: per layer, (keep [rows, 1, width], value)

        def replace(x, layer):
            keep, value = current[layer]
            return replaced_site(x, keep, value)

        with hooked(
            self.adapter, {(HEAD, layer): partial(replace, layer=layer) for layer in touched}
        ):
            for i, (b, h) in enumerate(zip(self.batches, self.residual(start))):
                for k in range(0, len(plans), self.fits(i)):
                    chunk = slice(k, min(len(plans), k + self.fits(i)))
                    slots = self.slots(i, chunk.stop - k)
                    for layer in touched:
                        v = values[layer]
                        # keep [height, 1, width]; value [width] or, resampled, [height, T, width]
                        current[layer] = (
                            self.per_row(keeps[layer][chunk], i, True)[:, None, :],
                            v[i][slots.to(v[i].device)] if isinstance(v, (list, tuple)) else v,
                        )
                    out[chunk] += self.pair_loglikelihoods(
                        self.run_layers(h[slots], b, layers[start:], slots=slots), i, chunk.stop - k
                    )
        return out.numpy()

    def score_replaced(self, specs: dict[str, Spec | str], values: dict) -> dict:
        """The score under each named spec, its heads replaced by `values` (see `replaced`)."""
        return {
            name: self.score_loglikelihoods(self.replaced([spec], values)[0])
            for name, spec in specs.items()
        }

    # --- activation patching: heads' outputs taken from another run of the same layout ----------

    def patched(
        self, specs: dict[str, Spec | str], source: "SweepEngine", progress: bool = True
    ) -> dict:
        """Activation patching: for each named spec (its heads named by `patch`), the [n_pairs]
        log-likelihoods of our rows with those heads' site inputs taken from `source`'s unablated
        run (typically ours the corrupted prompts, `source` the clean ones), batch by batch and
        position by position (`replaced` with `source.site_inputs`; `same_layout` checked). The
        specs run lowest layer first, so that both engines' cached residual streams walk up the
        model once; only the layers the current spec patches are held."""
        if not self.same_layout(source):
            raise InterventionError(
                "patching needs the source run's rows to line up with ours token by token "
                "(`same_layout`): build the corrupted prompts with the clean prompts' layout"
            )
        plans = {name: ablation(Spec.parse(spec).replaced) for name, spec in specs.items()}
        names = sorted(plans, key=lambda n: min(plans[n], default=0))
        held: dict[int, list[torch.Tensor]] = {}
        out = {}
        for name in bar(names, desc="patching", disable=not progress):
            held = {l: held[l] if l in held else source.site_inputs(l) for l in sorted(plans[name])}
            out[name] = self.replaced([specs[name]], held)[0]
        return out
