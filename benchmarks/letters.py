"""Which CPU-tier models pick MMLU answer letters, and do they know the same facts as cloze?

    .venv/bin/python benchmarks/letters.py [--n 200] [--models qwen2.5-coder-1.5b-instruct ...]

For each model: load time, peak resident memory, accuracy on the letter-selection set
(data/letters, lm-eval's MMLU prompt, 0-shot) and on the cloze version of the same facts, the
spread of the letters it answers, and the item-by-item crosstab (knows the fact / picks its letter).
"""

from __future__ import annotations

import argparse
import collections
import resource
import time

import numpy as np
import torch

import helpers
from helpers import evaluate, tasks
from helpers.stats import Score


def measure(name: str, n: int, seed: int) -> None:
    start = time.perf_counter()
    loaded = helpers.load(name)
    loaded_s = time.perf_counter() - start
    letters, cloze = tasks.load_letters(n=n, seed=seed)
    start = time.perf_counter()
    picked = evaluate.choice_loglikelihoods(loaded.model, loaded.tokenizer, letters, progress=True)
    knew = evaluate.choice_loglikelihoods(loaded.model, loaded.tokenizer, cloze, progress=True)
    scored_s = time.perf_counter() - start
    picks = [int(np.argmax(ll)) == it.gold for ll, it in zip(picked, letters)]
    knows = [int(np.argmax(ll)) == it.gold for ll, it in zip(knew, cloze)]
    answers = collections.Counter("ABCD"[int(np.argmax(ll))] for ll in picked)
    cross = collections.Counter(zip(knows, picks))
    print(
        f"{name}: loaded in {loaded_s:.0f} s; {2 * len(letters)} items scored in {scored_s:.0f} s "
        f"({scored_s / (2 * len(letters)):.2f} s each, {torch.get_num_threads()} threads); peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB"
    )
    print(
        f"  letters (0-shot MMLU prompt): {Score.of(picks)}; answers {dict(sorted(answers.items()))}"
    )
    print(f"  cloze, same facts:            {Score.of(knows)}")
    print(
        f"  knows & picks {cross[True, True]}, knows only {cross[True, False]}, picks only {cross[False, True]}, "
        f"neither {cross[False, False]}"
    )
    del loaded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200, help="facts drawn from the 726 (seeded)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--models",
        nargs="+",
        default=[
            "qwen2.5-coder-1.5b-instruct",
            "qwen2.5-coder-0.5b-instruct",
            "smollm2-135m-instruct",
        ],
    )
    args = p.parse_args()
    for name in args.models:
        measure(name, args.n, args.seed)


if __name__ == "__main__":
    main()
