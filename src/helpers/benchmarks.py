"""The evaluation sets a chapter runs, for whichever model it runs them on.

A `Benchmark` is a named list of Items with its role (retrieval or knowledge), its chance level,
and how to find the segments of one of its prompts (for attention measures and pattern masks).
The one place that knows the toy zoo speaks its own token language is here: `kv`, `letter_mcq`
and `knowledge` give the zoo's synthetic tasks for a toy model and the paper's prompts for any
other, so chapters never branch on the kind of model or data.

Every benchmark made here carries its `spec`: the JSON values it was made from (its kind, the
model it was made for, sizes, seed, prompt form; a part of another benchmark names the whole and
the part). `from_spec(spec, tokenizer)` makes the same benchmark again, the same items in the
same order, so that a measurement sent to another process (`runner`) can be handed the spec in
its cell instead of the items.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import registry, synthetic, tasks
from .errors import ConfigError
from .progress import quiet
from .segments import Segments, kv_segments, mcq_segments
from .tasks import Item

RETRIEVAL, KNOWLEDGE = "retrieval", "knowledge"
KV, MCQ = "kv", "mcq"  # kinds of benchmark (`Benchmark.kind`) besides KNOWLEDGE's tasks


@dataclass(frozen=True)
class Benchmark:
    name: str  # as tables and legends print it
    role: str  # RETRIEVAL (the answer is in the prompt) or KNOWLEDGE (in the weights)
    items: list[Item] = field(repr=False)
    segments: Callable[[Item], Segments] | None = field(default=None, repr=False, compare=False)
    # what makes it again: `from_spec`
    spec: dict | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str | None:
        """What it is, from its spec: KV (dictionaries), MCQ (answer letters: MMLU, or a toy's
        letter MCQ) or KNOWLEDGE (a task, or a letter set's cloze twins; a part of one: the
        whole's kind); None without a spec."""
        spec = self.spec
        while spec is not None and spec["kind"] == "part":
            spec = spec["of"]
        return None if spec is None else KNOWLEDGE if spec["kind"] == "twins" else spec["kind"]

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


def kv(
    model: str,
    tokenizer,
    pairs: int,
    n: int,
    seed: int = 0,
    query: str = "paper",
    form: str = "released",
) -> Benchmark:
    """KV retrieval with `pairs` keys: the release's prompt (`tasks.kv_items`; `query` picks the
    question's form, `form` how the value follows it, `tasks.KV_FORMS`), or the zoo's token task
    for a toy model (two-token keys; no query forms)."""
    name = f"KV retrieval ({pairs} keys)"
    spec = dict(kind=KV, model=model, pairs=pairs, n=n, seed=seed, query=query, form=form)
    if _toy(model):
        return Benchmark(
            name,
            RETRIEVAL,
            synthetic.items(synthetic.kv(n, pairs, _rng(seed, pairs))),
            synthetic.segments,
            spec,
        )
    return Benchmark(
        name,
        RETRIEVAL,
        tasks.kv_items(pairs, n, seed=seed, query=query, form=form),
        lambda item: kv_segments(tokenizer, item.pairs[0][0]),
        spec,
    )


TOY_MCQ_SIZE = 500  # the zoo's letter MCQ when no n is asked for


def kv_of(cell: dict, tokenizer) -> Benchmark:
    """The KV prompts a measurement's cell names: its model, pairs, n and seed, and its query
    and form where it has them (else `kv`'s)."""
    return kv(
        cell["model"],
        tokenizer,
        cell["pairs"],
        cell["n"],
        cell["seed"],
        **{k: cell[k] for k in ("query", "form") if k in cell},
    )


def letter_mcq_size(model: str, profile: str) -> int | None:
    """How many questions `letter_mcq(model, ..., profile, n=None)` holds, known before any
    load: the zoo's MCQ or the CPU letter set; None on the paper profiles (the hub's MMLU,
    counted when it is read)."""
    if _toy(model):
        return TOY_MCQ_SIZE
    return tasks.letter_set_size() if profile == "cpu" else None


def letter_mcq(
    model: str,
    tokenizer,
    profile: str,
    n: int | None,
    seed: int = 0,
    k_shot: int = 0,
    options: int = 4,
    permuted: bool = False,
) -> Benchmark:
    """Answer-letter selection: MMLU in lm-eval's prompt (`k_shot` solved examples; the CPU
    profile's fixture set or `cais/mmlu`; `permuted`: each question's options moved round,
    `tasks.permute_options`), or the zoo's letter MCQ with `options` options."""
    spec = dict(
        kind=MCQ,
        model=model,
        profile=profile,
        n=n,
        seed=seed,
        k_shot=k_shot,
        options=options,
        **({"permuted": True} if permuted else {}),
    )
    if _toy(model) and permuted:
        raise ConfigError(
            "the toy letter MCQ has no permuted form: its letters are drawn at random already"
        )
    if _toy(model):
        return Benchmark(
            f"letter MCQ ({options} options)",
            RETRIEVAL,
            synthetic.items(synthetic.mcq(n or TOY_MCQ_SIZE, options, _rng(seed, 100 + options))),
            synthetic.segments,
            spec,
        )
    with quiet():  # datasets' cache messages
        items = tasks.load_mmlu(profile, k=k_shot, n=n, seed=seed, permuted=permuted)
    return Benchmark(
        f"MMLU ({k_shot}-shot{', options moved' if permuted else ''})",
        RETRIEVAL,
        items,
        lambda item: mcq_segments(tokenizer, item.pairs[0][0], item.gold),
        spec,
    )


def knowledge(model: str, profile: str, n: int | None, seed: int = 0) -> list[Benchmark]:
    """Knowledge tasks: the six of the released code (paper profiles), the CPU profile's cloze
    fixtures, or the zoo's fact table for a toy model."""
    spec = lambda task: dict(
        kind=KNOWLEDGE, model=model, profile=profile, n=n, seed=seed, task=task
    )
    if _toy(model):
        return [
            Benchmark(
                "knowledge",
                KNOWLEDGE,
                synthetic.items(synthetic.knowledge(n or 500, _rng(seed, 1000))),
                spec=spec("knowledge"),
            )
        ]
    with quiet():  # datasets' cache messages
        sets = tasks.load_knowledge(profile, n=n, seed=seed)
    return [Benchmark(name, KNOWLEDGE, items, spec=spec(name)) for name, items in sets.items()]


def twins(b: Benchmark) -> Benchmark | None:
    """The cloze twins of a letter benchmark's very items, in its order: the CPU letter set holds
    each fact as a letter question and as a cloze question on the same four answers (a part of
    it has the same part of the twins); None where the letters have no twins (MMLU, a toy's MCQ)."""
    spec = b.spec
    if spec is None:
        return None
    if spec["kind"] == "part":
        whole = twins(from_spec(spec["of"], None))
        return None if whole is None else part(whole, spec["start"], spec["stop"], spec["shuffle"])
    if spec["kind"] != MCQ or spec["profile"] != "cpu" or _toy(spec["model"]):
        return None
    cloze = tasks.load_letters(spec["k_shot"], spec["n"], spec["seed"])[1]
    return Benchmark(tasks.CPU_KNOWLEDGE, KNOWLEDGE, cloze, spec=dict(kind="twins", of=spec))


def knowledge_of(scored: Benchmark, profile: str, n: int | None, seed: int = 0) -> list[Benchmark]:
    """The knowledge scored beside `scored` (letters or KV retrieval), paired with it where it
    can be: the cloze twins of the same facts (`twins`), else `profile`'s knowledge tasks
    (`knowledge`, `n` items each, drawn with `seed`) for its model."""
    twin = twins(scored)
    if twin is not None:
        return [twin]
    spec = scored.spec
    while spec["kind"] == "part":
        spec = spec["of"]
    return knowledge(spec["model"], profile, n, seed)


def part(
    b: Benchmark, start: int, stop: int | None = None, shuffle: str | None = None
) -> Benchmark:
    """Items `start:stop` of `b` (same name, role and segments), in their order in `b`; with
    `shuffle`, of its items shuffled by `random.Random(shuffle)` (a split into disjoint parts:
    the same `shuffle`, consecutive ranges)."""
    order = list(range(len(b)))
    if shuffle is not None:
        random.Random(shuffle).shuffle(order)
    picked = order[start:stop] if shuffle is None else sorted(order[start:stop])
    spec = (
        None
        if b.spec is None
        else dict(kind="part", of=b.spec, start=start, stop=stop, shuffle=shuffle)
    )
    return Benchmark(b.name, b.role, [b.items[i] for i in picked], b.segments, spec)


def from_spec(spec: dict, tokenizer) -> Benchmark:
    """The benchmark that `spec` (a Benchmark's `spec`) was made from, made again: the same
    items in the same order. `tokenizer` is the one its segments are found with (the items do
    not depend on it). The last few are kept: a sweep's cells on one benchmark make it once."""
    if not isinstance(spec, dict) or spec.get("kind") not in _MAKERS:
        raise ConfigError(
            f"a benchmark spec is a dict whose kind is one of {', '.join(_MAKERS)} (a Benchmark's "
            f"`spec`, put in a cell as it is), got {spec!r}"
        )
    # A kept benchmark's segments hold its tokenizer, so the id is not reused while it is kept.
    key = (json.dumps(spec, sort_keys=True), id(tokenizer))
    if key not in _made:
        if len(_made) >= KEEP_MADE:
            del _made[next(iter(_made))]
        _made[key] = _MAKERS[spec["kind"]](spec, tokenizer)
    return _made[key]


KEEP_MADE = 8  # benchmarks `from_spec` keeps (the oldest goes first)
_made: dict[tuple[str, int], Benchmark] = {}


@functools.lru_cache(maxsize=KEEP_MADE)
def _knowledge_tasks(model: str, profile: str, n: int | None, seed: int) -> tuple[Benchmark, ...]:
    # One load for all of a profile's tasks: a sweep's cells ask for them one task at a time (the
    # paper profiles' six each read their dataset).
    return tuple(knowledge(model, profile, n, seed))


def _knowledge_task(s: dict, tokenizer) -> Benchmark:
    found = [
        b
        for b in _knowledge_tasks(s["model"], s["profile"], s["n"], s["seed"])
        if b.name == s["task"]
    ]
    if not found:
        raise ConfigError(
            f"no knowledge task {s['task']!r} for {s['model']} on the {s['profile']} profile"
        )
    return found[0]


_MAKERS = {
    KV: lambda s, tok: kv(s["model"], tok, s["pairs"], s["n"], s["seed"], s["query"], s["form"]),
    MCQ: lambda s, tok: letter_mcq(
        s["model"],
        tok,
        s["profile"],
        s["n"],
        s["seed"],
        s["k_shot"],
        s["options"],
        s.get("permuted", False),
    ),
    KNOWLEDGE: _knowledge_task,
    "twins": lambda s, tok: twins(from_spec(s["of"], tok)),
    "part": lambda s, tok: part(from_spec(s["of"], tok), s["start"], s["stop"], s["shuffle"]),
}
