"""float32 against bfloat16 for the CPU-tier models, side by side in one process:

    .venv/bin/python benchmarks/cpu_dtype.py [--n 32] [--reps 2] [--models qwen2.5-coder-1.5b-instruct ...]

For each model, both dtypes are loaded and the same items are scored by the book's scorer in
turn (float32, then bfloat16, `--reps` times; the first pass of each is kept out of the ratio
only if `--reps` > 1): the letter-selection set and its cloze version for the letter model, KV
prompts (8 keys) for the retrieval model. Printed: seconds per pass in each dtype and their
ratio, accuracy in each, how often the two pick the same answer, and the largest and median
difference in a choice's log-likelihood. The registry's `ModelSpec.dtype` is chosen from this.
bfloat16 is fast only where the CPU multiplies it natively (Intel AMX or AVX512-BF16, Arm's
BF16): the script prints which of these the CPU reports.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

import helpers
from helpers import evaluate, registry, tasks


def cpu_bf16_support() -> str:
    """The bfloat16 instructions this CPU reports (Linux's /proc/cpuinfo), or why none are shown."""
    try:
        flags = next(
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith(("flags", "Features"))
        )
    except (OSError, StopIteration):
        return "unknown (no /proc/cpuinfo)"
    found = [f for f in ("amx_bf16", "avx512_bf16", "bf16") if f in flags.split()]
    return ", ".join(found) or "none"


def item_sets(name: str, n: int, seed: int) -> dict[str, list[tasks.Item]]:
    if name == registry.cast("cpu", "letters"):
        letters, cloze = tasks.load_letters(n=n, seed=seed)
        return {"letters": letters, "cloze": cloze}
    return {"kv@8": tasks.kv_items(8, n, seed=seed, query="repeat")}


def compare(name: str, n: int, reps: int, seed: int) -> None:
    sets = item_sets(name, n, seed)
    loaded = {
        dtype: helpers.load(name, dtype=getattr(torch, dtype)) for dtype in ("float32", "bfloat16")
    }
    seconds = {(d, k): [] for d in loaded for k in sets}
    scored = {}
    for _ in range(reps):
        for dtype, m in loaded.items():
            for kind, items in sets.items():
                start = time.perf_counter()
                scored[dtype, kind] = evaluate.choice_loglikelihoods(m.model, m.tokenizer, items)
                seconds[dtype, kind].append(time.perf_counter() - start)
    kept = slice(1, None) if reps > 1 else slice(None)
    print(
        f"{name} ({len(next(iter(sets.values())))} items per set, {torch.get_num_threads()} threads):"
    )
    for kind, items in sets.items():
        t32, t16 = (float(np.mean(seconds[d, kind][kept])) for d in ("float32", "bfloat16"))
        a, b = scored["float32", kind], scored["bfloat16", kind]
        gold = np.array([it.gold for it in items])
        pick32, pick16 = np.array([x.argmax() for x in a]), np.array([x.argmax() for x in b])
        diff = np.abs(np.concatenate([np.asarray(x) - np.asarray(y) for x, y in zip(a, b)]))
        print(
            f"  {kind:8s} float32 {t32:6.1f} s, bfloat16 {t16:6.1f} s: bfloat16 {t32 / t16:.1f}x faster; "
            f"accuracy {np.mean(pick32 == gold):.3f} / {np.mean(pick16 == gold):.3f}, same answer on "
            f"{np.mean(pick32 == pick16):.3f}; |log-likelihood difference| max {diff.max():.3f}, median {np.median(diff):.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=32, help="items per set")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--models",
        nargs="+",
        default=[registry.cast("cpu", "letters"), registry.cast("cpu", "retrieval")],
    )
    args = parser.parse_args()
    print(f"CPU bfloat16 instructions: {cpu_bf16_support()}; torch {torch.__version__}")
    for name in args.models:
        compare(name, args.n, args.reps, args.seed)


if __name__ == "__main__":
    main()
