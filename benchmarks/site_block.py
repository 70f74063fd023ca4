"""What the vocabulary projection's block (`packing.site_block`: scored positions per pass of the
head) costs on the book's own sets, side by side in one process: for each model and set, a
clean pass and an exact sweep of the last layer's heads (where a sweep recomputes least but
the head, so the head weighs most) at a block of 64 (the old fixed block) and at the block the
CPU's budget now gives, their ratio, and how far the log-likelihoods move between the two, on
the sets the exact sweeps run on.

    python benchmarks/site_block.py                       # SmolLM2, Gemma-3-270M, Qwen-1.5B
    python benchmarks/site_block.py --models gemma-3-270m --budget 128
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from batch_tokens import book_sets

import helpers
from helpers.engine import SweepEngine
from helpers.packing import default_batch_tokens, site_block
from helpers.specs import Spec

MODELS = ("smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-1.5b-instruct")
OLD = 64


def timed(engine: SweepEngine, block: int, layer: int) -> tuple[float, float, np.ndarray]:
    """(clean pass seconds, last layer's sweep seconds, their log-likelihoods) at `block`. Each
    starts from the residual stream it reads, computed before the clock starts (the engine keeps
    one layer's), so that the clean pass times the head alone and the sweep one layer and the
    head per head."""
    for b in engine.batches:
        b.block = block
    engine.residual(layer)
    start = time.perf_counter()
    swept = engine.loglikelihoods(
        [Spec(zero=[(layer, h)]) for h in range(engine.adapter.n_heads(layer))]
    )
    seconds = time.perf_counter() - start
    engine.residual(engine.adapter.n_layers)
    start = time.perf_counter()
    clean = engine.loglikelihoods([Spec()])
    return time.perf_counter() - start, seconds, np.concatenate([clean, swept])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--budget", type=int, default=None, help="tokens per batch (default: the CPU's)")
    args = p.parse_args()
    totals = {"old": 0.0, "new": 0.0}
    for name in args.models:
        loaded = helpers.load(name)
        budget = args.budget or default_batch_tokens(next(loaded.model.parameters()).device)
        new = site_block(budget)
        layer = loaded.adapter.head_layers()[-1]
        print(f"{name} ({loaded.model.dtype}), budget {budget}: block {OLD} against {new}")
        # the sets the exact sweeps run on (the screens'; a check's 200 KV prompts are scored
        # under a few zeroings, not swept)
        for s in [s for s in book_sets(name, loaded.tokenizer, 1) if len(s) < 200]:
            engine = SweepEngine(loaded, loaded.tokenizer, s.items, batch_tokens=budget)
            timed(engine, new, layer)  # warm-up: the residual cache and the allocator
            # the two blocks alternate, twice each, and each keeps its faster run
            runs = {OLD: [], new: []}
            for block in (OLD, new, new, OLD):
                runs[block].append(timed(engine, block, layer))
            (c0, s0, ll0), (c1, s1, ll1) = (
                min(runs[b], key=lambda r: r[0] + r[1]) for b in (OLD, new)
            )
            totals["old"] += c0 + s0
            totals["new"] += c1 + s1
            print(
                f"  {s.name:<24} {len(s):4d} items: clean {c0:6.2f} -> {c1:6.2f} s ({c0 / c1:4.2f}x), "
                f"L{layer}'s {engine.adapter.n_heads(layer)} heads {s0:6.2f} -> {s1:6.2f} s "
                f"({s0 / s1:4.2f}x)  max |dll| {np.abs(ll0 - ll1).max():.2g}",
                flush=True,
            )
    print(
        f"all: block {OLD} {totals['old']:.1f} s, the budget's block {totals['new']:.1f} s "
        f"({totals['old'] / totals['new']:.2f}x)"
    )


if __name__ == "__main__":
    main()
