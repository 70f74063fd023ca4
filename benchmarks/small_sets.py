"""What the engine's shared passes save on small sets (the smoke books' and the paper profile's
rehearsal sizes), measured side by side in one process on the same prompts:

1. a head sweep of one layer: every head's ablation in its own call (one copy per pass, the rest
   of each fixed-shape batch filler rows) against one call per layer (`head_loglikelihoods`:
   as many copies per pass as a batch holds);
2. the layer scan (each layer's whole attention zeroed in turn): one call per ablation against
   `score_each`, which runs ablations of nearby layers in one pass from the lowest of them;
3. a clean pass with the mask and rotary embeddings built in every layer against once per pass
   (`LlamaAdapter.pass_inputs`).

Each pair must give the same log-likelihoods bit for bit (the same shapes, the same rows); the
script stops otherwise. It prints each ratio, best of `--repeats`.

    python benchmarks/small_sets.py                      # SmolLM2-135M, 4 and 16 KV prompts
    python benchmarks/small_sets.py --model qwen2.5-coder-1.5b-instruct --prompts 4
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import numpy as np

import helpers
from helpers import adapters
from helpers.engine import SweepEngine
from helpers.specs import Spec


def best(run, repeats: int):
    """(fastest time, result) of `repeats` runs."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return min(times), out


def per_layer_inputs(self, hidden, positions, allowed):
    full, mask = adapters.positions_and_mask(hidden, positions, allowed)
    return full, mask, self.model.base_model.rotary_emb(hidden, position_ids=full)


def compare(what: str, old, new, repeats: int) -> None:
    t_old, a = best(old, repeats)
    t_new, b = best(new, repeats)
    if not np.array_equal(np.asarray(a), np.asarray(b)):
        raise SystemExit(
            f"{what}: the two ways differ by {np.abs(np.asarray(a) - np.asarray(b)).max():.3g}"
        )
    print(f"  {what:<52} {t_old:7.2f} s -> {t_new:6.2f} s   {t_old / t_new:4.1f}x   (equal)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, nargs="+", default=[4, 16])
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    loaded = helpers.load(args.model)
    n_layers = loaded.adapter.n_layers
    layer = n_layers // 2
    print(f"{args.model}, {loaded.adapter.n_heads(layer)} heads a layer, {n_layers} layers")
    for n in args.prompts:
        items = helpers.kv_items(args.keys, n, seed=0)
        engine = SweepEngine(loaded, loaded.tokenizer, items)
        rows = [(len(b.rows), b.n_real, b.width) for b in engine.batches]
        print(f"{n} KV prompts of {args.keys} keys: batches (rows, real rows, width) {rows}")
        heads = range(loaded.adapter.n_heads(layer))
        compare(
            f"head sweep of L{layer}: a call per head -> per layer",
            lambda: [engine.loglikelihoods([Spec(zero=[(layer, h)])])[0] for h in heads],
            lambda: list(engine.head_loglikelihoods([layer], progress=False).values()),
            args.repeats,
        )
        scan = {
            f"L{l}": Spec(zero={l: range(loaded.adapter.n_heads(l))})
            for l in loaded.adapter.head_layers()
        }
        compare(
            "layer scan: a call per layer's attention -> score_each",
            lambda: [engine.score(scan[k]).margin for k in scan],
            lambda: [s.margin for s in engine.score_each(scan).values()],
            args.repeats,
        )
        if isinstance(loaded.adapter, adapters.LlamaAdapter):

            def clean():
                engine._residuals.clear()
                return engine.loglikelihoods([Spec()])[0]

            with mock.patch.object(adapters.LlamaAdapter, "pass_inputs", per_layer_inputs):
                t_old, a = best(clean, args.repeats)
            t_new, b = best(clean, args.repeats)
            if not np.array_equal(a, b):
                raise SystemExit("mask and rotary once per pass: the numbers differ")
            print(
                f"  {'clean pass: mask and rotary per layer -> per pass':<52} {t_old:7.2f} s -> {t_new:6.2f} s   "
                f"{t_old / t_new:4.1f}x   (equal)"
            )


if __name__ == "__main__":
    main()
