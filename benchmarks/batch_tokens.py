"""What the CPU's batch budget (tokens per forward pass) costs on the book's own sets, side by
side in one process: for each budget, the tokens a clean pass runs (real ones, plus the padding
to each row's width bucket and the filler rows that give every batch of a width the same
height, `packing.batches`), the pass's time, its ratio to the first budget's, and how far the
log-likelihoods move from the first budget's.

A batch has a fixed height per row width (what keeps an item's bfloat16 rounding independent of
its neighbours), so a small set spread over many widths runs mostly filler rows at a large
budget: the budget that wastes least is a property of the sets, not of the matrix multiply.

    python benchmarks/batch_tokens.py                               # SmolLM2 and Qwen-1.5B
    python benchmarks/batch_tokens.py --models smollm2-135m-instruct --budgets 1024 256
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import helpers
from helpers import benchmarks as bm
from helpers.engine import SweepEngine
from helpers.specs import Spec

MODELS = ("smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct")


def book_sets(name: str, tokenizer, scale: int) -> list[bm.Benchmark]:
    """The sets the CPU chapters score at full size (`scale` 1; larger: more prompts): the KV
    screen's 40 prompts of 8 keys and a check's 200, the letter screen's 80 0-shot questions,
    their cloze twins, and 40 five-shot questions (the release's prompt)."""
    letters = bm.letter_mcq(name, tokenizer, "cpu", 80 * scale, seed=0)
    return [
        bm.kv(name, tokenizer, 8, 40 * scale, seed=0, query="repeat"),
        bm.kv(name, tokenizer, 8, 200 * scale, seed=1, query="repeat"),
        letters,
        bm.twins(letters),
        bm.letter_mcq(name, tokenizer, "cpu", 40 * scale, seed=0, k_shot=5),
    ]


def clean_pass(loaded, items, budget: int) -> tuple[int, int, float, np.ndarray]:
    """(real tokens, tokens run, seconds, log-likelihoods) of one clean pass at `budget`."""
    engine = SweepEngine(loaded, loaded.tokenizer, items, batch_tokens=budget)
    real = int(engine.rows.lengths.sum())
    run = sum(len(b.rows) * b.width for b in engine.batches)
    start = time.perf_counter()
    ll = engine.loglikelihoods([Spec()])[0]
    return real, run, time.perf_counter() - start, ll


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--budgets", type=int, nargs="+", default=[1024, 512, 256, 128])
    p.add_argument("--scale", type=int, default=1, help="prompts per set, times the book's")
    args = p.parse_args()
    totals = {b: 0.0 for b in args.budgets}
    for name in args.models:
        loaded = helpers.load(name)
        print(f"{name} ({loaded.model.dtype}), budgets {args.budgets}")
        for s in book_sets(name, loaded.tokenizer, args.scale):
            clean_pass(loaded, s.items[:4], args.budgets[-1])  # the first pass's warm-up
            first = None
            for budget in args.budgets:
                real, run, seconds, ll = clean_pass(loaded, s.items, budget)
                first = first or (seconds, ll)
                totals[budget] += seconds
                print(
                    f"  {s.name:<24} {len(s):4d} items  budget {budget:5d}: {real:6d} real tokens, "
                    f"{run:6d} run ({run / real:4.2f}x)  {seconds:7.2f} s  "
                    f"{first[0] / seconds:4.2f}x the first  max |dll| {np.abs(ll - first[1]).max():.2g}",
                    flush=True,
                )
    print("all sets: " + ", ".join(f"{b}: {t:.1f} s" for b, t in totals.items()))


if __name__ == "__main__":
    main()
