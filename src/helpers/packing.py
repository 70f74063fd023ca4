"""An evaluation set as model rows, in lm-eval's conventions: the one packing that the plain
scorer (`helpers.evaluate`) and the sweep engine (`helpers.engine`) share.

lm-eval (0.4, `HFLM`) encodes context+continuation together and splits at the context's
length, after moving the context's trailing whitespace into the continuation; it adds a BOS
only when the tokenizer does; a continuation's score is the sum of its tokens' log-probs.
Choices whose model input is the same (one-token continuations such as MMLU's letters) share a
row, and only the positions that predict a continuation token are scored.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import torch

from .errors import ConfigError
from .tasks import FEWSHOT_DELIMITER, Item


def encode_pair(
    tokenizer, context: str, continuation: str, verbatim: bool = False
) -> tuple[list[int], list[int]]:
    return encode_pairs(tokenizer, [(context, continuation, verbatim)])[0]


def encode_pairs(
    tokenizer, pairs: list[tuple[str, str, bool]]
) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) token ids of each (context, continuation, verbatim), as lm-eval
    splits them. The tokenizer is called once on the distinct texts: one call per text, with a
    context shared by every choice of a question, took 42% of scoring a toy's 5,500 items."""
    moved = []
    for context, continuation, verbatim in pairs:
        n_spaces = 0 if verbatim else len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        moved.append((context, context + continuation))
    texts = list(dict.fromkeys(t for both in moved for t in both))
    ids = dict(zip(texts, tokenizer(texts)["input_ids"]))
    return [(ids[ctx], ids[whole][len(ids[ctx]) :]) for ctx, whole in moved]


def default_batch_tokens(device: torch.device) -> int:
    """Tokens per forward batch: on CPU 256, or a share of the free GPU memory for the 8B models.

    A batch has a fixed height for its rows' width (`batches`), so a set spread over many widths
    runs, for each width, a batch's worth of tokens however few of its rows have that width: at
    1024 tokens SmolLM2's letter screen (80 0-shot questions, 3,045 tokens) ran 10,816 tokens, at
    256 it runs 3,576. The matrix multiplies barely care: on a 2-core AMD EPYC (AVX-512
    bfloat16) a Qwen2.5-Coder-1.5B MLP projection runs at 385 GFLOP/s on 256 rows and 412 on
    1,000. Measured side by side there (`benchmarks/batch_tokens.py`: one clean pass of each of
    the CPU chapters' sets, SmolLM2 and Qwen-1.5B, the log-likelihoods equal to the last bit at
    every budget), 256 against 1024: the letter screen 2.2x and 3.1x faster, its cloze twins
    1.6x and 1.4x, five-shot questions 1.2x and 1.5x, KV prompts within 5% either way; all the
    sets 1.38x (128: 1.21x, slower on KV's rows of 64 to 72 tokens, one a batch). Larger
    batches cost the allocator too: a tensor over glibc's mmap threshold (32 MiB at most) is
    mapped fresh and faulted in page by page on every allocation (at 4096 tokens a Qwen-1.5B MLP
    activation is 73 MB: 16% of a scoring run in the kernel, 200 M page faults);
    `keep_freed_memory` keeps the smaller ones on the heap.

    `GA_BATCH_TOKENS` sets it (`batch_tokens_set`). Smoke builds of the book run 128
    (`book.smoke_batches`): their sets are a few prompts, and a scan that loops over tokens
    (Falcon-Mamba's, without kernels) does the filler rows' work at every step (4 KV prompts
    through its 64 layers: 95.6 s at 1024, 17.0 s at 128, the same log-likelihoods)."""
    if device.type == "cpu":
        keep_freed_memory()
    given = batch_tokens_set()
    if given is not None:
        return given
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(max(2048, min(65536, free // (2 * 1024 * 1024))))
    return 256


def batch_tokens_set() -> int | None:
    """The tokens per forward batch that `GA_BATCH_TOKENS` sets (None where it is unset). In
    bfloat16 a row's rounding depends on its batch's shape, so a store's name carries it
    (`protocol.stores.numerics_tag`)."""
    given = os.environ.get("GA_BATCH_TOKENS", "")
    if not given:
        return None
    if not given.isdigit() or int(given) < 1:
        raise ConfigError(
            f"GA_BATCH_TOKENS must be a number of tokens, at least 1, got {given!r}: set it to "
            f"e.g. 1024 or unset it"
        )
    return int(given)


@functools.cache
def keep_freed_memory() -> None:
    """Ask glibc (where it is the C library) to keep freed memory for reuse rather than return
    it to the system, so that each batch reuses the pages of the one before instead of faulting
    in fresh ones: the threshold above which an allocation is mapped on its own at its maximum,
    trimming and top padding large."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # macOS, musl: nothing to tune
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
    mallopt(M_TOP_PAD, 256 * 2**20)


def default_row_tokens(device: torch.device) -> int:
    """The widest row that shared-prefix packing fills. Masked attention over a row costs its
    width squared: on CPU, rows of 256 tokens scored 100 of the letter set's 0-shot questions
    through 23 layers of Qwen2.5-Coder-1.5B in 14.4 s, rows of 2048 in 23.9 s and no sharing
    (one row per question) in 17.3 s, measured side by side; a GPU's attention kernels make
    wide rows cheap."""
    return 2048 if device.type == "cuda" else 256


@dataclass
class Rows:
    """The evaluation set as model rows, longest first. For each scored token: its row, the
    position whose output predicts it, its id, and the (item, choice) pair it belongs to."""

    ids: torch.Tensor  # [R, T], right-padded
    lengths: torch.Tensor  # [R]
    positions: torch.Tensor  # [R, T]
    allowed: torch.Tensor | None  # [R, T, T] keys each query may read; None: causal
    row: torch.Tensor
    pos: torch.Tensor
    target: torch.Tensor
    pair: torch.Tensor
    n_pairs: int
    pad_id: int


def shared_prefix(tokenizer, context: str, ctx: list[int]) -> tuple[int, ...]:
    """The context's tokens up to about its last few-shot delimiter (MMLU's description and
    solved examples): the longest run of the delimited text's tokens that the whole context
    also starts with (tokenisers may split the delimiter differently before the question)."""
    cut = context.rfind(FEWSHOT_DELIMITER)
    if cut < 0:
        return ()
    prefix = tokenizer.encode(context[: cut + len(FEWSHOT_DELIMITER)])
    k = 0
    while k < min(len(prefix), len(ctx) - 1) and prefix[k] == ctx[k]:
        k += 1
    return tuple(ctx[:k])


def pack(items: list[Item], tokenizer, shared_rows: bool, max_row_tokens: int = 2048) -> Rows:
    """Rows for `items`.

    shared_rows=False: one row per distinct model input (the plain scorer's rows).
    shared_rows=True (attention models): one row holds a shared few-shot prefix once, then
    several questions, each followed by its choices' continuations; a mask lets a question read
    the prefix and itself, and a continuation the prefix, its question and itself, with
    positions numbered as if each stood alone."""
    if not items:
        raise ValueError("no items to score: the evaluation set is empty")
    encoded = encode_pairs(tokenizer, [(c, x, it.verbatim) for it in items for c, x in it.pairs])
    for (ctx, cont), (c, x) in zip(encoded, [p for it in items for p in it.pairs]):
        if not ctx or not cont:
            raise ValueError(
                f"empty context or continuation after tokenisation: {c[-40:]!r} / {x!r}"
            )
    contexts = [c for it in items for c, _ in it.pairs]
    units: dict[tuple, list[int]] = {}  # a model input (shared rows: a context) -> its pairs
    for p, (ctx, cont) in enumerate(encoded):
        units.setdefault(tuple(ctx) if shared_rows else tuple(ctx + cont[:-1]), []).append(p)
    groups: dict[tuple, list[tuple]] = {}  # shared prefix -> units behind it
    for key, pairs in units.items():
        prefix = shared_prefix(tokenizer, contexts[pairs[0]], list(key)) if shared_rows else ()
        groups.setdefault(prefix, []).append(key)

    rows = []  # (tokens, positions, unit per token, choice per token, scored)
    for prefix, keys in groups.items():
        row = None
        for key in keys:
            body = list(key[len(prefix) :])
            size = len(body) + sum(len(encoded[p][1]) - 1 for p in units[key])
            if row is None or (prefix and len(row[0]) + size > max_row_tokens) or not prefix:
                row = (
                    list(prefix),
                    list(range(len(prefix))),
                    [-1] * len(prefix),
                    [0] * len(prefix),
                    [],
                )
                rows.append(row)
            tokens, pos, unit, choice, scored = row
            u = max(unit, default=-1) + 1
            tokens += body
            pos += range(len(prefix), len(key))
            unit += [u] * len(body)
            choice += [0] * len(body)
            last = len(tokens) - 1  # the position that predicts each continuation's first token
            for j, p in enumerate(units[key], start=1):
                cont = encoded[p][1]
                if shared_rows:
                    start = len(tokens)
                    tokens += cont[:-1]
                    pos += range(len(key), len(key) + len(cont) - 1)
                    unit += [u] * (len(cont) - 1)
                    choice += [j] * (len(cont) - 1)
                    preds = [last] + list(range(start, start + len(cont) - 1))
                else:
                    preds = list(range(len(encoded[p][0]) - 1, len(encoded[p][0]) - 1 + len(cont)))
                scored += [(q, t, p) for q, t in zip(preds, cont)]
    rows.sort(key=lambda r: -len(r[0]))
    T = len(rows[0][0])
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r[0] + [pad] * (T - len(r[0])) for r in rows])
    positions = torch.tensor([r[1] + list(range(len(r[1]), T)) for r in rows])
    allowed = None
    if shared_rows:
        unit = torch.tensor([r[2] + [-2] * (T - len(r[2])) for r in rows])
        choice = torch.tensor([r[3] + [0] * (T - len(r[3])) for r in rows])
        uq, uk = unit[:, :, None], unit[:, None, :]
        cq, ck = choice[:, :, None], choice[:, None, :]
        same = (uk == -1) | ((uk == uq) & ((ck == 0) | (ck == cq)))
        allowed = torch.ones(T, T, dtype=torch.bool).tril() & same & (uk != -2)
        allowed |= torch.eye(T, dtype=torch.bool)  # pads read themselves (no empty softmax rows)
    scored = [(i, q, t, p) for i, r in enumerate(rows) for q, t, p in r[4]]
    r, q, t, p = (torch.tensor(c) for c in zip(*scored))
    return Rows(
        ids,
        torch.tensor([len(r[0]) for r in rows]),
        positions,
        allowed,
        r,
        q,
        t,
        p,
        len(encoded),
        pad,
    )


@dataclass
class RowBatch:
    """Rows that run together at one width (see `batches`), and the batch's scored tokens: row
    within the batch, position, target id, pair index; and the distinct positions they are read
    at (`row * width + pos`, once each: MMLU's four letters are read at one position, so the
    vocabulary projection runs there once, not four times)."""

    rows: torch.Tensor
    width: int
    row: torch.Tensor
    pos: torch.Tensor
    target: torch.Tensor
    pair: torch.Tensor
    sites: torch.Tensor  # [n_sites] distinct flat positions in the batch's [rows * width]
    site_of: torch.Tensor  # [n_scored] which of `sites` each scored token is read at
    n_real: int  # rows that hold items: the first ones (the rest fill the batch to its height)
    block: int  # sites per pass of the vocabulary projection (`site_block`)

    def logprobs(self, hidden: torch.Tensor, head, offset: int = 0) -> torch.Tensor:
        """Each scored token's log-probability [n_scored] (float32 log-softmax over the
        vocabulary) from the batch's final hidden states [rows, width, d], after `head`, read
        `offset` places further on (a copy of the rows further down the pass). The
        sites go through the head in blocks of `block` (the last one filled with zeros), so
        that the head's multiply and the log-softmax, whose rounding depends on how many rows
        they hold, see the same shape whichever items share the batch."""
        at = hidden.flatten(0, 1)[(self.sites + offset).to(hidden.device)]
        # In the head's dtype: a backbone with `residual_in_fp32` (Falcon-Mamba) returns float32
        # hidden states beside a bfloat16 head (a weightless head, an oracle's Identity, takes them as they are).
        at = at.to(getattr(head, "weight", at).dtype)
        blocks = []
        for block in at.split(self.block):
            filled = torch.cat([block, block.new_zeros(self.block - len(block), *block.shape[1:])])
            blocks.append(torch.log_softmax(head(filled).float(), dim=-1)[: len(block)])
        logp = torch.cat(blocks)
        return logp[self.site_of.to(hidden.device), self.target.to(hidden.device)]


def site_block(batch_tokens: int) -> int:
    """Scored positions per pass of the vocabulary projection: about one per 8 tokens of the
    batch budget, a power of two from 16 to 64 (16 at the smoke books' 128, 32 at the CPU's 256,
    64 from 512 on, a GPU's budget). A batch reads about one site per 9 tokens of KV prompts, one
    per 4 of cloze continuations, one per 50 of letter questions; a block of 64 at the CPU's
    budget ran mostly zeros through a head of 150,000 to 260,000 words, which costs by its rows
    (Qwen-1.5B's head in bfloat16 on 2 cores: 132 ms at 64 rows, 80 at 32, 56 at 16), while a
    row's result does not depend on how many share the block from 4 rows on
    (`benchmarks/site_block.py` measures both)."""
    return min(64, max(16, 1 << (max(1, batch_tokens // 8) - 1).bit_length()))


MAX_ROWS = 128  # rows per forward at most, whatever the budget (a GPU's budget is large)
ONE_ROW = (
    1  # a batch budget below any row's width: every row a forward pass of its own, no filler rows
)


def bucket_width(length: int) -> int:
    """The width a row of `length` tokens runs at: rounded up to a step of at least 8 tokens
    and at most 1/16 of the length (at most about 6% padding)."""
    step = max(8, 1 << max(0, length.bit_length() - 5))
    return -(-length // step) * step


def rows_per_batch(width: int, batch_tokens: int) -> int:
    return max(1, min(MAX_ROWS, batch_tokens // width))


def batches(rows: Rows, batch_tokens: int) -> tuple[Rows, list[RowBatch]]:
    """The rows laid out in forward passes of a fixed shape, and those passes: a row of
    length n runs at `bucket_width(n)` in a batch of `rows_per_batch` rows, filled with rows of
    pad tokens (length 0, nothing scored) where its bucket runs out.

    The shape of every matrix multiply a row meets is then a function of its own length alone,
    never of the other items in the set. In bfloat16 that is what keeps an item's score the same
    alone, in any set, and in any order: a multiply's rounding depends on its shape (the number
    of rows and how they are split between threads), and an item's log-likelihoods moved by up to
    0.26 nats (SmolLM2, KV prompts) with the neighbours that decided its batch's width and height.
    It costs the filler rows and the rounded-up widths (about 5% more tokens on 100 KV prompts of
    16 keys, 20% on 500 short letter questions, where the partial batches weigh most)."""
    widths = [bucket_width(int(n)) for n in rows.lengths]
    order: list[int] = []  # for each laid-out row, the packed row it holds (-1: a filler row)
    # (first laid-out row, rows, width, real rows) of each batch
    spans: list[tuple[int, int, int, int]] = []
    start = 0
    while start < len(widths):
        width = widths[start]
        size = rows_per_batch(width, batch_tokens)
        stop = start
        while stop < len(widths) and stop - start < size and widths[stop] == width:
            stop += 1
        spans.append((len(order), size, width, stop - start))
        order += list(range(start, stop)) + [-1] * (size - (stop - start))
        start = stop
    laid = _laid_out(rows, order, max(widths))
    out = []
    for first, size, width, n_real in spans:
        sel = (laid.row >= first) & (laid.row < first + size)
        row, pos = laid.row[sel] - first, laid.pos[sel]
        sites, site_of = torch.unique(row * width + pos, return_inverse=True)
        out.append(
            RowBatch(
                torch.arange(first, first + size),
                width,
                row,
                pos,
                laid.target[sel],
                laid.pair[sel],
                sites,
                site_of,
                n_real,
                site_block(batch_tokens),
            )
        )
    return laid, out


def _laid_out(rows: Rows, order: list[int], width: int) -> Rows:
    """`rows` reordered as `order` says (-1: a filler row of pad tokens) and right-padded to `width`."""
    n, T = len(order), rows.ids.shape[1]
    real = torch.tensor([i for i in order if i >= 0])
    at = torch.tensor([k for k, i in enumerate(order) if i >= 0])
    ids = torch.full((n, width), rows.pad_id, dtype=rows.ids.dtype)
    ids[at, :T] = rows.ids[real]
    positions = torch.arange(width).repeat(n, 1)
    positions[at, :T] = rows.positions[real]
    lengths = torch.zeros(n, dtype=rows.lengths.dtype)
    lengths[at] = rows.lengths[real]
    allowed = None
    # pads and filler rows read themselves only (no empty softmax rows)
    if rows.allowed is not None:
        allowed = torch.eye(width, dtype=torch.bool).repeat(n, 1, 1)
        allowed[at, :T, :T] = rows.allowed[real]
    new_index = torch.empty(len(rows.ids), dtype=torch.long)
    new_index[real] = at
    return Rows(
        ids,
        lengths,
        positions,
        allowed,
        new_index[rows.row],
        rows.pos,
        rows.target,
        rows.pair,
        rows.n_pairs,
        rows.pad_id,
    )
