"""The toy zoo's synthetic tasks: token-level, seeded, one vocabulary for all of them.

- `kv`: a dictionary of two-token keys and one-token values, one line each, then a key to look
  up (the paper's KV retrieval, Fig. 4). A line is five tokens, longer than the models' four-wide
  convolutions, so a line's summary has to be gathered.
- `mcq`: options of 6-8 content words behind a letter (the letters a random permutation, so the
  letter must be read from its option); every option but one holds a "marked" word, and the
  answer is the unmarked option's letter (the MMLU role: the answer is a property of a whole
  option, reported by its letter).
- `knowledge`: `ASK subject SEP` -> the subject's object in a fixed fact table, learned in
  training (the answer lives in the weights, not in the context).

Training draws `Batch`es of token ids. Everything that is scored goes through the book's one
scoring path: `items(batch)` writes each example as an `Item` (a context of token names and one
continuation per candidate), and `tokenizer()` is a real Hugging Face tokenizer of the toy
vocabulary (one word per token), so the plain scorer, the sweep engine and the attention
measures run on toy models exactly as on SmolLM2.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from .segments import Segments
from .tasks import TARGET_DELIMITER, Item

SPECIAL = ["<pad>", "<s>", "\\n", "?", ":", "ask"]
PAD, BOS, NL, ANS, SEP, ASK = range(len(SPECIAL))
N_LETTERS, N_WORDS, N_MARKS, N_KEYS, N_VALUES, N_SUBJECTS = 8, 64, 8, 16, 32, 32


def _block(start: int, n: int) -> np.ndarray:
    return np.arange(start, start + n)


LETTERS = _block(8, N_LETTERS)
WORDS = _block(LETTERS[-1] + 1, N_WORDS)
MARKS = _block(WORDS[-1] + 1, N_MARKS)
KEYS = _block(MARKS[-1] + 1, N_KEYS)
VALUES = _block(KEYS[-1] + 1, N_VALUES)
SUBJECTS = _block(VALUES[-1] + 1, N_SUBJECTS)
VOCAB_SIZE = int(SUBJECTS[-1] + 1)
TASKS = ("kv", "mcq", "knowledge")
FACT_SEED = 1234  # the fact table is part of the task, not of a run


def fact_table() -> np.ndarray:
    """The object (a value token) of each subject."""
    return VALUES[np.random.default_rng(FACT_SEED).integers(0, N_VALUES, N_SUBJECTS)]


def name(token: int) -> str:
    """A toy token's name: A-H for letters, w/m/k/v/s + index for words, marks, keys, values,
    subjects, and the special tokens as written in SPECIAL."""
    for prefix, block in (
        ("ABCDEFGH", LETTERS),
        ("w", WORDS),
        ("m", MARKS),
        ("k", KEYS),
        ("v", VALUES),
        ("s", SUBJECTS),
    ):
        if block[0] <= token <= block[-1]:
            i = token - block[0]
            return prefix[i] if len(prefix) > 1 else f"{prefix}{i}"
    return SPECIAL[token] if token < len(SPECIAL) else f"<unused{token}>"


def decode(ids) -> str:
    return " ".join(name(int(t)) for t in ids)


@cache
def tokenizer():
    """The toy vocabulary as a Hugging Face fast tokenizer: one whitespace-separated word per
    token, ids as in this module, `<pad>` for padding, no BOS added (contexts start with `<s>`).
    A word outside the vocabulary is an error (its `<unk>` is not in the vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(
        models.WordLevel({name(i): i for i in range(VOCAB_SIZE)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>")


@dataclass
class Batch:
    ids: torch.Tensor  # [B, T], right-padded with PAD
    at: torch.Tensor  # [B] the scored position (its next token is the answer)
    choices: torch.Tensor  # [B, C] candidate answer tokens
    gold: torch.Tensor  # [B] index into choices
    task: str
    inline: torch.Tensor | None = (
        None  # [B, T] answers of earlier queries in the row (-100 elsewhere)
    )

    def __len__(self) -> int:
        return len(self.gold)

    @property
    def target(self) -> torch.Tensor:
        return self.choices.gather(1, self.gold[:, None])[:, 0]


def _pack(
    rows: list[list[int]],
    choices: list[list[int]],
    gold: list[int],
    task: str,
    inline: list[list[tuple[int, int]]] | None = None,
) -> Batch:
    T = max(map(len, rows))
    ids = torch.full((len(rows), T), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    targets = None
    if inline is not None:
        targets = torch.full((len(rows), T), -100, dtype=torch.long)
        for i, answers in enumerate(inline):
            for position, token in answers:
                targets[i, position] = token
    return Batch(
        ids,
        torch.tensor([len(r) - 1 for r in rows]),
        torch.tensor(choices),
        torch.tensor(gold),
        task,
        targets,
    )


def kv(n: int, n_keys: int, rng: np.random.Generator, queries: int = 1) -> Batch:
    """`queries` > 1 (training): more lookups follow the first, each with its answer, and the
    row ends at the last one's (their answers are the batch's `inline` targets)."""
    if not 1 <= n_keys <= N_VALUES:
        raise ValueError(f"n_keys must be in 1..{N_VALUES} (distinct values), got {n_keys}")
    rows, choices, gold, inline = [], [], [], []
    for _ in range(n):
        pairs = rng.choice(N_KEYS * N_KEYS, n_keys, replace=False)
        values = VALUES[rng.choice(N_VALUES, n_keys, replace=False)]
        row = [BOS]
        for p, v in zip(pairs, values):
            row += [KEYS[p // N_KEYS], KEYS[p % N_KEYS], SEP, v, NL]
        asked = rng.integers(n_keys, size=queries)
        answers = []
        for q, g in enumerate(asked):
            row += [ANS, KEYS[pairs[g] // N_KEYS], KEYS[pairs[g] % N_KEYS], SEP]
            if q < queries - 1:
                answers.append((len(row) - 1, int(values[g])))
                row.append(values[g])
        (
            rows.append([int(t) for t in row]),
            choices.append([int(v) for v in values]),
            gold.append(int(asked[-1])),
        )
        inline.append(answers)
    return _pack(rows, choices, gold, "kv", inline if queries > 1 else None)


def mcq(
    n: int, n_options: int, rng: np.random.Generator, length: tuple[int, int] = (6, 8)
) -> Batch:
    if not 2 <= n_options <= N_LETTERS:
        raise ValueError(f"n_options must be in 2..{N_LETTERS} (letters), got {n_options}")
    rows, choices, gold = [], [], []
    for _ in range(n):
        letters = LETTERS[rng.permutation(N_LETTERS)[:n_options]]
        g = int(rng.integers(n_options))
        row = [BOS]
        for i, letter in enumerate(letters):
            words = list(WORDS[rng.integers(0, N_WORDS, rng.integers(length[0], length[1] + 1))])
            if i != g:
                words[rng.integers(len(words))] = MARKS[rng.integers(N_MARKS)]
            row += [letter, *words, NL]
        row.append(ANS)
        (
            rows.append([int(t) for t in row]),
            choices.append([int(t) for t in letters]),
            gold.append(g),
        )
    return _pack(rows, choices, gold, "mcq")


def knowledge(n: int, rng: np.random.Generator) -> Batch:
    facts = fact_table()
    subjects = rng.integers(0, N_SUBJECTS, n)
    rows = [[BOS, ASK, int(SUBJECTS[s]), SEP] for s in subjects]
    gold = [int(facts[s] - VALUES[0]) for s in subjects]
    return _pack(rows, [list(map(int, VALUES))] * n, gold, "knowledge")


def make(task: str, n: int, size: int | None, rng: np.random.Generator, queries: int = 1) -> Batch:
    """A batch of one task; `size` is the number of keys (kv) or options (mcq); `queries`: see `kv`."""
    if task == "kv":
        return kv(n, size, rng, queries)
    if task == "mcq":
        return mcq(n, size, rng)
    if task == "knowledge":
        return knowledge(n, rng)
    raise ValueError(f"unknown task {task!r}; toy tasks: {', '.join(TASKS)}")


def items(batch: Batch) -> list[Item]:
    """Each example as an Item: its tokens up to the scored position as the context, and each
    candidate token as a continuation after lm-eval's target delimiter."""
    out = []
    for i in range(len(batch)):
        context = decode(batch.ids[i, : int(batch.at[i]) + 1])
        pairs = tuple((context, TARGET_DELIMITER + name(int(c))) for c in batch.choices[i])
        out.append(Item(pairs, int(batch.gold[i]), batch.task))
    return out


def segments(item: Item) -> Segments:
    """The lines of a toy prompt (a KV line, an MCQ option) as `helpers.segments.Segments`, for
    the attention measures; the answer's line is the item's gold choice."""
    labels = item.pairs[0][0].split()
    segment = np.full(len(labels), -1)
    role = ["other"] * len(labels)
    s, query = 0, False
    for t, tok in enumerate(labels):
        query = query or tok == "?"
        if query:
            role[t] = "query"
        elif t > 0:
            segment[t] = s
            role[t] = (
                "end"
                if tok == "\\n"
                else "sep"
                if tok == ":"
                else "letter"
                if tok in "ABCDEFGH"
                else "key"
                if tok.startswith("k")
                else "value"
            )
            s += tok == "\\n"
    target = _answer_segment(item, labels, segment)
    return Segments(labels, segment, role, target)


def _answer_segment(item: Item, labels: list[str], segment: np.ndarray) -> int:
    """The segment holding the answer: the KV line whose value is the gold value, the MCQ option
    whose letter is the gold letter, -1 when the answer is in no line (knowledge)."""
    gold = item.pairs[item.gold][1].strip()
    where = [segment[t] for t, tok in enumerate(labels) if tok == gold and segment[t] >= 0]
    return int(where[0]) if where else -1
