"""Attention maps of the Gather and Aggregate heads (the paper's Fig. 1; Fig. 5 for SSMs).

Record each head's attention probabilities (an SSM head's hidden attention) over a prompt, mark
the prompt's segments (the `key:value` lines of a dictionary, the answer options of an MMLU
question), and read off what the G&A hypothesis says the two heads do:

- the Gather head, at each segment's last token, reads inside that segment (and is more than a
  previous-token head, which stays inside a segment by looking one token back);
- the Aggregate head, from the final position, reads the segments' last tokens, most of all the
  one of the segment holding the answer.

Each reading is a number per prompt; the verdicts take a 95% bootstrap interval of its mean over
prompts and ask on which side of the line the interval lies. The heads are the paper's where it
names them for the model (read from data/reference), else found by behaviour among the shared KV
ranking's candidates (`roles.find_roles`, the assignment every chapter names; where no candidate
plays a role, the closest: `roles.with_closest`, as masking does). Where a role has several heads
(Llamba's two Aggregate heads, Falcon-Mamba's channel sets) its map is the mean of theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import heads as hd
from .. import registry
from .. import verdicts as v
from ..engine import SweepEngine
from ..heads import Head
from ..protocol import base, checks, fields, loading, shared, stores
from ..protocol.roles import (
    ANSWER_END,
    ROLE_NAMES,
    Roles,
    check_pair,
    check_roles_of,
    find_roles,
    head_maps,
    measures,
    with_closest,
)
from ..reference import paper, paper_heads
from ..segments import Segments
from ..stats import Estimate, Score, mean_interval
from ..sweep import sweep

LINE = 0.5  # "most of its mass": the line every share is tested against
MIN_PROMPTS = 5  # fewer prompts than this: a bootstrap interval means little, no verdict is decided
MEASURES = {  # what the summary table shows, as the reader would name it
    hd.GATHER_MEASURE: "segment ends: share kept in their own segment",
    hd.LOCAL_MEASURE: "segment ends: share on themselves and the previous token",
    hd.SEGMENTS_MEASURE: "final position: share of its attention on the segments",
    hd.AGGREGATE_MEASURE: "final position: share on the segment ends",
    ANSWER_END: "final position: the answer's end, share of the ends",
    "answer key": "final position: mass on the answer's key",
    "answer value": "final position: mass on the answer's value",
}


@dataclass(frozen=True)
class Config(base.Config):
    model: str = fields.model("attention", "ssm")
    # None: the paper's, or found by behaviour
    gather: tuple[Head, ...] | None = fields.heads(optional=True)
    aggregate: tuple[Head, ...] | None = fields.heads(optional=True)
    n_prompts: int = fields.count()  # KV prompts measured
    n_mmlu: int | None = fields.count(optional=True)  # MMLU questions measured (None: all)
    kv_pairs: int = fields.count()
    kv_query: str = fields.one_of("paper", "repeat")
    seed: int = fields.seed()

    chapter = "attention_maps"
    smoke_sizes = dict(n_prompts=3, n_mmlu=3)

    @classmethod
    def defaults(cls, profile):
        if profile == "cpu":
            return dict(
                model=registry.cast(profile, "retrieval"),
                gather=None,
                aggregate=None,
                n_prompts=60,
                n_mmlu=60,
                kv_pairs=8,
                kv_query="repeat",
                seed=0,
            )
        return dict(
            model=registry.cast(profile, "retrieval"),
            gather=None,
            aggregate=None,
            n_prompts=500,
            n_mmlu=500,
            kv_pairs=8,
            kv_query="paper",
            seed=0,
        )

    def __post_init__(self):
        super().__post_init__()
        check_pair(self.gather, self.aggregate)
        check_roles_of(self.model, self.gather, self.aggregate)
        checks.check_kv_sizes(self.model, "kv_pairs", [self.kv_pairs])


# --- maps and measures -------------------------------------------------------------------------


def role_maps(loaded, context: str, heads: dict[str, tuple[Head, ...]]) -> dict[str, np.ndarray]:
    """Each role's map: |attention| of its head, the mean over its heads where it has several
    (`heads`: role -> its heads, a `Roles`' heads)."""
    maps = head_maps(loaded, context, [h for hs in heads.values() for h in hs])
    return {r: np.mean([np.abs(maps[h]) for h in hs], axis=0) for r, hs in heads.items()}


def interval(values) -> tuple[float, float, float, int]:
    """Mean of per-prompt values with its 95% bootstrap interval (`stats.mean_interval`), and n."""
    x = np.asarray(values, dtype=float)
    return (*mean_interval(x), int((~np.isnan(x)).sum()))


def fmt(values) -> Estimate:
    """The mean over prompts with its interval and n: "0.62 [0.55, 0.70], n=40" as text."""
    return Estimate(*interval(values))


def side(values, line: float, above: bool = True) -> str:
    """Reproduced when the interval of the mean lies above `line` (below it, with above=False),
    not reproduced when it lies on the other side, inconclusive when it straddles the line or
    rests on fewer than MIN_PROMPTS prompts."""
    m, lo, hi, n = interval(values)
    if n < MIN_PROMPTS:
        return v.INCONCLUSIVE
    if not above:
        lo, hi, line = -hi, -lo, -line
    return v.REPRODUCED if lo > line else v.NOT_REPRODUCED if hi < line else v.INCONCLUSIVE


# --- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    cfg: Config
    roles: Roles
    accuracy: dict[str, Score]  # benchmark -> the model's accuracy: is there retrieval to read?
    chance: dict[str, float]
    measures: dict[str, pd.DataFrame]  # benchmark -> one row per role and prompt
    # benchmark -> its first prompt: segments, role maps
    examples: dict[str, tuple[Segments, dict[str, np.ndarray]]]
    provenance: dict
    # benchmark -> its kind (`benchmarks.Benchmark.kind`)
    kinds: dict[str, str] = field(default_factory=dict)

    @property
    def kv(self) -> str:
        return next(b for b in self.measures if self.kinds.get(b) == bm.KV)

    @property
    def mcq(self) -> str:
        return next(b for b in self.measures if b != self.kv)


def run(cfg: Config) -> Result:
    timer = base.Timer()
    loaded = loading.load(cfg.model)
    # A head for every role: where no candidate plays one, the closest (said so on the page).
    roles = with_closest(
        find_roles(
            loaded, cfg.profile, cfg.smoke, cfg.gather, cfg.aggregate, seed=cfg.seed, measure=False
        )
    )
    sets = [
        shared.held_out_kv(
            cfg.model,
            loaded.tokenizer,
            cfg.n_prompts,
            shared.ranking_settings(cfg.profile, cfg.smoke)["n"],
            cfg.kv_pairs,
            cfg.seed,
            cfg.kv_query,
        ),
        shared.mmlu(cfg, cfg.model, loaded.tokenizer, cfg.n_mmlu),
    ]
    store = stores.open_store(cfg.chapter, cfg.profile, "measures", [loaded], measure_maps)
    cells = [
        dict(
            model=cfg.model,
            benchmark=b.name,
            items=b.spec,
            **{r: list(map(str, hs)) for r, hs in roles.heads.items()},
        )
        for b in sets
    ]
    rows = {r["benchmark"]: r for r in sweep(store, cells, measure_maps, desc="benchmarks")}
    examples = {
        b.name: (b.segments(b.items[0]), role_maps(loaded, b.items[0].pairs[0][0], roles.heads))
        for b in sets
    }
    return Result(
        cfg,
        roles,
        {b: Score.from_json(r["accuracy"]) for b, r in rows.items()},
        {b.name: b.chance for b in sets},
        {b: pd.DataFrame(r["rows"]) for b, r in rows.items()},
        examples,
        base.record(cfg, [loaded], timer),
        {b.name: b.kind for b in sets},
    )


def measure_maps(cell: dict) -> dict:
    """On one benchmark (the cell's items), the model's accuracy and each role's measures on
    every prompt, its heads given by the cell's "G" and "A" (lists of heads as text; a
    measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    b = bm.from_spec(cell["items"], loaded.tokenizer)
    heads = {r: tuple(map(Head.parse, cell[r])) for r in ROLE_NAMES}
    rows = [
        dict(role=r, prompt=i, **measures(a, b.segments(item)))
        for i, item in enumerate(b.items)
        for r, a in role_maps(loaded, item.pairs[0][0], heads).items()
    ]
    return {
        "accuracy": SweepEngine(loaded, loaded.tokenizer, b.items).score().to_json(),
        "rows": rows,
    }


# --- what it says ------------------------------------------------------------------------------


def source(result: Result) -> str:
    return "Fig. 1" if registry.spec(result.cfg.model).mixer == "attention" else "Fig. 5"


def short(result: Result, benchmark: str) -> str:
    return "KV" if benchmark == result.kv else benchmark.split(" (")[0]


def verdicts(result: Result) -> list[v.Verdict]:
    out, fig, roles = [], source(result), result.roles
    for name, m in result.measures.items():
        task = short(result, name)
        acc, chance = result.accuracy[name], result.chance[name]
        if not acc.above(chance):
            out.append(
                v.Verdict(
                    f"{task}: the Gather and Aggregate patterns",
                    fig,
                    v.NOT_TESTABLE,
                    f"the model's {name} accuracy does not clear chance ({acc}, chance {chance:.0%}): "
                    "no retrieval to show the mechanism of",
                )
            )
            continue
        g, a = m[m.role == "G"], m[m.role == "A"]
        note = {
            r: ""
            if roles.filled[r]
            else f"no top head behaves as the {ROLE_NAMES[r]} head; the closest, {roles.label(r)}: "
            for r in ROLE_NAMES
        }
        inside, local = (
            side(g[hd.GATHER_MEASURE], LINE),
            side(g[hd.LOCAL_MEASURE], hd.LOCAL, above=False),
        )
        out.append(
            v.Verdict(
                f"{task}: the Gather head {roles.label('G')} keeps each segment end's attention inside its segment, "
                "and is not a previous-token head",
                fig,
                v.every([inside, local]),  # both parts
                f"{note['G']}share kept in the own segment {fmt(g[hd.GATHER_MEASURE])} (line {LINE}); share on "
                f"the end itself and the token before {fmt(g[hd.LOCAL_MEASURE])} (previous-token heads: above {hd.LOCAL})",
            )
        )
        out.append(
            v.Verdict(
                f"{task}: the Aggregate head {roles.label('A')} reads the segment ends from the final position",
                fig,
                side(a[hd.AGGREGATE_MEASURE], LINE),
                f"{note['A']}share of its in-segment attention on the segment ends {fmt(a[hd.AGGREGATE_MEASURE])} "
                f"(line {LINE})",
            )
        )
        out.append(
            v.Verdict(
                f"{task}: of the ends, the Aggregate head reads mostly the answer's",
                fig,
                side(a[ANSWER_END], LINE),
                f"{note['A']}the answer's end takes {fmt(a[ANSWER_END])} of the mass on the ends (line {LINE}; "
                f"uniform over the segments: {1 / len(result.examples[name][0].ends):.2f})",
            )
        )
    return out


def roles_table(result: Result) -> pd.DataFrame:
    """Which heads play which role, and why: by behaviour, every candidate of the KV ranking
    with the measures that decide (means over the ranking's prompts)."""
    r = result.roles
    if r.measures is None:
        return pd.DataFrame(
            {"role": list(ROLE_NAMES.values()), "heads": [r.describe(x) for x in ROLE_NAMES]}
        )
    rows = []
    for index, m in r.measures.iterrows():
        head = Head(*index)
        role = next((x for x in ROLE_NAMES if head in r.heads[x]), None)
        name = (
            "-"
            if role is None
            else ROLE_NAMES[role] + ("" if r.filled[role] else " (closest; none behaves as one)")
        )
        deciding = (hd.GATHER_MEASURE, hd.LOCAL_MEASURE, hd.SEGMENTS_MEASURE, hd.AGGREGATE_MEASURE)
        rows.append(
            {"head": str(head), "role": name, **{MEASURES[k]: f"{m[k]:.2f}" for k in deciding}}
        )
    return pd.DataFrame(rows)


def summary(result: Result) -> pd.DataFrame:
    """The measures, per benchmark and role: mean over prompts [95% interval], n."""
    table = {}
    for name, m in result.measures.items():
        task = short(result, name)
        for r in ROLE_NAMES:
            part = m[m.role == r]
            table[f"{task}: {r} {result.roles.label(r)}"] = [fmt(part[k]) for k in MEASURES]
    return (
        pd.DataFrame(table, index=list(MEASURES.values()))
        .rename_axis("measure (mean over prompts)")
        .reset_index()
    )


def comparison(result: Result) -> pd.DataFrame:
    cfg, roles = result.cfg, result.roles
    ref = cfg.model if paper_heads(cfg.model) else registry.cast("paper", "llama")
    kv = result.measures[result.kv]
    g, a = kv[kv.role == "G"], kv[kv.role == "A"]
    return base.comparison_table(
        [
            (
                "model",
                "Llama-3.1-8B (Fig. 1); SSMs' hidden attention (Fig. 5)",
                "visualize.py: Llamba (materialised heads)",
                f"{cfg.model} ({cfg.profile} profile)",
            ),
            (
                "Gather head",
                f"{paper('head_zeroing', 'gather_head', ref).value} ({ref})",
                "GATHER_HEADS (notebook cell 13)",
                roles.describe("G"),
            ),
            (
                "Aggregate head",
                f"{paper('head_zeroing', 'aggregate_head', ref).value} ({ref})",
                "AGGREGATE_HEADS (notebook cell 15)",
                roles.describe("A"),
            ),
            (
                "prompt",
                "an MMLU question (Fig. 1)",
                "one input text, scored over A-D",
                f"KV prompts ({cfg.kv_pairs} keys, query '{cfg.kv_query}') and MMLU questions, seed {cfg.seed}",
            ),
            (
                "maps drawn",
                "-",
                "one panel per head, whole map min-max normalised",
                "one figure per role (mean over its heads), each row scaled to its maximum; SSMs: |hidden attention|",
            ),
            (
                "G: share kept in the own segment (KV)",
                "inside each segment (Fig. 1)",
                "-",
                fmt(g[hd.GATHER_MEASURE]),
            ),
            (
                "A: share on the segment ends (KV)",
                "the segments' last tokens (Fig. 1)",
                "-",
                fmt(a[hd.AGGREGATE_MEASURE]),
            ),
            (
                "A: the answer's end, share of the ends (KV)",
                "mostly the answer's (Fig. 1)",
                "-",
                fmt(a[ANSWER_END]),
            ),
            (
                "accuracy (is there retrieval to read?)",
                "-",
                "-",
                "; ".join(
                    f"{b}: {s} (chance {result.chance[b]:.0%})" for b, s in result.accuracy.items()
                ),
            ),
        ]
    )


def subject(result: Result) -> str:
    roles = result.roles
    return f"on the {result.cfg.profile} profile, {result.cfg.model}: G {roles.label('G')}, A {roles.label('A')}"


def figure(result: Result, benchmark: str, role: str):
    """One role's map over the benchmark's first prompt (`plots.attention_figure`)."""
    from .. import plots

    seg, maps = result.examples[getattr(result, benchmark)]
    kind = "attention" if source(result) == "Fig. 1" else "|hidden attention|"
    title = (
        f"{result.cfg.model}, {ROLE_NAMES[role]} {result.roles.label(role)}: {kind} "
        f"over {'a KV prompt' if benchmark == 'kv' else 'an MMLU question'}"
    )
    return plots.attention_figure(maps[role], seg, title)
