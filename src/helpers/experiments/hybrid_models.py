"""Hybrids delegate retrieval to their attention (the paper's §5, Zamba2-7B).

Score retrieval and knowledge with a hybrid as it is and with its attention ablated two ways:

- the released code's ablation: in every attention layer, the final position of each row (its
  last non-pad token) reads nothing through attention, all heads (`attention.mask_final_rows`);
  the release reports MMLU 64.3% -> 34.9% for Zamba2-7B;
- every attention head zeroed where it enters the output projection: what "ablating attention"
  says in the paper's text.

Controls: as many randomly chosen Mamba heads zeroed as there are attention heads, and (where it
is affordable) each attention head alone. The claim is a dissociation: retrieval collapses
towards chance while knowledge is kept.

A hybrid here is a model that runs, the adapter that sees its attention heads and the one that
sees its Mamba heads. Besides a trained hybrid (Zamba2, the zoo's toy-hybrid) the chapter can
build the paper's other kind (§5.4): a distilled SSM with one layer of its Transformer teacher
swapped back in: the hybrid-swap chapter's pair for the profile, and the layer its rule names
(`distilled.find_teacher_layer`).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import registry
from .. import verdicts as v
from ..attention import mask_final_rows
from ..errors import ConfigError
from ..evaluate import score
from ..interventions import swap_layers
from ..protocol import base, checks, distilled, fields, loading, stores
from ..reference import paper
from ..specs import Spec
from ..stats import Score, TaskMean, difference, mean_of
from ..sweep import sweep

AS_IS, MASKED, ZEROED = "as is", "final row masked (released code)", "all attention heads zeroed"
ABLATIONS = (MASKED, ZEROED)


@dataclass(frozen=True)
class Config(base.BenchmarkConfig):
    hybrid: str = fields.model("hybrid")
    swapped: bool = fields.flag()  # also hybrid_swap's student with one teacher layer swapped in
    ssm: str = fields.one_of("none", *registry.names("ssm"))  # a pure SSM scored beside, as is
    n_controls: int = fields.count(minimum=0)
    single_heads: bool = fields.flag()

    chapter = "hybrid_models"
    # Zamba2-7B's 81 layers run on CPU in the rehearsal
    smoke_sizes = dict(n_mmlu=4, n_knowledge=2, n_kv=4)

    @classmethod
    def defaults(cls, profile):
        if profile == "cpu":
            return dict(
                hybrid=registry.cast(profile, "zamba2"),
                swapped=True,
                ssm=registry.cast(profile, "llamba"),
                n_mmlu=500,
                k_shot=0,
                n_knowledge=500,
                n_kv=500,
                kv_pairs=16,
                kv_query="repeat",
                n_controls=5,
                single_heads=True,
                seed=0,
            )
        # On the paper's models each control or single head costs a full MMLU run: none by default.
        return dict(
            hybrid=registry.cast(profile, "zamba2"),
            swapped=False,
            ssm="none",
            n_mmlu=None,
            k_shot=paper("released_settings", "num_fewshot").integer,
            n_knowledge=None,
            n_kv=500,
            kv_pairs=16,
            kv_query="paper",
            n_controls=0,
            single_heads=False,
            seed=0,
        )

    def __post_init__(self):
        super().__post_init__()
        checks.check_kv_sizes(self.hybrid, "kv_pairs", [self.kv_pairs])
        student = self.swap().student if self.swapped else None
        if student and registry.spec(student).toy != registry.spec(self.hybrid).toy:
            raise ConfigError(
                f"the swapped hybrid ({student}) runs {self.hybrid}'s tasks, so both must be toy models "
                f"or neither: use a {'toy' if registry.spec(student).toy else 'paper'} hybrid on the "
                f"{self.profile} profile, or swapped=False"
            )

    def swap(self) -> distilled.Pair:
        """The hybrid-swap chapter's pair on this profile: its student, teacher and layer rule."""
        return distilled.pair(self.profile)


# --- hybrids and conditions -----------------------------------------------------------------------


@dataclass
class Hybrid:
    name: str
    host: registry.Loaded  # the model that runs
    attention: object  # the adapter that sees its attention heads
    attention_layers: list[int]
    mamba: object  # the adapter that sees its Mamba heads
    mamba_layers: list[int]
    running: Callable[[], ContextManager] = (
        nullcontext  # what makes it a hybrid (a swap), if anything
    )
    # what makes it again by the models' names: `hybrid_of`
    spec: dict = field(default_factory=dict)

    @property
    def attention_heads(self) -> dict[int, list[int]]:
        return {l: list(range(self.attention.n_heads(l))) for l in self.attention_layers}


def trained(loaded) -> Hybrid:
    """A hybrid trained as one (Zamba2): its shared attention block's call sites, and the Mamba
    heads of every layer."""
    mamba = loaded.adapter.mamba_heads()
    return Hybrid(
        loaded.name,
        loaded,
        loaded.adapter,
        loaded.adapter.head_layers(),
        mamba,
        mamba.head_layers(),
        spec=dict(trained=loaded.name),
    )


def swapped(student, teacher, layer: int) -> Hybrid:
    """The student SSM with the teacher's layer `layer` in place of its own (the paper's §5.4
    hybrid): its attention heads are the teacher's, its Mamba heads the student's other layers'."""
    return Hybrid(
        f"{student.name} + {teacher.name} L{layer}",
        student,
        teacher.adapter,
        [layer],
        student.adapter,
        [l for l in range(student.adapter.n_layers) if l != layer],
        lambda: swap_layers(student, teacher, [layer]),
        dict(student=student.name, teacher=teacher.name, layer=layer),
    )


def hybrid_of(spec: dict) -> Hybrid:
    """The hybrid a `Hybrid.spec` describes, its models found by name (`loading.models_for`)."""
    if "trained" in spec:
        return trained(loading.model_for(spec["trained"]))
    return swapped(*loading.models_for(spec["student"], spec["teacher"]), spec["layer"])


# What a condition is, beside its name: the verdicts and tables read this, never the name.
BASELINE, ABLATION, CONTROL_DRAW, SINGLE_HEAD = "as is", "ablation", "control", "single head"


@dataclass(frozen=True)
class Condition:
    name: str
    attention: dict[int, list[int]] = field(default_factory=dict)  # attention heads zeroed
    mamba: dict[int, list[int]] = field(default_factory=dict)  # Mamba heads zeroed
    final_row: bool = False  # the released code's mask
    kind: str = BASELINE  # BASELINE, ABLATION, CONTROL_DRAW or SINGLE_HEAD

    def cell(self) -> dict:
        """What the condition does, as JSON values for a results store cell (`of_cell` reads it back)."""
        text = lambda d: {str(l): list(hs) for l, hs in d.items()}
        return dict(
            condition=self.name,
            attention=text(self.attention),
            mamba=text(self.mamba),
            final_row=self.final_row,
        )

    @classmethod
    def of_cell(cls, cell: dict) -> "Condition":
        """The condition a cell does (its kind is not needed to run it)."""
        ints = lambda d: {int(l): list(hs) for l, hs in d.items()}
        return cls(
            cell["condition"], ints(cell["attention"]), ints(cell["mamba"]), cell["final_row"]
        )


CONTROL = "random Mamba heads zeroed"


def conditions(h: Hybrid, cfg: Config) -> list[Condition]:
    """As is, the two ablations, `n_controls` draws of as many random Mamba heads as the hybrid
    has attention heads, and each attention head alone (`single_heads`)."""
    out = [
        Condition(AS_IS),
        Condition(MASKED, final_row=True, kind=ABLATION),
        Condition(ZEROED, attention=h.attention_heads, kind=ABLATION),
    ]
    count = sum(map(len, h.attention_heads.values()))
    pool = [(l, k) for l in h.mamba_layers for k in range(h.mamba.n_heads(l))]
    for i in range(cfg.n_controls):
        picks = np.random.default_rng([cfg.seed, i]).choice(
            len(pool), min(count, len(pool)), replace=False
        )
        chosen: dict[int, list[int]] = {}
        for j in sorted(picks):
            chosen.setdefault(pool[j][0], []).append(pool[j][1])
        out.append(Condition(f"{CONTROL} #{i + 1}", mamba=chosen, kind=CONTROL_DRAW))
    if cfg.single_heads:
        out += [
            Condition(f"L{l}H{k} zeroed", attention={l: [k]}, kind=SINGLE_HEAD)
            for l, hs in h.attention_heads.items()
            for k in hs
        ]
    return out


@contextmanager
def applied(h: Hybrid, c: Condition):
    """The hybrid running under condition `c` (zeroed heads; the final-row mask is per batch)."""
    with ExitStack() as stack:
        stack.enter_context(h.running())
        stack.enter_context(Spec(zero=c.attention).applied(h.attention))
        stack.enter_context(Spec(zero=c.mamba).applied(h.mamba))
        yield


def evaluate(h: Hybrid, c: Condition, items) -> Score:
    """lm-eval's accuracy of the hybrid under `c`. The released mask needs each row's own last
    position, so it is entered around each batch with the batch's row lengths."""
    per_batch = (
        (lambda lengths, width: mask_final_rows(h.attention, lengths, h.attention_layers, width))
        if c.final_row
        else None
    )
    with applied(h, c):
        return score(h.host.model, h.host.tokenizer, items, per_batch=per_batch)


# --- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result(base.ByRole):
    cfg: Config
    conditions: dict[str, list[str]]  # hybrid -> its conditions, in order
    scores: dict[str, dict[str, dict[str, Score]]]  # hybrid -> condition -> benchmark -> score
    ssm: dict[str, Score]  # the pure SSM as is, per benchmark (empty without one)
    swap_layer: distilled.TeacherLayer | None  # how the swapped hybrid's layer was chosen
    roles: dict[str, str]
    chance: dict[str, float]
    provenance: dict
    # hybrid -> condition -> its `Condition.kind`
    kinds: dict[str, dict[str, str]] = field(default_factory=dict)

    def knowledge(self, hybrid: str, condition: str) -> TaskMean:
        """Knowledge under one condition as the release scores it: the unweighted mean over the
        knowledge tasks (paired across conditions task by task)."""
        by = self.scores[hybrid][condition]
        return TaskMean.of(
            [by[t] for t in self.knowledge_tasks], [self.chance[t] for t in self.knowledge_tasks]
        )

    @property
    def knowledge_chance(self) -> float:
        return float(np.mean([self.chance[t] for t in self.knowledge_tasks]))

    def of_kind(self, hybrid: str, kind: str) -> list[str]:
        """The hybrid's conditions of one kind (`Condition.kind`), in order."""
        return [c for c in self.conditions[hybrid] if self.kinds.get(hybrid, {}).get(c) == kind]

    def controls(self, hybrid: str) -> list[str]:
        return self.of_kind(hybrid, CONTROL_DRAW)


def run(cfg: Config) -> Result:
    timer = base.Timer()
    checks.check_available(
        [
            cfg.hybrid,
            *((cfg.swap().student, cfg.swap().teacher) if cfg.swapped else ()),
            *((cfg.ssm,) if cfg.ssm != "none" else ()),
        ]
    )
    main = loading.load(cfg.hybrid)
    tok = main.tokenizer
    retrieval = [
        bm.letter_mcq(cfg.hybrid, tok, cfg.profile, cfg.n_mmlu, cfg.seed, cfg.k_shot),
        bm.kv(cfg.hybrid, tok, cfg.kv_pairs, cfg.n_kv, cfg.seed, cfg.kv_query),
    ]
    benchmarks = retrieval + bm.knowledge(cfg.hybrid, cfg.profile, cfg.n_knowledge, cfg.seed)
    hybrids, loaded, found = [trained(main)], [main], None
    if cfg.swapped:
        pair = cfg.swap()
        student, teacher = loading.load(pair.student), loading.load(pair.teacher)
        found = distilled.find_teacher_layer(
            teacher, retrieval, pair.teacher_layer_by, cfg.profile, cfg.smoke
        )
        hybrids.append(swapped(student, teacher, found.layer))
        loaded += [student, teacher]
    plans = {h.name: conditions(h, cfg) for h in hybrids}
    store = stores.open_store(cfg.chapter, cfg.profile, "ablations", loaded, measure_condition)
    cells = [
        dict(hybrid=h.name, build=h.spec, **c.cell(), **distilled.cell_of(b))
        for h in hybrids
        for c in plans[h.name]
        for b in benchmarks
    ]
    scores: dict = {}
    for r in sweep(store, cells, measure_condition, desc="hybrids x conditions x benchmarks"):
        scores.setdefault(r["hybrid"], {}).setdefault(r["condition"], {})[r["benchmark"]] = (
            Score.from_json(r)
        )
    ssm = {}
    if cfg.ssm != "none":
        pure = loading.load(cfg.ssm)
        loaded.append(pure)
        rows = sweep(
            stores.open_store(cfg.chapter, cfg.profile, "pure-ssm", [pure], measure_as_is),
            [dict(model=cfg.ssm, **distilled.cell_of(b)) for b in benchmarks],
            measure_as_is,
            desc="pure SSM",
        )
        ssm = {r["benchmark"]: Score.from_json(r) for r in rows}
    return Result(
        cfg,
        {h: [c.name for c in cs] for h, cs in plans.items()},
        scores,
        ssm,
        found,
        {b.name: b.role for b in benchmarks},
        {b.name: b.chance for b in benchmarks},
        base.record(cfg, loaded, timer),
        {h: {c.name: c.kind for c in cs} for h, cs in plans.items()},
    )


def measure_condition(cell: dict) -> dict:
    """The hybrid the cell builds (`hybrid_of` its "build") under the cell's condition
    (`Condition.of_cell`), on its items: lm-eval's accuracy (a measurement, `runner`)."""
    h = hybrid_of(cell["build"])
    return evaluate(
        h, Condition.of_cell(cell), bm.from_spec(cell["items"], h.host.tokenizer).items
    ).to_json()


def measure_as_is(cell: dict) -> dict:
    """A model as it is on the cell's items (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    return score(
        loaded.model, loaded.tokenizer, bm.from_spec(cell["items"], loaded.tokenizer).items
    ).to_json()


# --- verdicts ---------------------------------------------------------------------------------------


def retrieval_part(clean: Score, ablated: Score, chance: float) -> tuple[str, str]:
    """Collapses most of the way to chance: reproduced; falls, but not that far: partly; no
    loss: not reproduced (`verdicts.collapses` and `verdicts.falls`, paired)."""
    outcome, evidence = v.collapses(clean, ablated, chance)
    if outcome in (v.REPRODUCED, v.NOT_TESTABLE):
        return outcome, evidence
    fell, _ = v.falls(clean, ablated, chance)
    change = f"; change {difference(clean, ablated)}"
    if outcome == v.NOT_REPRODUCED and fell == v.REPRODUCED:
        return v.PARTLY, evidence + change + " (it falls, but not most of the way to chance)"
    return outcome, evidence + change


def verdicts(result: Result) -> list[v.Verdict]:
    out = []
    for h in result.scores:
        by = result.scores[h]
        for ablation in ABLATIONS:
            parts = {
                b: retrieval_part(by[AS_IS][b], by[ablation][b], result.chance[b])
                for b in result.retrieval
            }
            out.append(
                v.Verdict(
                    f"{h}, {ablation}: retrieval collapses towards chance",
                    "§5; released notebook cell 35",
                    v.combine(o for o, _ in parts.values()),
                    "; ".join(f"{b}: {e}" for b, (_, e) in parts.items()),
                )
            )
            outcome, evidence = v.kept(
                result.knowledge(h, AS_IS), result.knowledge(h, ablation), result.knowledge_chance
            )
            out.append(
                v.Verdict(
                    f"{h}, {ablation}: knowledge is kept",
                    "§5",
                    outcome,
                    f"{base.knowledge_name(result)}: {evidence}",
                )
            )
        if result.controls(h):
            out.append(control_verdict(result, h))
    return out


def control_verdict(result: Result, h: str) -> v.Verdict:
    """Zeroing the attention heads takes retrieval lower than zeroing as many random Mamba heads
    (paired, per draw and retrieval task) - only where zeroing the attention lowers it at all."""
    by, controls = result.scores[h], result.controls(h)
    claim = f"{h}: the loss is specific to attention (random Mamba heads zeroed lose less)"
    parts, evidence = [], []
    for b in result.retrieval:
        fell, why = v.falls(by[AS_IS][b], by[ZEROED][b], result.chance[b])
        if fell == v.NOT_TESTABLE:
            evidence.append(f"{b}: {why}")
            parts.append(v.NOT_TESTABLE)
            continue
        if fell != v.REPRODUCED:
            evidence.append(
                f"{b}: zeroing the attention heads takes nothing measurable away "
                f"({by[ZEROED][b]} against {by[AS_IS][b]}), so there is no loss to attribute"
            )
            parts.append(v.NOT_TESTABLE)
            continue
        draws = [v.below(by[c][b], by[ZEROED][b]) for c in controls]
        # lower than every draw: one as harmful is not specific
        parts.append(v.every(o for o, _ in draws))
        worst = min(controls, key=lambda c: by[c][b].acc)
        evidence.append(
            f"{b}: attention zeroed {by[ZEROED][b]}; {len(controls)} Mamba draws from "
            f"{min(by[c][b].acc for c in controls):.1%} to {max(by[c][b].acc for c in controls):.1%}; "
            f"against the lowest draw: {difference(by[worst][b], by[ZEROED][b])}"
        )
    return v.Verdict(claim, "control (this book)", v.combine(parts), "; ".join(evidence))


# --- tables and figures ----------------------------------------------------------------------------


def summary(result: Result) -> pd.DataFrame:
    """One row per hybrid, condition and benchmark group: the retrieval tasks, and knowledge as
    the released code scores it (the unweighted mean of the tasks); the control draws pooled."""
    rows = []
    for h, by in result.scores.items():
        controls = result.controls(h)
        shown = {c: [c] for c in (AS_IS, *ABLATIONS)}
        if controls:
            shown[f"{CONTROL} ({len(controls)} draws, pooled)"] = controls
        for c, draws in shown.items():
            pooled = {b: Score.pooled(by[d][b] for d in draws) for b in by[AS_IS]}
            for b in result.retrieval:
                s = pooled[b]
                rows.append(
                    dict(hybrid=h, condition=c, benchmark=b, acc=s.acc, lo=s.lo, hi=s.hi, n=s.n)
                )
            tasks = [pooled[t] for t in result.knowledge_tasks]
            acc, lo, hi = mean_of([s.acc for s in tasks], [s.n for s in tasks])
            rows.append(
                dict(
                    hybrid=h,
                    condition=c,
                    benchmark=knowledge_label(result),
                    acc=acc,
                    lo=lo,
                    hi=hi,
                    n=sum(s.n for s in tasks),
                )
            )
    return pd.DataFrame(rows)


def knowledge_label(result: Result) -> str:
    """Knowledge as the figure shows it: the released code's unweighted mean of the tasks."""
    tasks = result.knowledge_tasks
    return tasks[0] if len(tasks) == 1 else f"knowledge (mean of {len(tasks)})"


def figure(result: Result):
    """Per hybrid: each task's accuracy as is, under the two ablations and the Mamba controls,
    with 95% intervals and chance."""
    import matplotlib.pyplot as plt

    from .. import plots

    table = summary(result)
    hybrids = list(result.scores)
    fig, axes = plt.subplots(
        len(hybrids), 1, figsize=(plots.WIDTH, 3.9 * len(hybrids)), squeeze=False
    )
    chance = {
        **{b: result.chance[b] for b in result.retrieval},
        knowledge_label(result): float(np.mean([result.chance[t] for t in result.knowledge_tasks])),
    }
    for ax, h in zip(axes[:, 0], hybrids):
        plots.grouped_bars(
            table[table.hybrid == h], "benchmark", "condition", title=h, chance=chance, ax=ax
        )
    fig.tight_layout()
    return fig


def single_heads(result: Result) -> pd.DataFrame:
    """Each attention head zeroed alone, against the hybrid as is (a note where none was run)."""
    rows = []
    for h, by in result.scores.items():
        heads = result.of_kind(h, SINGLE_HEAD)
        if not heads:
            rows.append({"hybrid": h, "attention heads zeroed": "none run (single_heads=False)"})
            continue
        for c in [AS_IS, *heads]:
            rows.append(
                {
                    "hybrid": h,
                    "attention heads zeroed": "none" if c == AS_IS else c.removesuffix(" zeroed"),
                    **by[c],
                }
            )
    return pd.DataFrame(rows)


def side_by_side(result: Result) -> pd.DataFrame:
    """Every model as is, on every benchmark: the hybrids and the pure SSM."""
    models = {h: by[AS_IS] for h, by in result.scores.items()}
    if result.ssm:
        models[f"{result.cfg.ssm} (pure SSM)"] = result.ssm
    return pd.DataFrame([{"model": m, **by} for m, by in models.items()])


def comparison(result: Result) -> pd.DataFrame:
    mcq = result.retrieval[0]
    ref = {
        q: paper("hybrid_models", q, registry.cast("paper", "zamba2"))
        for q in ("mmlu", "mmlu_attention_ablated", "knowledge_kept")
    }
    heads = [
        paper("hybrid_models", q, registry.cast("paper", "zamba2"))
        for q in ("heads_ablated", "heads_ablated_other_summary")
    ]
    rows = [
        (
            "hybrid",
            "Zamba2-7B (§5)",
            "Zyphra/Zamba2-7B, bf16, eager attention",
            ", ".join(result.scores),
        ),
        (
            "attention heads ablated",
            f"{heads[0].value} or {heads[1].value} (secondary summaries disagree)",
            "every shared block's last query row masked, all heads (cell 35)",
            "every attention head zeroed, or the last row masked as released",
        ),
    ]
    for i, (h, by) in enumerate(result.scores.items()):
        n = by[AS_IS][mcq].n
        reference = [
            ("not verified", str(ref["mmlu"])),
            ("not verified", str(ref["mmlu_attention_ablated"])),
            ("'ablating attention' (§5; not verified)", "not run"),
            (str(ref["knowledge_kept"]), "'remains stable' (cell 35)"),
        ]
        if i:  # the same reference numbers as for the first hybrid
            reference = [("as above", "as above")] * len(reference)
        quantities = [
            (f"{mcq} as is", f"{by[AS_IS][mcq].brief}, n={n}"),
            (f"{mcq}, final row masked", f"{by[MASKED][mcq].brief}, n={n}"),
            (f"{mcq}, all attention heads zeroed", f"{by[ZEROED][mcq].brief}, n={n}"),
            (
                f"{base.knowledge_name(result)}: as is → masked → zeroed",
                " → ".join(result.knowledge(h, c).brief for c in (AS_IS, *ABLATIONS))
                + f", n={result.knowledge(h, AS_IS).n}",
            ),
        ]
        rows += [(f"{h}: {q}", p, r, mine) for (q, mine), (p, r) in zip(quantities, reference)]
    return base.comparison_table(rows)


def subject(result: Result) -> str:
    beside = f" (beside {result.cfg.ssm}, a pure SSM)" if result.ssm else ""
    return f"on the {result.cfg.profile} profile, {' and '.join(result.scores)}{beside}"
