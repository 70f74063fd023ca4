"""Hybrid swap: one Transformer layer back into its distilled SSM (the paper's Fig. 7, §5.4).

Llamba was distilled from Llama layer by layer, so its layer i imitates Llama's layer i and reads
the residual stream that layer reads. Running the student with the teacher's layer i in place
of its own (`interventions.swap_layers`) asks how much of the student's gap to its teacher that
one layer closes. The paper's claim: the swap of the layer that holds the teacher's aggregation
(Llama-3.1-8B's L17, home of the Aggregate head L17H24) helps most; other layers' swaps help
little or hurt.

Which teacher layer aggregates is decided before any swap is scored, by one of three rules
(`distilled.find_teacher_layer`, which the hybrid-models chapter calls too): the released code's
Aggregate head (`reference`), the layer whose attention heads the teacher cannot do without on
the retrieval tasks (`layer ablation`), or the Aggregate head found by behaviour among the top
heads of the shared KV ranking (`KV ranking`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import registry
from .. import verdicts as v
from ..errors import ConfigError
from ..evaluate import score
from ..interventions import swap_layers
from ..protocol import base, checks, distilled, fields, loading, stores
from ..reference import paper
from ..stats import Score, TaskMean, difference
from ..sweep import sweep


@dataclass(frozen=True)
class Config(base.BenchmarkConfig):
    student: str = fields.model("ssm")
    teacher: str = fields.model("attention")
    layers: tuple | None = fields.layers()  # None: every layer
    teacher_layer_by: str = fields.one_of(*distilled.LAYER_RULES)

    chapter = "hybrid_swap"
    # Smoke: two layers besides the aggregating one (which is always swapped).
    smoke_sizes = dict(layers=(0, 1), n_mmlu=4, n_knowledge=2, n_kv=4)

    @classmethod
    def defaults(cls, profile):
        # the student, teacher and layer rule the hybrid-models chapter swaps too
        pair = distilled.pair(profile)
        sizes = (
            dict(n_mmlu=500, k_shot=0, n_knowledge=500, n_kv=500, kv_pairs=8, kv_query="repeat")
            if profile == "cpu"
            else dict(
                n_mmlu=None,
                k_shot=paper("released_settings", "num_fewshot").integer,
                n_knowledge=None,
                n_kv=500,
                kv_pairs=8,
                kv_query="paper",
            )
        )
        return dict(
            student=pair.student,
            teacher=pair.teacher,
            layers=None,
            teacher_layer_by=pair.teacher_layer_by,
            seed=0,
            **sizes,
        )

    def __post_init__(self):
        super().__post_init__()
        checks.check_layers_of(self.student, "layers", self.layers)
        checks.check_layers_of(self.teacher, "layers", self.layers)
        student, teacher = checks.shape(self.student), checks.shape(self.teacher)
        if student.width != teacher.width:
            raise ConfigError(
                f"student {self.student} (residual width {student.width}) and teacher {self.teacher} "
                f"(width {teacher.width}) cannot swap layers: their residual streams must match; pick "
                f"a teacher of the student's width"
            )
        checks.check_kv_sizes(self.student, "kv_pairs", [self.kv_pairs])
        if (
            self.teacher_layer_by == "reference"
            and self.teacher not in distilled.reference_teachers()
        ):
            raise ConfigError(
                f"teacher_layer_by='reference' needs a teacher whose Aggregate head the release names "
                f"({', '.join(distilled.reference_teachers())}), not {self.teacher}; for other teachers use "
                f"'layer ablation' or 'KV ranking'"
            )


# --- the run ----------------------------------------------------------------------------------------

STUDENT, TEACHER = "student", "teacher"


def swapped(layer: int) -> str:
    return f"L{layer} swapped in"


@dataclass(frozen=True)
class Result(base.ByRole):
    cfg: Config
    n_layers: int
    layers: list[int]  # the layers swapped one at a time
    teacher_layer: distilled.TeacherLayer
    # benchmark -> condition (student, teacher, "L3 swapped in") -> score
    scores: dict[str, dict[str, Score]]
    roles: dict[str, str]
    chance: dict[str, float]
    provenance: dict

    def knowledge(self, condition: str) -> TaskMean:
        """Knowledge under one condition as the release scores it: the unweighted mean over the
        knowledge tasks (paired across conditions task by task)."""
        return TaskMean.of(
            [self.scores[t][condition] for t in self.knowledge_tasks],
            [self.chance[t] for t in self.knowledge_tasks],
        )

    @property
    def knowledge_chance(self) -> float:
        return float(np.mean([self.chance[t] for t in self.knowledge_tasks]))


def try_swaps(student, teacher, layers) -> None:
    """Every swap the run may make, tried on two tokens before anything is computed: a layer
    whose shapes, dtype or device do not fit fails here, not after the teacher's layer search."""
    import torch

    device = next(student.model.parameters()).device
    with torch.inference_mode(), swap_layers(student, teacher, list(layers)):
        student.model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device))


def run(cfg: Config) -> Result:
    timer = base.Timer()
    checks.check_available([cfg.student, cfg.teacher])
    student, teacher = loading.load(cfg.student), loading.load(cfg.teacher)
    try_swaps(
        student,
        teacher,
        cfg.layers or range(min(student.adapter.n_layers, teacher.adapter.n_layers)),
    )
    retrieval = [
        bm.letter_mcq(
            cfg.student, student.tokenizer, cfg.profile, cfg.n_mmlu, cfg.seed, cfg.k_shot
        ),
        bm.kv(cfg.student, student.tokenizer, cfg.kv_pairs, cfg.n_kv, cfg.seed, cfg.kv_query),
    ]
    knowledge = bm.knowledge(cfg.student, cfg.profile, cfg.n_knowledge, cfg.seed)
    found = distilled.find_teacher_layer(
        teacher, retrieval, cfg.teacher_layer_by, cfg.profile, cfg.smoke
    )
    layers = sorted(set(cfg.layers or range(student.adapter.n_layers)) | {found.layer})
    # Retrieval under every swap; knowledge (the control) for the aggregating layer's swap.
    plan = [(b, c, None) for b in retrieval + knowledge for c in (STUDENT, TEACHER)]
    plan += [(b, swapped(l), l) for b in retrieval for l in layers]
    plan += [(b, swapped(found.layer), found.layer) for b in knowledge]
    store = stores.open_store(cfg.chapter, cfg.profile, "swaps", [student, teacher], measure_swap)
    cells = [
        dict(student=cfg.student, teacher=cfg.teacher, condition=c, layer=l, **distilled.cell_of(b))
        for b, c, l in plan
    ]
    scores: dict[str, dict[str, Score]] = {}
    for r in sweep(store, cells, measure_swap, desc="swaps x benchmarks"):
        scores.setdefault(r["benchmark"], {})[r["condition"]] = Score.from_json(r)
    benchmarks = retrieval + knowledge
    return Result(
        cfg,
        student.adapter.n_layers,
        layers,
        found,
        scores,
        {b.name: b.role for b in benchmarks},
        {b.name: b.chance for b in benchmarks},
        base.record(cfg, [student, teacher], timer),
    )


def measure_swap(cell: dict) -> dict:
    """One benchmark (the cell's items) scored by the teacher, the student, or (condition any
    other) the student with the teacher's `layer` in place of its own (a measurement, `runner`).
    The items are the student's: they do not depend on whose tokenizer finds their segments."""
    student, teacher = loading.models_for(cell["student"], cell["teacher"])
    items = bm.from_spec(cell["items"], student.tokenizer).items
    if cell["condition"] == TEACHER:
        return score(teacher.model, teacher.tokenizer, items).to_json()
    if cell["condition"] == STUDENT:
        return score(student.model, student.tokenizer, items).to_json()
    with swap_layers(student, teacher, [cell["layer"]]):
        return score(student.model, student.tokenizer, items).to_json()


# --- verdicts ---------------------------------------------------------------------------------------


def gap(result: Result, b: str) -> tuple[bool, str]:
    """Whether the student trails its teacher on `b` (paired): only then can a swap close a gap.
    A teacher at chance cannot show which of its layers retrieves."""
    s, t, chance = result.scores[b][STUDENT], result.scores[b][TEACHER], result.chance[b]
    if not t.above(chance):
        return False, f"the teacher cannot do it: {t}, chance {chance:.0%}"
    outcome, _ = v.lower(t, s)
    if outcome != v.REPRODUCED:
        return False, f"no gap to close: student {s} against teacher {t}: {difference(t, s)}"
    return True, ""


def best_swap_verdict(result: Result, b: str) -> v.Verdict:
    """Does the aggregating layer's swap lift `b` above the student, and above every other swap?"""
    L = result.teacher_layer.layer
    claim = f"{b}: swapping in the teacher's aggregating layer (L{L}) helps most"
    testable, why = gap(result, b)
    if not testable:
        return v.Verdict(claim, "Fig. 7", v.NOT_TESTABLE, why)
    scores, student = result.scores[b], result.scores[b][STUDENT]
    mine = scores[swapped(L)]
    over_student, _ = v.lower(mine, student)
    evidence = f"L{L} swapped in: {mine}; student {student}: {difference(student, mine)}"
    others = {l: difference(scores[swapped(l)], mine) for l in result.layers if l != L}
    if not others:
        return v.Verdict(claim, "Fig. 7", over_student, evidence + "; no other layer was swapped")
    above_all = (
        v.REPRODUCED
        if all(d.lo > 0 for d in others.values())
        else v.NOT_REPRODUCED
        if any(d.hi < 0 for d in others.values())
        else v.INCONCLUSIVE
    )
    rival = max(others, key=lambda l: scores[swapped(l)].acc)
    ties = [l for l, d in others.items() if d.lo <= 0 <= d.hi]
    evidence += (
        f"; the best other swap, L{rival}: {scores[swapped(rival)]}, L{L} ahead by {others[rival]}"
        + (f"; not told apart from L{L}: {', '.join(f'L{l}' for l in ties)}" if ties else "")
    )
    # above the student AND every other swap
    return v.Verdict(claim, "Fig. 7", v.every([over_student, above_all]), evidence)


def verdicts(result: Result) -> list[v.Verdict]:
    out = [best_swap_verdict(result, b) for b in result.retrieval]
    L = result.teacher_layer.layer
    outcome, evidence = v.kept(
        result.knowledge(STUDENT), result.knowledge(swapped(L)), result.knowledge_chance
    )
    # a control of nothing: no swap effect could be tested
    if all(x.outcome == v.NOT_TESTABLE for x in out):
        outcome, evidence = (
            v.NOT_TESTABLE,
            f"no retrieval claim could be tested, so there is nothing to control; {evidence}",
        )
    out.append(
        v.Verdict(
            f"Knowledge (the control) is kept when L{L} is swapped in",
            "control (this book)",
            outcome,
            f"{base.knowledge_name(result)}: {evidence}",
        )
    )
    return out


# --- tables and figures --------------------------------------------------------------------------


def swap_table(result: Result) -> pd.DataFrame:
    """Every condition's accuracy on each retrieval task and on knowledge, the mean of its tasks
    (scored for the student, the teacher and the aggregating layer's swap)."""
    rows = []
    for c in [STUDENT, TEACHER, *map(swapped, result.layers)]:
        row = {"": c, **{b: result.scores[b][c] for b in result.retrieval}}
        scored = all(c in result.scores[t] for t in result.knowledge_tasks)
        rows.append({**row, base.knowledge_name(result): result.knowledge(c) if scored else "-"})
    return pd.DataFrame(rows)


def teacher_layer_table(result: Result) -> pd.DataFrame:
    """How the aggregating teacher layer was found; with `layer ablation`, the teacher's accuracy
    with each layer's attention heads zeroed."""
    found = result.teacher_layer
    if not found.ablated:
        return pd.DataFrame([{"teacher layer": f"L{found.layer}", "found by": found.how}])
    rows = [{"attention heads zeroed": "none", **found.clean}]
    rows += [
        {
            "attention heads zeroed": f"all of L{l}" + (" (chosen)" if l == found.layer else ""),
            **{b: by[l] for b, by in found.ablated.items()},
        }
        for l in sorted(next(iter(found.ablated.values())))
    ]
    return pd.DataFrame(rows)


def comparison(result: Result) -> pd.DataFrame:
    cfg, L = result.cfg, result.teacher_layer.layer
    mcq, kv = result.retrieval
    s = result.scores
    others = [l for l in result.layers if l != L]
    best_other = max(others, key=lambda l: s[mcq][swapped(l)].acc) if others else None
    agg = paper("head_zeroing", "aggregate_head", registry.cast("paper", "llama"))
    return base.comparison_table(
        [
            (
                "models",
                "Llamba-8B with layers of Llama-3.1-8B (Fig. 7)",
                "Llamba-8B-untied-unaligned, Llama-3.1-8B-Instruct",
                f"{cfg.student} with layers of {cfg.teacher} ({cfg.profile} profile)",
            ),
            (
                "teacher layer that aggregates",
                f"L{agg.heads[0].layer}, the swap that helps (cell 37)",
                f"Aggregate head {agg.value} (cell 15)",
                f"L{L}: {result.teacher_layer.how}",
            ),
            (
                f"{mcq}, student",
                str(
                    paper(
                        "hybrid_swap",
                        "mmlu_before_swap",
                        registry.cast("paper", "llamba-unaligned"),
                    )
                ),
                "0-shot, lm-eval 0.4.7",
                f"{s[mcq][STUDENT]}",
            ),
            (
                f"{mcq}, aggregating layer swapped in",
                str(
                    paper(
                        "hybrid_swap",
                        "mmlu_after_l17_swap",
                        registry.cast("paper", "llamba-unaligned"),
                    )
                ),
                "each layer swapped in turn (cell 38)",
                f"L{L}: {s[mcq][swapped(L)]}",
            ),
            (
                f"{mcq}, best other swap",
                "little or even negative impact (cell 37)",
                "-",
                f"L{best_other}: {s[mcq][swapped(best_other)]}"
                if others
                else "no other layer swapped",
            ),
            (f"{mcq}, teacher", "-", "-", f"{s[mcq][TEACHER]}"),
            (
                f"{kv}: student, L{L} swapped in, teacher",
                "not run",
                "not run",
                f"{s[kv][STUDENT].brief}, {s[kv][swapped(L)].brief}, {s[kv][TEACHER].brief}; n={s[kv][STUDENT].n}",
            ),
            (
                f"{base.knowledge_name(result)}: student, L{L} swapped in",
                "not reported",
                "not run",
                f"{result.knowledge(STUDENT).brief}, {result.knowledge(swapped(L)).brief}; "
                f"n={result.knowledge(STUDENT).n}",
            ),
        ]
    )


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, {result.cfg.student} with layers of {result.cfg.teacher}"


def figure(result: Result):
    """Fig. 7's bars for this run: each retrieval task's accuracy with one teacher layer swapped
    in, the aggregating layer in red, the student, the teacher and chance as labelled lines."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    L = result.teacher_layer.layer
    fig, axes = plt.subplots(
        len(result.retrieval),
        1,
        figsize=(plots.WIDTH, 2.6 * len(result.retrieval) + 0.8),
        squeeze=False,
        sharex=True,
    )
    for ax, b in zip(axes[:, 0], result.retrieval):
        scores = [result.scores[b][swapped(l)] for l in result.layers]
        acc = np.array([s.acc for s in scores])
        err = [100 * (acc - [s.lo for s in scores]), 100 * (np.array([s.hi for s in scores]) - acc)]
        colours = ["tab:red" if l == L else "tab:blue" for l in result.layers]
        ax.bar(result.layers, 100 * acc, color=colours, yerr=err, capsize=2)
        for who, ls in [(STUDENT, "--"), (TEACHER, "-.")]:
            ax.axhline(100 * result.scores[b][who].acc, ls=ls, lw=1.2, color="0.25", label=who)
        ax.axhline(100 * result.chance[b], ls=":", lw=1.2, color="0.5", label="chance")
        ax.set(title=b, ylabel="accuracy (%)", ylim=(0, 105))
    axes[-1, 0].set(
        xlabel="teacher layer swapped in",
        xticks=result.layers if len(result.layers) <= 16 else result.layers[::2],
    )
    bars = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:red", "tab:blue")]
    lines, labels = axes[0, 0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(
        bars + lines,
        [f"L{L} swapped in (aggregating)", "another layer swapped in", *labels],
        loc="lower center",
        ncols=3,
        frameon=False,
    )
    return fig
