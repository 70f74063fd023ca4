"""The G&A atlas: every real model of a profile through the same protocol, side by side.

For each model and task (KV retrieval, and MMLU-format letter selection), the head-zeroing
protocol of `head_screen`: the minimal model by the paper's rule (the layer-pruning walk of this
task), each layer's whole attention zeroed on the screen's prompts (where the harm is), the layers
whose zeroing surely hurts swept head by head, the screen's ranking and the roles among the heads
that hurt. A model whose whole depth does not clear chance on the task cannot test a claim about
it: its row stops there and says so. On the check's prompts (disjoint from the screen's, as many
as the claims need), the screen's most harmful head, its five most harmful heads and the critical
layer's whole attention (`critical_layer`) are zeroed, and knowledge is scored under the same zeroing.

Every measurement goes through the head-zeroing chapter's results stores where it is the same
computation (the walk, the layer scan, the screen), so the atlas recomputes nothing that chapter,
the layer-pruning chapter or another atlas row has stored; only its check is its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from .. import benchmarks as bm
from .. import heads as hd
from .. import registry
from .. import verdicts as v
from ..heads import Head
from ..protocol import base, fields, head_screen, loading, minimal, shared, stores
from ..protocol.head_screen import NONE, LayerScan, ScreenConfig, measure_conditions
from ..protocol.roles import ROLE_NAMES, Roles
from ..reference import paper
from ..specs import Spec
from ..stats import Score, TaskMean, paired
from ..sweep import sweep

TASKS = ("kv", "mmlu")
TASK_NAMES = {"kv": "KV retrieval", "mmlu": "MMLU letters"}
TOP, TOP_FIVE = "the most harmful head zeroed", "the five most harmful heads zeroed"
LAYER = "the critical layer's attention zeroed"
# The toy zoo's attention model beside the real ones on the CPU profile (marked as a toy): the
# model the other chapters' CPU runs stand in for Llama with.
TOYS = {"cpu": (registry.cast("cpu", "llama"),)}
KV_CHECK_MOST = (
    1000  # KV prompts are drawn on demand: the check's n is what its claims need, up to this
)


@dataclass(frozen=True)
class Config(base.Config):
    # the real models compared (None: the profile's)
    models: tuple[str, ...] = fields.models("attention")
    kv_floor: int = fields.count()  # KV check prompts, at least (more where the claims need more)
    seed: int = fields.seed()

    chapter = "atlas"
    smoke_sizes = dict(kv_floor=4)

    @classmethod
    def defaults(cls, profile):
        return dict(
            models=[*registry.ATLAS[profile], *TOYS.get(profile, ())],
            kv_floor=150 if profile == "cpu" else 500,
            seed=0,
        )

    @classmethod
    def for_profile(cls, profile="cpu", smoke=False, **overrides):
        # At smoke size, the profile's smallest model: a measured row and a row that stops (the
        # CPU one is at chance on the letters) in the CI's 2 minutes (with the 1.5B Qwen beside
        # it, 126 s alone on 2 cores). Measured letters rows run in the rehearsal and the tests.
        if smoke and overrides.get("models") is None and profile in registry.ATLAS:
            overrides["models"] = registry.ATLAS[profile][:1]
        return super().for_profile(profile, smoke, **overrides)

    def __post_init__(self):
        super().__post_init__()
        # every row's settings checked against its model (from its config) before any row runs
        for model in self.models:
            for task in TASKS:
                screen_config(self, model, task)


@dataclass(frozen=True)
class Row:
    """One model on one task: where the protocol got to, and what it measured."""

    model: str
    task: str  # "kv" or "mmlu"
    n_layers: int
    chance: float
    whole: (
        Score | None
    )  # the whole model on the walk's items (None: a published minimal model, no walk)
    kept: int | None = None  # the minimal model's layers (None: not testable, `reason` says why)
    reason: str = ""
    scan: LayerScan | None = None
    ranking: pd.DataFrame | None = None
    roles: Roles | None = None
    power: v.Power | None = None
    conditions: dict[str, Score] = dataclasses.field(default_factory=dict)  # on the check's prompts
    knowledge: dict[str, TaskMean] = dataclasses.field(default_factory=dict)  # same conditions
    knowledge_chance: float = 0.25
    top: Head | None = None
    top_five: tuple[Head, ...] = ()
    layer: int | None = None  # the critical layer, found on the screen (`critical_layer`)

    @property
    def measured(self) -> bool:
        return self.kept is not None

    @property
    def name(self) -> str:
        """The model's name, a toy's marked as one."""
        return f"{self.model} (toy)" if registry.MODELS[self.model].toy else self.model

    @property
    def label(self) -> str:
        return f"{self.name} · {TASK_NAMES[self.task]}"

    @property
    def clean(self) -> Score:
        return self.conditions[NONE]


@dataclass(frozen=True)
class Result:
    cfg: Config
    rows: list[Row]
    provenance: dict


def critical_layer(scan: LayerScan) -> int:
    """The layer whose attention, zeroed on the screen's prompts, surely lowers the task and costs
    it the most beyond knowledge (`LayerScan.that_matter`, the order head zeroing sweeps in): the
    paper's critical layers lose the task while knowledge stays. Where no layer surely matters,
    the one whose zeroing costs the task most."""
    matter = scan.that_matter()
    return matter[0] if matter else max(scan.layers, key=lambda l: (-scan.loss(l).delta, -l))


def run(cfg: Config) -> Result:
    timer = base.Timer()
    rows, loaded_all = [], []
    for name in cfg.models:
        loaded = loading.load(name)
        loaded_all.append(loaded)
        rows += [measure_row(cfg, loaded, task) for task in TASKS]
    return Result(cfg, rows, base.record(cfg, loaded_all, timer))


def screen_config(cfg: Config, model: str, task: str, **settings) -> ScreenConfig:
    """Head zeroing's settings for this model and task (its stores are shared), KV's prompt
    counts from the book's shared KV ranking."""
    kv = {}
    if task == "kv":
        s = shared.ranking_settings(cfg.profile, cfg.smoke)
        kv = dict(n_screen=s["n"], n_check=cfg.kv_floor, kv_pairs=s["pairs"], kv_query=s["query"])
    return ScreenConfig.for_profile(
        cfg.profile, cfg.smoke, model=model, task=task, seed=cfg.seed, **{**kv, **settings}
    )


def measure_row(cfg: Config, loaded, task: str) -> Row:
    screen_cfg = screen_config(cfg, loaded.name, task)
    n_layers = loaded.adapter.n_layers
    published = minimal.published_minimal(loaded.name)
    whole, chance, power = None, None, None
    if not published:
        depths, chance = minimal.task_depths(
            loaded,
            cfg.profile,
            cfg.smoke,
            cfg.seed,
            task,
            screen_cfg.kv_pairs,
            screen_cfg.kv_query,
        )
        whole = depths[n_layers]
        if not v.testable(whole, chance):
            why = f"the whole model ({n_layers} layers) does not clear chance {chance:.0%}: {whole}"
            return Row(loaded.name, task, n_layers, chance, whole, reason=why)
        kept = minimal.minimal_depth(depths, chance)
    else:
        kept = published
    if task == "kv" and whole is not None:
        # KV prompts are drawn on demand: the check is as large as its claims need (letters: the
        # screen plans it from what the set holds, `head_screen.prompts`)
        most = cfg.kv_floor if cfg.smoke else KV_CHECK_MOST
        power = v.plan(depths[kept].acc, chance, cfg.kv_floor, most)
        screen_cfg = dataclasses.replace(screen_cfg, n_check=power.n, layers_kept=kept)
    found = head_screen.screen(screen_cfg, loaded)
    order = list(hd.measured(found.ranking))
    if not order:
        why = "no head was measured exactly on the screen"
        return Row(loaded.name, task, n_layers, found.check.chance, whole, found.layers_kept, why)
    top, top_five = order[0], tuple(order[:5])
    layer = critical_layer(found.scan)
    within = Spec(keep_layers=range(found.layers_kept))
    specs = {
        NONE: within,
        TOP: within.zeroing(top),
        TOP_FIVE: within.zeroing(*top_five),
        LAYER: within.zeroing(*(Head(layer, h) for h in range(loaded.adapter.n_heads(layer)))),
    }
    knowledge = bm.knowledge_of(found.check, cfg.profile, len(found.check), cfg.seed)
    store = stores.open_store(cfg.chapter, cfg.profile, "check", [loaded], measure_conditions)
    cells = [
        dict(
            model=loaded.name,
            benchmark=b.name,
            items=b.spec,
            specs={k: str(spec) for k, spec in specs.items()},
        )
        for b in [found.check, *knowledge]
    ]
    rows = sweep(store, cells, measure_conditions, desc=f"{loaded.name}: the check")
    scores = [{c: Score.from_json(r[c]) for c in specs} for r in rows]
    knowledge_means = {
        c: TaskMean.of([s[c] for s in scores[1:]], [k.chance for k in knowledge]) for c in specs
    }
    return Row(
        loaded.name,
        task,
        n_layers,
        found.check.chance,
        whole,
        kept=found.layers_kept,
        scan=found.scan,
        ranking=found.ranking,
        roles=found.roles,
        power=found.power or power,
        conditions=scores[0],
        knowledge=knowledge_means,
        knowledge_chance=knowledge[0].chance,
        top=top,
        top_five=top_five,
        layer=layer,
    )


# --- verdicts ----------------------------------------------------------------------------------


def one_head(row: Row) -> tuple[str, str]:
    """Does zeroing the screen's most harmful head (picked on the screen's prompts) take the task
    most of the way to chance on the check's (`verdicts.collapses`, paired)?"""
    if not row.measured or row.top is None:
        return v.NOT_TESTABLE, row.reason
    outcome, evidence = v.collapses(row.clean, row.conditions[TOP], row.chance)
    return outcome, f"{row.top}: {evidence}"


def knowledge_kept(row: Row) -> tuple[str, str]:
    """Is knowledge kept within 5 points while that head lowers the task (judged only where it
    does: `verdicts.gated`)?"""
    if not row.measured or row.top is None or not row.knowledge:
        return v.NOT_TESTABLE, row.reason or "no knowledge scored"
    return v.gated(
        v.falls(row.clean, row.conditions[TOP], row.chance),
        f"zeroing {row.top} does not lower {TASK_NAMES[row.task]}",
        lambda: v.kept(row.knowledge[NONE], row.knowledge[TOP], row.knowledge_chance),
    )


def verdicts(result: Result) -> list[v.Verdict]:
    out = []
    for row in result.rows:
        out.append(
            v.Verdict(
                f"one head takes {TASK_NAMES[row.task]} most of the way to chance ({row.name})",
                "§3.4",
                *one_head(row),
                headline=True,
            )
        )
        out.append(
            v.Verdict(
                f"knowledge kept with that head zeroed ({row.name}, {TASK_NAMES[row.task]})",
                "§3.4, abstract",
                *knowledge_kept(row),
            )
        )
    return out


def model_names(result: Result) -> str:
    """The models of the rows, in order, each once."""
    return ", ".join(dict.fromkeys(r.name for r in result.rows))


def subject(result: Result) -> str:
    return f"{model_names(result)} on the {result.cfg.profile} profile"


# --- tables and figures ------------------------------------------------------------------------


def share(row: Row, condition: str) -> str:
    """The condition's loss as a share of the loss of the critical layer's whole attention zeroed
    (point estimates of the paired losses on the check's prompts)."""
    layer_loss = -paired(row.clean, row.conditions[LAYER]).delta
    if layer_loss <= v.MARGIN:
        return f"- (the layer's loss is {100 * layer_loss:.1f} points)"
    # rounded first, so that a loss of a hair below zero shows as 0%, not -0%
    return f"{round(-paired(row.clean, row.conditions[condition]).delta / layer_loss, 2) + 0.0:.0%}"


def roles_text(row: Row) -> str:
    return "; ".join(
        f"{r}: {row.roles.label(r)}" + ("" if row.roles.filled[r] else " (closest)")
        for r in ROLE_NAMES
    )


def power_note(result: Result) -> str:
    """Each measured row's n on the check and why (`verdicts.plan`), or that it was set."""
    lines = []
    for row in result.rows:
        if not row.measured or row.top is None:
            continue
        n = row.clean.n
        if row.power is None:
            lines.append(f"{row.label}: n = {n}, as set.")
            continue
        p = row.power
        needs = "; ".join(f"{k}: {x if x is not None else 'no n'}" for k, x in p.needs.items())
        seen = (
            f"a loss of {100 * p.detectable:.1f} points or more is told as a collapse"
            if p.detectable is not None
            else "no loss down to chance is told as a collapse"
        )
        lines.append(
            f"{row.label}: n = {n}, the largest need at the minimal model's {p.clean:.1%} ({needs}), "
            f"at least {p.floor}, at most {p.available}; {seen} with 80% power."
        )
    return "Check prompts per row. " + " ".join(lines) if lines else ""


def protocol_table(result: Result) -> pd.DataFrame:
    """One row per model and task: the whole model, the minimal model, the critical layer and the
    roles found, or why the row stops."""
    records = []
    for row in result.rows:
        measured = row.measured and row.top is not None
        records.append(
            {
                "model": row.name,
                "task": TASK_NAMES[row.task],
                "whole model": "- (published minimal model)"
                if row.whole is None
                else row.whole.brief,
                "chance": f"{row.chance:.0%}",
                "minimal model": (
                    f"{row.kept} of {row.n_layers} layers ({row.kept / row.n_layers:.0%})"
                    if row.measured
                    else "not testable: the whole model is at chance"
                ),
                "critical layer": f"L{row.layer}" if measured else "-",
                "roles": roles_text(row) if measured else "-",
            }
        )
    return pd.DataFrame(records)


def zeroing_table(result: Result) -> pd.DataFrame:
    """One row per measured model and task, on the check's prompts: clean accuracy, each zeroing's
    paired loss, the shares of the critical layer's loss, and knowledge under the top head."""
    records = []
    for row in result.rows:
        if not row.measured or row.top is None:
            continue
        loss = lambda c: str(paired(row.clean, row.conditions[c]))
        records.append(
            {
                "model": row.name,
                "task": TASK_NAMES[row.task],
                "clean": f"{row.clean.brief}, n={row.clean.n}",
                "top head zeroed": f"{row.top}: {loss(TOP)}",
                "top five zeroed": loss(TOP_FIVE),
                "critical layer zeroed": f"L{row.layer}: {loss(LAYER)}",
                "top head's share": share(row, TOP),
                "top five's share": share(row, TOP_FIVE),
                "knowledge, top head zeroed": str(paired(row.knowledge[NONE], row.knowledge[TOP])),
            }
        )
    return pd.DataFrame(records)


def comparison(result: Result) -> pd.DataFrame:
    llama = registry.cast("paper", "llama")
    measured = [r for r in result.rows if r.measured and r.top is not None]
    fmt = lambda r: f"{r.label}: {r.conditions[TOP]} from {r.clean}"
    rows = [
        (
            "models",
            "Llama-3.1-8B-Instruct and the SSMs and hybrids of §4",
            "one model per notebook",
            f"{model_names(result)} ({result.cfg.profile} profile; {base.weights(result.provenance)})",
        ),
        (
            "Gather and Aggregate heads (Llama-3.1-8B)",
            f"{paper('head_zeroing', 'gather_head', llama)}, {paper('head_zeroing', 'aggregate_head', llama)}",
            "GATHER_HEADS, AGGREGATE_HEADS",
            "; ".join(f"{r.label}: {roles_text(r)}" for r in measured) or "-",
        ),
        (
            "MMLU with one head zeroed (Llama-3.1-8B minimal model)",
            str(paper("head_zeroing", "mmlu_one_head_zeroed")),
            "-",
            "; ".join(fmt(r) for r in measured) or "-",
        ),
        (
            "rows not testable",
            "-",
            "-",
            "; ".join(f"{r.label}: {r.reason}" for r in result.rows if not r.measured) or "none",
        ),
    ]
    return base.comparison_table(rows)


def figure(result: Result):
    """Accuracy on each measured row's check under each zeroing, with 95% intervals; each row's
    chance as a dotted mark."""
    import matplotlib.pyplot as plt
    import numpy as np

    from .. import plots

    plots.style()
    rows = [r for r in result.rows if r.measured and r.top is not None]
    conditions = [NONE, TOP, TOP_FIVE, LAYER]
    colours = ["0.6", "tab:orange", "tab:red", "tab:purple"]
    fig, ax = plt.subplots(figsize=(plots.WIDTH, 1.8 + 1.0 * max(1, len(rows))))
    height = 0.8 / len(conditions)
    for i, row in enumerate(rows):
        for j, (c, colour) in enumerate(zip(conditions, colours)):
            s = row.conditions[c]
            ax.barh(
                i + (j - 1.5) * height,
                100 * s.acc,
                height,
                xerr=[[100 * (s.acc - s.lo)], [100 * (s.hi - s.acc)]],
                color=colour,
                capsize=2,
                label=c if i == 0 else None,
            )
        ax.plot([100 * row.chance] * 2, [i - 0.45, i + 0.45], ":", color="0.2", lw=1.5)
    ax.set_yticks(np.arange(len(rows)), [f"{r.name}\n{TASK_NAMES[r.task]}" for r in rows])
    ax.invert_yaxis()
    ax.set(xlabel="accuracy on the check's prompts (%); dotted: chance", xlim=(0, 102))
    plots.legend_below(ax, ncols=2)
    return fig
