"""Where the segments of a prompt are, token by token, and the attention patterns of the G&A
hypothesis over them.

A segment is one line the circuit summarises: a `key:value` line of a KV prompt, or an
`A. option` line of an MMLU question. Its last token (the newline) is where the paper's Gather
head writes the summary, and where its Aggregate head reads it from the final position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from .heads import (
    AGGREGATE_MEASURE,
    ENDS_MEASURE,
    GATHER_MEASURE,
    LETTERS_MEASURE,
    LOCAL_MEASURE,
    SEGMENT_FLOOR,
    SEGMENTS_MEASURE,
)

if TYPE_CHECKING:
    from .stats import Score


@dataclass
class Segments:
    labels: list[str]  # each token, decoded, for axis labels
    segment: np.ndarray  # segment index per token, -1 outside every segment
    # "key" (KV) or "letter" (MCQ), "sep", "value", "end" inside segments; "query", "other" outside
    role: list[str]
    target: int  # the segment holding the answer

    @property
    def ends(self) -> list[int]:
        """The last token of each segment, in order."""
        return [int(np.flatnonzero(self.segment == s)[-1]) for s in range(self.segment.max() + 1)]

    def __len__(self) -> int:
        return len(self.labels)


def _by_chars(
    tokenizer,
    text: str,
    spans: list[tuple[int, int, list[tuple[int, str]]]],
    query_from: int,
    target: int,
) -> Segments:
    """Token segments from character spans: (start, end, [(char offset, role from there)])."""
    # Tokenised as the model reads it (with a BOS where the tokenizer adds one: offsets (0, 0)).
    enc = tokenizer(text, return_offsets_mapping=True)
    segment = np.full(len(enc.input_ids), -1)
    role = ["other"] * len(segment)
    for t, (a, b) in enumerate(enc.offset_mapping):
        for s, (start, end, roles) in enumerate(spans):
            if start <= a < end:
                segment[t] = s
                role[t] = [r for off, r in roles if off <= a][-1]
        if a >= query_from and b > a:
            role[t] = "query"
    labels = [tokenizer.decode([i]).replace("\n", "\\n") for i in enc.input_ids]
    return Segments(labels, segment, role, target)


def kv_segments(tokenizer, context: str) -> Segments:
    """Segments of a KV-retrieval prompt: one per dictionary line, the newline included."""
    lines = context.split("\n")
    header, rows, query = lines[0], lines[1:-1], lines[-1]
    spans, pos = [], len(header) + 1
    for row in rows:
        key, _, _ = row.partition(":")
        spans.append(
            (
                pos,
                pos + len(row) + 1,
                [
                    (pos, "key"),
                    (pos + len(key), "sep"),
                    (pos + len(key) + 1, "value"),
                    (pos + len(row), "end"),
                ],
            )
        )
        pos += len(row) + 1
    asked = re.search(r"'(.*)'", query).group(1) if "'" in query else query.rstrip(": ").rstrip(":")
    target = [r.partition(":")[0] for r in rows].index(asked)
    return _by_chars(tokenizer, context, spans, pos, target)


def mcq_segments(tokenizer, context: str, gold: int) -> Segments:
    """Segments of an MMLU prompt: the answer options of its last question, one per line."""
    start = context.rindex("\nA. ") + 1
    end = context.rindex("\nAnswer:") + 1
    spans, pos = [], start
    for line in context[start:end].split("\n")[:-1]:
        spans.append(
            (
                pos,
                pos + len(line) + 1,
                [(pos, "letter"), (pos + 1, "sep"), (pos + 2, "value"), (pos + len(line), "end")],
            )
        )
        pos += len(line) + 1
    return _by_chars(tokenizer, context, spans, end, gold)


# --- patterns: which keys each query may read --------------------------------------------------


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def gather_pattern(seg: Segments, control: bool = False) -> torch.Tensor:
    """Queries inside a segment read only their own segment (control: only outside it); other
    queries are left causal."""
    s = torch.as_tensor(seg.segment)
    inside = s[:, None] >= 0
    same = s[:, None] == s[None, :]
    allowed = torch.where(inside, same ^ control, torch.ones_like(same))
    allowed = allowed & causal(len(seg))
    return allowed | torch.eye(len(seg), dtype=torch.bool) if control else allowed


def aggregate_pattern(seg: Segments, control: bool = False) -> torch.Tensor:
    """The final position reads only the segments' last tokens (control: only the other tokens
    of the segments); every other query is left causal."""
    allowed = causal(len(seg))
    ends = torch.zeros(len(seg), dtype=torch.bool)
    ends[seg.ends] = True
    inside = torch.as_tensor(seg.segment) >= 0
    allowed[-1] = (inside & ~ends) if control else ends
    return allowed


# --- reading attention -------------------------------------------------------------------------


def mass_by_role(row: np.ndarray, seg: Segments) -> dict[str, float]:
    """Where one query's attention goes: the answer segment's key / value / end, the other
    segments, the query's own tokens, and the rest."""
    out = {
        "answer key": 0.0,
        "answer letter": 0.0,
        "answer value": 0.0,
        "answer end": 0.0,
        "answer sep": 0.0,
        "other segments": 0.0,
        "query": 0.0,
        "rest": 0.0,
    }
    for t, w in enumerate(row):
        if seg.segment[t] == seg.target:
            out[f"answer {seg.role[t]}"] += float(w)
        elif seg.segment[t] >= 0:
            out["other segments"] += float(w)
        elif seg.role[t] == "query":
            out["query"] += float(w)
        else:
            out["rest"] += float(w)
    return out


def sharpness(row: np.ndarray, seg: Segments) -> dict[str, float]:
    """How concentrated one query's attention is over the segments: the share of its
    in-segment mass on the single heaviest segment, and the entropy (nats) of the per-segment
    distribution. For SSM hidden attention the row's absolute values are used."""
    row = np.abs(row)
    per = np.array([row[seg.segment == s].sum() for s in range(seg.segment.max() + 1)])
    total = per.sum()
    if total == 0:
        return {"top segment share": float("nan"), "segment entropy": float("nan")}
    p = per / total
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    return {
        "top segment share": float(p.max()),
        "segment entropy": entropy,
        "answer segment share": float(p[seg.target]),
    }


def score_with_patterns(loaded, items, segmenter, patterns) -> Score:
    """Accuracy when heads may attend only where a per-prompt pattern allows.

    `segmenter(context) -> Segments`; `patterns(seg) -> {(layer, head): allowed [T, T]}` over the
    context's T tokens. Continuation tokens, which come after the context, stay causal. Each
    choice runs in a row of its own."""
    from contextlib import ExitStack
    from dataclasses import replace

    from .attention import mask_attention
    from .evaluate import choice_loglikelihoods, from_loglikelihoods
    from .packing import bucket_width, encode_pair

    lls = []
    for item in items:
        context = item.pairs[0][0]
        if any(c != context for c, _ in item.pairs):
            raise ValueError("pattern masks need one shared context per item")
        seg = segmenter(context)
        ll = []
        for pair in item.pairs:  # one row each, at the width the scorer runs it at
            width = bucket_width(
                sum(map(len, encode_pair(loaded.tokenizer, *pair, item.verbatim))) - 1
            )
            with ExitStack() as stack:
                for (layer, head), pattern in patterns(seg).items():
                    allowed = causal(width)
                    allowed[: len(seg), : len(seg)] = pattern
                    stack.enter_context(mask_attention(loaded, layer, [head], allowed))
                ll += list(
                    choice_loglikelihoods(
                        loaded.model,
                        loaded.tokenizer,
                        [replace(item, pairs=(pair,), gold=0)],
                        batch_tokens=width,
                    )[0]
                )
        lls.append(np.array(ll))
    return from_loglikelihoods(lls, items)


def head_measures(a: np.ndarray, seg: Segments) -> dict[str, float]:
    """Everything the book reads off one head's [T, T] attention (or hidden attention) over a
    prompt: where the final position looks (`mass_by_role`), how sharply (`sharpness`), what
    share of its in-segment mass lands on the tokens a segment can be summarised in (its end,
    the newline; an MCQ option's letter), each and together (an Aggregate head's signature; the
    in-segment mass counted as at least `SEGMENT_FLOOR` of the final position's attention, whose
    share on the segments is reported too), how
    local the segment ends are (the share of their in-segment attention on themselves and the
    previous token: high for a previous-token head, for which staying inside a segment says
    little; taken within the segments, so that a head sending most of its mass to an attention
    sink and the rest to the previous token counts as local), and how much of each segment end's
    in-segment mass stays in its own segment (a Gather head's signature; from the second segment
    on, where another segment is visible)."""
    a = np.abs(a)
    inside = seg.segment >= 0
    local = [(a[e, e] + a[e, e - 1]) / max(a[e][inside].sum(), 1e-12) for e in seg.ends]
    own = [
        a[e][seg.segment == k].sum() / max(a[e][inside].sum(), 1e-12)
        for k, e in enumerate(seg.ends)
        if k > 0
    ]
    on_segments = a[-1][inside].sum() / max(a[-1].sum(), 1e-12)
    total = max(a[-1][inside].sum(), SEGMENT_FLOOR * a[-1].sum(), 1e-12)
    letters = [t for t, r in enumerate(seg.role) if r == "letter"]
    ends = a[-1][seg.ends].sum() / total if seg.ends else float("nan")
    on_letters = a[-1][letters].sum() / total if seg.ends else float("nan")
    return {
        **mass_by_role(a[-1], seg),
        **sharpness(a[-1], seg),
        ENDS_MEASURE: float(ends),
        LETTERS_MEASURE: float(on_letters),
        AGGREGATE_MEASURE: float(ends + on_letters),
        SEGMENTS_MEASURE: float(on_segments),
        LOCAL_MEASURE: float(np.mean(local)) if local else float("nan"),
        GATHER_MEASURE: float(np.mean(own)) if own else float("nan"),
    }


def measure_heads(loaded, items: list, segmenter, heads: list, average: bool = True):
    """`head_measures` of each head over each item's prompt (attention, or hidden attention for
    SSM heads), one forward pass per prompt: one row per head (the mean over prompts), indexed
    by Head; with `average=False`, one row per head and prompt."""
    import pandas as pd

    from .attention import attention_maps

    layers = sorted({h.layer for h in heads})
    rows = []
    for i, item in enumerate(items):
        context = item.pairs[0][0]
        seg = segmenter(item)
        ids = loaded.tokenizer(context, return_tensors="pt").input_ids
        maps = attention_maps(loaded, ids, layers)
        for h in heads:
            rows.append(
                dict(head=h, prompt=i, **head_measures(maps[h.layer][0, h.head].numpy(), seg))
            )
    table = pd.DataFrame(rows)
    if not average:
        return table
    return table.drop(columns="prompt").groupby("head", sort=False).mean()
