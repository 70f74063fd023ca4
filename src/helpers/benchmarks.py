"""The evaluation sets a chapter runs, for whichever model it runs them on.

A `Benchmark` is a named list of Items with its role (retrieval or knowledge), its chance level,
and how to find the segments of one of its prompts (for attention measures and pattern masks).
The one place that knows the toy zoo speaks its own token language is here: `kv`, `letter_mcq`
and `knowledge` give the zoo's synthetic tasks for a toy model and the paper's prompts for any
other, so chapters never branch on the kind of model or data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import registry, synthetic, tasks
from .progress import quiet
from .segments import Segments, kv_segments, mcq_segments
from .tasks import Item

RETRIEVAL, KNOWLEDGE = "retrieval", "knowledge"


@dataclass(frozen=True)
class Benchmark:
    name: str  # as tables and legends print it
    role: str  # RETRIEVAL (the answer is in the prompt) or KNOWLEDGE (in the weights)
    items: list[Item] = field(repr=False)
    segments: Callable[[Item], Segments] | None = field(default=None, repr=False, compare=False)

    @property
    def chance(self) -> float:
        """Expected accuracy of a uniform guess over each item's choices."""
        return float(np.mean([1 / len(it.pairs) for it in self.items]))

    def __len__(self) -> int:
        return len(self.items)


def _toy(model: str) -> bool:
    return registry.spec(model).toy


def _rng(*seed: int) -> np.random.Generator:
    return np.random.default_rng(list(seed))


def kv(model: str, tokenizer, pairs: int, n: int, seed: int = 0, query: str = "paper",
       form: str = "released") -> Benchmark:
    """KV retrieval with `pairs` keys: the release's prompt (`tasks.kv_items`; `query` picks the
    question's form, `form` how the value follows it, `tasks.KV_FORMS`), or the zoo's token task
    for a toy model (two-token keys; no query forms)."""
    name = f"KV retrieval ({pairs} keys)"
    if _toy(model):
        return Benchmark(name, RETRIEVAL, synthetic.items(synthetic.kv(n, pairs, _rng(seed, pairs))), synthetic.segments)
    return Benchmark(name, RETRIEVAL, tasks.kv_items(pairs, n, seed=seed, query=query, form=form),
                     lambda item: kv_segments(tokenizer, item.pairs[0][0]))


def letter_mcq(model: str, tokenizer, profile: str, n: int | None, seed: int = 0, k_shot: int = 0,
               options: int = 4) -> Benchmark:
    """Answer-letter selection: MMLU in lm-eval's prompt (`k_shot` solved examples; the CPU
    profile's fixture set or `cais/mmlu`), or the zoo's letter MCQ with `options` options."""
    if _toy(model):
        return Benchmark(f"letter MCQ ({options} options)", RETRIEVAL,
                         synthetic.items(synthetic.mcq(n or 500, options, _rng(seed, 100 + options))), synthetic.segments)
    with quiet():  # datasets' cache messages
        items = tasks.load_mmlu(profile, k=k_shot, n=n, seed=seed)
    return Benchmark(f"MMLU ({k_shot}-shot)", RETRIEVAL, items, lambda item: mcq_segments(tokenizer, item.pairs[0][0], item.gold))


def knowledge(model: str, profile: str, n: int | None, seed: int = 0) -> list[Benchmark]:
    """Knowledge tasks: the six of the released code (paper profiles), the CPU profile's cloze
    fixtures, or the zoo's fact table for a toy model."""
    if _toy(model):
        return [Benchmark("knowledge", KNOWLEDGE, synthetic.items(synthetic.knowledge(n or 500, _rng(seed, 1000))))]
    with quiet():  # datasets' cache messages
        sets = tasks.load_knowledge(profile, n=n, seed=seed)
    return [Benchmark(name, KNOWLEDGE, items) for name, items in sets.items()]


def pooled(benchmarks: list[Benchmark], name: str = "knowledge (pooled)") -> Benchmark:
    """Several benchmarks' items as one (for paired tests across conditions)."""
    return Benchmark(name, benchmarks[0].role, [it for b in benchmarks for it in b.items])
