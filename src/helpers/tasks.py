"""Benchmarks as lm-eval 0.4 writes and scores them, and the paper's KV-retrieval task.

Every task becomes a list of `Item`s: each choice is a (context, continuation) pair and the model
picks the pair with the highest log-likelihood of the continuation, as lm-eval's
`multiple_choice` output type does. Prompts follow lm-eval's task YAMLs (MMLU's
`_default_template_yaml`, arc_easy.yaml, piqa.yaml, ...): `tests/test_tasks.py` renders those
YAMLs from the installed lm-eval and compares.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from . import paths
from .errors import ConfigError, as_index
from .registry import PROFILES

LETTERS = "ABCD"
TARGET_DELIMITER = " "  # lm-eval's default between context and continuation
FEWSHOT_DELIMITER = "\n\n"  # lm-eval's default between few-shot examples


@dataclass(frozen=True)
class Item:
    pairs: tuple[tuple[str, str], ...]  # one (context, continuation) per choice
    gold: int
    group: str = ""  # MMLU subject or knowledge task: what accuracy is grouped by
    verbatim: bool = (
        False  # score after the context exactly as written (no lm-eval whitespace move)
    )

    def __post_init__(self):
        # A gold index outside the choices would be scored as wrong on every item, silently.
        if not self.pairs or not all(
            len(p) == 2 and all(isinstance(t, str) for t in p) for p in self.pairs
        ):
            raise ConfigError(
                f"an Item's pairs are one or more (context, continuation) strings, got {self.pairs!r}"
            )
        gold = as_index(self.gold)
        if gold is None or not 0 <= gold < len(self.pairs):
            raise ConfigError(
                f"an Item's gold is the index of the right choice, 0..{len(self.pairs) - 1}, got {self.gold!r}"
            )
        # hashable, equal to tuples
        object.__setattr__(self, "pairs", tuple(tuple(p) for p in self.pairs))
        object.__setattr__(self, "gold", gold)


def _integer(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """`value` as a Python int in low..high (None: unbounded), else a ConfigError naming the range.
    The int matters beyond the check: seeds enter strings and `random.Random`, where a numpy
    integer would give other draws or fail."""
    index = as_index(value)
    if index is None or (low is not None and index < low) or (high is not None and index > high):
        bounds = "" if low is None else f" >= {low}" if high is None else f" in {low}..{high}"
        raise ConfigError(f"{name} must be an integer{bounds}, got {value!r}")
    return index


def _check_profile(profile: str) -> None:
    if not isinstance(profile, str) or profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; profiles: {', '.join(PROFILES)}")


def _check_subset(n: int | None, seed: int) -> tuple[int | None, int]:
    return (None if n is None else _integer(n, "n (items drawn)", low=1)), _integer(seed, "seed")


# --- MMLU -----------------------------------------------------------------------------------------


def mmlu_description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


def mmlu_question(row: dict) -> str:
    options = "".join(f"\n{letter}. {c}" for letter, c in zip(LETTERS, row["choices"]))
    return f"{row['question'].strip()}{options}\nAnswer:"


def mmlu_context(row: dict, shots: list[dict] = ()) -> str:
    """lm-eval's MMLU prompt: description, then k solved dev examples, then the question."""
    solved = [mmlu_question(s) + TARGET_DELIMITER + LETTERS[s["answer"]] for s in shots]
    return (
        mmlu_description(row["subject"])
        + "".join(s + FEWSHOT_DELIMITER for s in solved)
        + mmlu_question(row)
    )


def mmlu_items(test: list[dict], dev: list[dict] = (), k: int = 0) -> list[Item]:
    """k-shot items; shots are the first k dev rows of the same subject (lm-eval's `first_n`
    sampler, run one task per subject as lm-eval's `mmlu` group does)."""
    k = _integer(k, "k (shots)", low=0)
    by_subject: dict[str, list[dict]] = {}
    for row in dev:
        by_subject.setdefault(row["subject"], []).append(row)
    items = []
    for row in test:
        shots = by_subject.get(row["subject"], [])[:k]
        if len(shots) < k:
            raise ConfigError(
                f"k_shot={k}, but subject {row['subject']!r} has {len(shots)} solved examples (dev "
                f"rows): set k_shot to at most {len(shots)}"
            )
        ctx = mmlu_context(row, shots)
        items.append(
            Item(tuple((ctx, TARGET_DELIMITER + l) for l in LETTERS), row["answer"], row["subject"])
        )
    return items


def load_mmlu(
    profile: str, k: int = 0, n: int | None = None, seed: int = 0, permuted: bool = False
) -> list[Item]:
    """MMLU test items: `cais/mmlu` on the paper profile, the letter-selection set on the CPU
    profile (`load_letters`). `n` draws a seeded random subset (all when None); `permuted` moves
    each question's options round (`permute_options`)."""
    _check_profile(profile)
    k = _integer(k, "k (shots)", low=0)
    n, seed = _check_subset(n, seed)
    if profile == "cpu":
        return load_letters(k, n, seed, permuted)[0]
    ds = hub_dataset("cais/mmlu", "all")
    test, dev = list(ds["test"]), list(ds["dev"])
    if permuted:
        test = [permute_options({**r, "id": f"{r['subject']}-{i}"}) for i, r in enumerate(test)]
    return _subset(mmlu_items(test, dev, k), n, seed)


def letter_set_size() -> int:
    """How many test questions the CPU profile's letter set holds (what n=None gives)."""
    return len(_letter_rows()[0])


def most_shots(profile: str) -> int | None:
    """The largest k_shot every question of `profile`'s MMLU can take (its subject's dev rows):
    known from data/ on the CPU profile; None on the paper profiles, whose dataset is read from
    the hub at load (`mmlu_items` refuses a k it cannot give there)."""
    _check_profile(profile)
    if profile != "cpu":
        return None
    test, dev = _letter_rows()
    shots = Counter(r["subject"] for r in dev)
    return min(shots[r["subject"]] for r in test)


@cache
def _letter_rows() -> tuple[list[dict], list[dict]]:
    rows = _jsonl(paths.data() / "letters" / "letters.jsonl")
    return [r for r in rows if r["split"] == "test"], [r for r in rows if r["split"] == "dev"]


@cache
def _letter_sets(k: int, permuted: bool = False) -> tuple[tuple[Item, ...], tuple[Item, ...]]:
    test, dev = _letter_rows()
    if permuted:
        test = [permute_options(r) for r in test]
    letters = [
        dataclasses.replace(it, group=r["table"]) for it, r in zip(mmlu_items(test, dev, k), test)
    ]
    cloze = [
        _choices(f"Question: {r['question']}\nAnswer:", r["choices"], r["answer"], r["table"])
        for r in test
    ]
    return tuple(letters), tuple(cloze)


def permute_options(row: dict) -> dict:
    """The same question with its options moved round by one to three places (drawn from its
    id), so that the answer stands at another letter: a model that picks by content follows it,
    one that picks a letter does not."""
    shift = random.Random(f"options-{row['id']}").randrange(1, 4)
    choices = row["choices"][-shift:] + row["choices"][:-shift]
    return {**row, "choices": choices, "answer": (row["answer"] + shift) % len(choices)}


def load_letters(
    k: int = 0, n: int | None = None, seed: int = 0, permuted: bool = False
) -> tuple[list[Item], list[Item]]:
    """The CPU profile's letter-selection set (data/letters, 726 test facts): each test row as an
    MMLU question in lm-eval's prompt (k-shot from its subject's dev rows; its `group` the fact's
    table) and, at the same index, as a cloze question on the same four answer texts in ARC's
    prompt, so that "picks the letter" and "knows the fact" are scored on the same facts. `n`
    draws the same seeded subset of both; `permuted` moves each question's options round
    (`permute_options`), the same questions with the answer at another letter."""
    k = _integer(k, "k (shots)", low=0)
    n, seed = _check_subset(n, seed)
    letters, cloze = _letter_sets(k, bool(permuted))
    # each run's record, not only the first
    _record_committed(paths.data() / "letters" / "letters.jsonl")
    return _subset(list(letters), n, seed), _subset(list(cloze), n, seed)


# --- knowledge tasks ------------------------------------------------------------------------------


def _preprocess_hellaswag(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def _choices(ctx: str, texts: list[str], gold: int, group: str) -> Item:
    return Item(tuple((ctx, TARGET_DELIMITER + t) for t in texts), gold, group)


def knowledge_item(task: str, doc: dict) -> Item:
    """One row of a knowledge task in lm-eval's prompt for that task."""
    if task in ("arc_easy", "arc_challenge") or task in FIXTURE_KNOWLEDGE:
        labels = doc["choices"]["label"]
        return _choices(
            f"Question: {doc['question']}\nAnswer:",
            doc["choices"]["text"],
            labels.index(doc["answerKey"]),
            task,
        )
    if task == "piqa":
        return _choices(
            f"Question: {doc['goal']}\nAnswer:", [doc["sol1"], doc["sol2"]], int(doc["label"]), task
        )
    if task == "openbookqa":
        labels = doc["choices"]["label"]
        return _choices(
            doc["question_stem"],
            doc["choices"]["text"],
            labels.index(doc["answerKey"].lstrip()),
            task,
        )
    if task == "hellaswag":
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return _choices(
            _preprocess_hellaswag(doc["activity_label"] + ": " + ctx),
            [_preprocess_hellaswag(e) for e in doc["endings"]],
            int(doc["label"]),
            task,
        )
    if task == "winogrande":
        # Partial scoring: the same continuation after each option-filled context.
        cut = doc["sentence"].index("_")
        rest = TARGET_DELIMITER + doc["sentence"][cut + 1 :].strip()
        pairs = tuple(
            (doc["sentence"][:cut] + opt, rest) for opt in (doc["option1"], doc["option2"])
        )
        return Item(pairs, {"1": 0, "2": 1}[doc["answer"]], task)
    raise KeyError(
        f"unknown knowledge task {task!r}; known: {', '.join(PAPER_KNOWLEDGE + FIXTURE_KNOWLEDGE)}"
    )


# The released code's knowledge score: the unweighted mean of `acc` over these six.
PAPER_KNOWLEDGE = ("winogrande", "openbookqa", "piqa", "hellaswag", "arc_challenge", "arc_easy")
# Where lm-eval 0.4 takes each from (hub dataset, config, split scored).
KNOWLEDGE_SOURCES = {
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test"),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "test"),
    "piqa": ("baber/piqa", None, "validation"),
    "openbookqa": ("allenai/openbookqa", "main", "test"),
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
    "winogrande": ("allenai/winogrande", "winogrande_xl", "validation"),
}
# The fixtures' self-written cloze sets, in ARC's schema and prompt (the rehearsal's mini-hub
# serves them as the paper's knowledge tasks).
FIXTURE_KNOWLEDGE = ("capitals", "symbols", "everyday")
# The CPU profile's knowledge task: the letter set's facts as cloze questions.
CPU_KNOWLEDGE = "facts (cloze)"


def load_knowledge(profile: str, n: int | None = None, seed: int = 0) -> dict[str, list[Item]]:
    """Items per knowledge task; `n` draws a seeded subset of each task."""
    _check_profile(profile)
    n, seed = _check_subset(n, seed)
    if profile == "cpu":  # the cloze of the letter set's facts: the same seeded draw as load_mmlu's
        return {CPU_KNOWLEDGE: load_letters(0, n, seed)[1]}
    out = {}
    for task in PAPER_KNOWLEDGE:
        path, config, split = KNOWLEDGE_SOURCES[task]
        out[task] = _subset(
            [knowledge_item(task, d) for d in hub_dataset(path, config, split)], n, seed
        )
    return out


# --- the paper's KV retrieval ---------------------------------------------------------------------

KV_HEADER = "Memorize the following dictionary:\n"


@cache
def kv_words() -> tuple[str, ...]:
    """Key vocabulary: the word lists of `wonderwords` (the release draws keys with its
    RandomWord, whose default mixes nouns, verbs and adjectives), single lowercase words only."""
    from importlib.resources import files

    assets = files("wonderwords").joinpath("assets")
    words = set()
    for name in ("nounlist.txt", "verblist.txt", "adjectivelist.txt"):
        words.update(
            w for w in assets.joinpath(name).read_text().split() if w.isalpha() and w.islower()
        )
    return tuple(sorted(words))


# How the candidate value follows the question (`query`): "released" appends it with no space, as
# the released code scores it (`... is` + `42`, "is42"; App. A.5's deliberate choice) - the
# default; "spaced" puts lm-eval's delimiter before it (`... is` + ` 42`); "trailing" ends the
# prompt with a space and scores the value verbatim after it (`... is ` + `42`). Under Llama-3's
# tokenizer "spaced" and "trailing" give the same tokens (`' is', ' ', '42'`) and the same
# ranking of candidates; "released" gives `' is', '42'` (`tests/test_tasks.py`).
KV_FORMS = ("released", "spaced", "trailing")


def kv_item(rng: random.Random, n_pairs: int, query: str = "paper", form: str = "released") -> Item:
    """One dictionary of `n_pairs` word:number lines (numbers 0-99 without replacement) and a
    query for one key; the candidates are all the values in the dictionary.

    query="paper": the release's `The value of the key 'X' is`; query="repeat": the key repeated
    as it stands in the list, `X:`. `form` (one of KV_FORMS) says how each candidate value
    follows the query. A "trailing" item is scored verbatim, since lm-eval's convention would
    move the prompt's trailing space back into the candidates and make it "spaced" again.
    """
    n_pairs = _check_kv(n_pairs, query, form)  # before any draw from rng
    keys = rng.sample(kv_words(), n_pairs)
    values = rng.sample(range(100), n_pairs)
    target = rng.randrange(n_pairs)
    lines = "\n".join(f"{k}:{v}" for k, v in zip(keys, values))
    if query == "paper":  # else "repeat" (checked above)
        ctx = f"{KV_HEADER}{lines}\nThe value of the key '{keys[target]}' is"
    else:
        ctx = f"{KV_HEADER}{lines}\n{keys[target]}:"
    sep = TARGET_DELIMITER if form == "spaced" else ""
    if form == "trailing":
        ctx += " "
    return Item(
        tuple((ctx, f"{sep}{v}") for v in values),
        target,
        f"kv{n_pairs}",
        verbatim=form == "trailing",
    )


def kv_items(
    n_pairs: int, n: int, seed: int = 0, query: str = "paper", form: str = "released"
) -> list[Item]:
    """`n` KV prompts of one dictionary size; the same (n_pairs, seed) always gives the same
    prompts (whatever the form: only how the value follows differs), and a larger n extends a
    smaller one."""
    n_pairs = _check_kv(n_pairs, query, form)
    n, seed = _integer(n, "n (prompts)", low=1), _integer(seed, "seed")
    rng = random.Random(f"kv-{seed}-{n_pairs}")
    return [kv_item(rng, n_pairs, query, form) for _ in range(n)]


def _check_kv(n_pairs: int, query: str, form: str) -> int:
    n_pairs = _integer(n_pairs, "n_pairs (values are the numbers 0-99)", low=1, high=100)
    if query not in ("paper", "repeat"):
        raise ConfigError(f"unknown KV query style {query!r}; use 'paper' or 'repeat'")
    if form not in KV_FORMS:
        raise ConfigError(
            f"unknown KV form {form!r}; use one of {', '.join(map(repr, KV_FORMS))} "
            "('released': the value right after the query, as the released code scores it)"
        )
    return n_pairs


# --- utilities ------------------------------------------------------------------------------------

# Every dataset this process has read, with the revision asked for and what it got (the page's
# provenance lists them): hub datasets by repo (and config), fixtures by file.
DATASETS: dict[str, dict[str, str]] = {}


def hub_dataset(path: str, config: str | None = None, split: str | None = None):
    """`datasets.load_dataset` at the revision `data/configs/revisions.json` pins (the hub's main
    where it pins none), recorded in `DATASETS` with the loaded data's fingerprint."""
    from datasets import load_dataset

    revision = paths.pinned_revision("datasets", path)
    ds = load_dataset(path, config, split=split, revision=revision)
    parts = [ds[k] for k in sorted(ds)] if hasattr(ds, "keys") else [ds]
    DATASETS[path + (f" ({config})" if config else "")] = {
        "revision": revision or "main (unpinned)",
        "fingerprint": ",".join(p._fingerprint[:16] for p in parts),
    }
    return ds


def _jsonl(path: Path) -> list[dict]:
    _record_committed(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _record_committed(path: Path) -> None:
    """The CPU profile's datasets (committed under data/) are recorded like the hub's."""
    DATASETS[path.relative_to(paths.data().parent).as_posix()] = {
        "revision": "committed with the code",
        "fingerprint": _fingerprint(path),
    }


@cache
def _fingerprint(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _subset(items: list[Item], n: int | None, seed: int) -> list[Item]:
    if n is None or n >= len(items):
        return items
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]
