"""Zeroing single heads of the minimal model (the paper's §3.4 and Table 1).

A head is zeroed where its output enters its layer's output projection (a hook; no weight is
edited). The chapter first finds the heads that matter on one set of prompts (the screen: the
attribution estimate for every head, then the layers it points to swept exactly, or the layers
of the paper's heads), names the Gather and the Aggregate head (the paper's where it names them
for the model, else by behaviour among the ranking's candidates: `roles.find_roles`), and then
measures them on other prompts, disjoint from the screen's, beside random heads of the same
layers and Table 1's "keep only" configurations.

The task is MMLU-format letter selection: on the CPU profile Qwen2.5-Coder-1.5B-Instruct (a real
pretrained model that picks letters) on the book's letter set, on the paper profiles the paper's
model on MMLU; the questions are split by a seeded shuffle into the screen's part and the
check's. Knowledge (cloze questions: the letter set's facts on the CPU profile, the released
code's six tasks on the paper profiles) is scored under every condition too, as the paper's
headline says it hardly moves. KV retrieval (`task="kv"`) is screened by the book's shared KV
ranking. Where no minimal model is published for the model, it is the one the layer-pruning page
names: the shallowest cut that keeps the task on that chapter's items at this seed
(`minimal.task_depths`, `minimal.minimal_depth`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import heads as hd
from .. import registry
from .. import verdicts as v
from ..engine import SweepEngine
from ..heads import Head, ablation
from ..reference import paper
from ..stats import Score, TaskMean
from ..sweep import sweep
from ..protocol import base
# The screen (prompts split, minimal model, ranking, roles) is shared with masking: this chapter's
# Config is the screen's; the check (the heads zeroed on fresh prompts) and its verdicts are here.
from ..protocol.head_screen import MAX_SWEPT, screen, screen_candidates
from ..protocol.head_screen import ScreenConfig as Config
from ..protocol.roles import ROLE_NAMES, Roles, missing_role

SSM_TOY = registry.cast("cpu", "llamba")  # the SSM side at toy scale, on the letter MCQ (every profile's page shows it)
CONTROL_SIZE = 4  # heads per random control: more than any one role holds, so a null result means something


# --- the run -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    cfg: Config
    layers_kept: int
    n_layers: int
    screen_clean: Score  # no head zeroed, on the screen's prompts
    ranking: pd.DataFrame  # `heads.ranking_table` on the screen's prompts
    roles: Roles
    scores: dict[str, Score]  # condition -> score on the check's prompts
    controls: list[tuple[Head, ...]]
    chance: float
    provenance: dict
    knowledge: dict[str, dict[str, Score]] = field(default_factory=dict)  # task -> condition -> score
    knowledge_chance: dict[str, float] = field(default_factory=dict)  # task -> chance
    depths: dict[int, Score] = field(default_factory=dict)  # the task by layers kept on the layer-pruning chapter's items, where the minimal model was found there
    task_name: str = ""  # the check's benchmark (a toy's letter MCQ is not MMLU)

    def knowledge_under(self, condition: str) -> TaskMean:
        """Knowledge under one condition: the unweighted mean over the tasks, as the release scores it."""
        tasks = list(self.knowledge)
        return TaskMean.of([self.knowledge[t][condition] for t in tasks], [self.knowledge_chance[t] for t in tasks])

    @property
    def clean(self) -> Score:
        return self.scores[NONE]

    def control_scores(self) -> list[Score]:
        return [self.scores[control(i)] for i in range(len(self.controls))]


NONE, BOTH = "no head zeroed", "G and A zeroed"


def zeroed(role: str) -> str:
    return f"{role} zeroed"


def kept_only(*roles: str) -> str:
    return f"only {' and '.join(roles)} kept in {'its' if len(roles) == 1 else 'their'} layers"


def control(i: int) -> str:
    return f"random {CONTROL_SIZE} heads #{i + 1}"


def toy_config(cfg: Config) -> Config:
    """The page's SSM side: the toy Mamba-2 through the same protocol on its letter MCQ and
    knowledge task, at the CPU profile's sizes (seconds on any machine), with the page's seed."""
    return Config.for_profile("cpu", cfg.smoke, model=SSM_TOY, task="mmlu", seed=cfg.seed)


def conditions(roles: Roles, ranking: pd.DataFrame, n_heads: dict[int, int], n_controls: int,
               seed: int) -> tuple[dict[str, dict[int, list[int]]], list[tuple[Head, ...]]]:
    """What is zeroed on the check's prompts: each role's heads, both, Table 1's "keep only"
    configurations in the roles' layers, and random heads of the same layers (other than the
    roles' and the screen's top heads; of every layer in `n_heads` where those layers hold too
    few others for `n_controls` different sets)."""
    g, a = roles.heads["G"], roles.heads["A"]
    out = {NONE: {}, **{zeroed(r): ablation(roles.heads[r]) for r in ROLE_NAMES if roles.heads[r]}}
    if g and a:
        out[BOTH] = ablation(g + a)
    layers = sorted({h.layer for h in g + a}) or sorted({h.layer for h in hd.measured(ranking)[:2]})
    for kept in (("G", "A"), ("G",), ("A",)):
        if g and a:
            keep = {h for r in kept for h in roles.heads[r]}
            out[kept_only(*kept)] = {l: [h for h in range(n_heads[l]) if Head(l, h) not in keep] for l in layers}
    taken = set(g + a) | set(hd.measured(ranking)[:5])
    pool = [Head(l, h) for l in layers for h in range(n_heads[l]) if Head(l, h) not in taken]
    if math.comb(len(pool), CONTROL_SIZE) < n_controls:  # a toy's few heads a layer: draw from every layer kept
        pool = [Head(l, h) for l in sorted(n_heads) for h in range(n_heads[l]) if Head(l, h) not in taken]
    controls = distinct_draws(pool, CONTROL_SIZE, n_controls, seed)
    out |= {control(i): ablation(c) for i, c in enumerate(controls)}
    return out, controls


def distinct_draws(pool: list[Head], size: int, n: int, seed: int) -> list[tuple[Head, ...]]:
    """`n` different sets of `size` heads from `pool`, drawn with `seed` (a set drawn twice would
    count twice among the controls; fewer than `n` where the pool has fewer sets)."""
    rng = np.random.default_rng(seed)
    out: list[tuple[Head, ...]] = []
    possible = math.comb(len(pool), size) if len(pool) >= size else 0
    while len(out) < min(n, possible):
        draw = tuple(sorted(pool[i] for i in rng.choice(len(pool), size, replace=False)))
        if draw not in out:
            out.append(draw)
    return out


def run(cfg: Config) -> Result:
    timer = base.Timer()
    loaded = base.load(cfg.model)
    n_layers = loaded.adapter.n_layers
    found = screen(cfg, loaded)
    check, kept, layers, ranking, roles = found.check, found.layers_kept, found.layers, found.ranking, found.roles
    knowledge = bm.knowledge(cfg.model, cfg.profile, cfg.n_knowledge, cfg.seed)
    n_heads = {l: loaded.adapter.n_heads(l) for l in layers}
    ablations, controls = conditions(roles, ranking, n_heads, cfg.n_controls, cfg.seed)

    sets = {b.name: b for b in [check, *knowledge]}
    store = base.open_store(cfg.chapter, cfg.profile, "check", [loaded])
    cells = [dict(model=cfg.model, benchmark=name, items=b.spec, layers=kept,
                  ablations={k: {str(l): hs for l, hs in a.items()} for k, a in ablations.items()})
             for name, b in sets.items()]
    rows = {r["benchmark"]: r for r in sweep(store, cells, measure_conditions, desc="heads zeroed on fresh prompts")}
    scored = {name: {c: Score.from_json(rows[name][c]) for c in ablations} for name in sets}
    return Result(cfg, kept, n_layers, found.screen_clean, ranking, roles, scored[check.name], controls, check.chance,
                  base.record(cfg, [loaded], timer), {b.name: scored[b.name] for b in knowledge},
                  {b.name: b.chance for b in knowledge}, found.depths, check.name)


def measure_conditions(cell: dict) -> dict:
    """One benchmark (the cell's items) in the model's first `layers` layers under each of the
    cell's `ablations` ({condition: {layer: [heads]}}, layers as text), {condition: score} (a
    measurement, `runner`)."""
    loaded = base.model_for(cell["model"])
    engine = SweepEngine(loaded, loaded.tokenizer, bm.from_spec(cell["items"], loaded.tokenizer).items)
    ablations = {name: {int(l): hs for l, hs in a.items()} for name, a in cell["ablations"].items()}
    return {name: s.to_json() for name, s in engine.score_each(ablations, list(range(cell["layers"]))).items()}


# --- verdicts ----------------------------------------------------------------------------------

def _task(result: Result) -> str:
    if result.cfg.task == "kv":
        return "KV retrieval"
    return result.task_name if registry.spec(result.cfg.model).toy and result.task_name else "MMLU"  # a toy's letter MCQ


def bottleneck(result: Result, role: str) -> tuple[str, str]:
    """Does zeroing the role's heads take retrieval most of the way to chance, and lower than
    every random control (`verdicts.beats_controls`, paired on the check's prompts)? Where no
    measured candidate plays the role, the harmful heads do something else: another mechanism."""
    if not result.roles.heads[role]:
        return missing_role(result.roles, role, result.clean, result.chance)
    return v.beats_controls(result.clean, result.scores[zeroed(role)], result.control_scores(), result.chance)


def controls_do_little(result: Result) -> tuple[str, str]:
    """Every random draw keeps accuracy (`verdicts.kept` for each, `verdicts.every` over them)."""
    if not result.controls:
        return v.NOT_TESTABLE, "no random controls were drawn"
    parts = [v.kept(result.clean, c, result.chance) for c in result.control_scores()]
    lowest = min(range(len(parts)), key=lambda i: result.control_scores()[i].acc)
    drawn = sorted({h.layer for c in result.controls for h in c})
    return v.every(o for o, _ in parts), (f"{len(result.controls)} draws of {CONTROL_SIZE} heads of layer{'s' if len(drawn) > 1 else ''} "
                                          f"{', '.join(map(str, drawn))}; the lowest, "
                                          f"{', '.join(map(str, result.controls[lowest]))}: {parts[lowest][1]}")


def only_roles_kept(result: Result) -> tuple[str, str]:
    name = kept_only("G", "A")
    if name not in result.scores:
        missing = [r for r in ROLE_NAMES if not result.roles.heads[r]]
        parts = [missing_role(result.roles, r, result.clean, result.chance) for r in missing]
        return v.every(o for o, _ in parts), "; ".join(e for _, e in parts)
    return v.kept(result.clean, result.scores[name], result.chance)


def behave(result: Result) -> tuple[str, str]:
    """Do the paper's heads act as its roles here (`heads.assign_roles` on their measures and the
    screen's candidates)?"""
    found = result.roles.found
    if found is None:
        return v.NOT_TESTABLE, "their attention was not measured (single SSM channels)"
    parts, notes = [], []
    for r in ROLE_NAMES:
        parts.append(v.REPRODUCED if found[r] in result.roles.heads[r] else v.NOT_REPRODUCED)
        notes.append(f"{ROLE_NAMES[r]}: the paper's {result.roles.label(r)}, by behaviour "
                     f"{found[r] or 'none of the candidates'}")
    return v.every(parts), "; ".join(notes)  # both of the paper's heads must behave


def knowledge_kept(result: Result, role: str) -> tuple[str, str]:
    """Is knowledge kept with the role's heads zeroed (`verdicts.kept` on the unweighted mean over
    the knowledge tasks, each task paired across conditions)?"""
    if not result.roles.heads[role]:
        roles = result.roles
        unsure = roles.measures is not None and not roles.measures.empty and not roles.surely_missing(role)
        return (v.INCONCLUSIVE if unsure else v.NOT_TESTABLE), f"no {ROLE_NAMES[role]} head to zero: {roles.missing(role)}"
    if not result.knowledge:
        return v.NOT_TESTABLE, "no knowledge task was scored"
    clean = result.knowledge_under(NONE)
    return v.kept(clean, result.knowledge_under(zeroed(role)), clean.chance)


def verdicts(result: Result) -> list[v.Verdict]:
    task = _task(result)
    out = [v.Verdict(f"Zeroing the {ROLE_NAMES[r]} head ({result.roles.label(r)}) alone takes {task} most of the way "
                     "to chance", "§3.4, abstract", *bottleneck(result, r)) for r in ROLE_NAMES]
    out.append(v.Verdict(f"Zeroing {CONTROL_SIZE} random heads of the same layers does little", "§3.4",
                         *controls_do_little(result)))
    out.append(v.Verdict("Keeping only G and A in their layers keeps accuracy", "Table 1", *only_roles_kept(result)))
    out += [v.Verdict(f"Knowledge is kept with the {ROLE_NAMES[r]} head zeroed", "§3.4, abstract",
                      *knowledge_kept(result, r)) for r in ROLE_NAMES]
    if result.roles.source == "paper":
        out.append(v.Verdict("The paper's heads behave as Gather and Aggregate here", "§3.4", *behave(result)))
    return out


# --- tables and figures ------------------------------------------------------------------------

def _describe(result: Result, name: str, short: bool = False) -> str:
    """A condition as a table prints it, or as a figure's axis does (`short`)."""
    if name in (zeroed("G"), zeroed("A")):
        role = name[0]
        return f"{role} {result.roles.label(role)}" if short else f"{ROLE_NAMES[role]} {result.roles.label(role)} zeroed"
    if name in (drawn := control_names(result)):
        i = drawn.index(name)
        return f"random #{i + 1}" if short else f"{name}: {', '.join(map(str, result.controls[i]))}"
    return name.replace(" kept in its layers", " kept").replace(" kept in their layers", " kept") if short else name


def control_names(result: Result) -> list[str]:
    """The conditions that are random controls, in the order of `result.controls`."""
    return [control(i) for i in range(len(result.controls))]


def conditions_table(result: Result, short: bool = False, knowledge: bool = False) -> pd.DataFrame:
    """One row per condition of the check, indexed by the condition: what was zeroed, acc, lo,
    hi, n (of the task, or with `knowledge` of the knowledge tasks' unweighted mean)."""
    score = (lambda k: result.knowledge_under(k)) if knowledge else (lambda k: result.scores[k])
    return pd.DataFrame([dict(zeroed=_describe(result, k, short), acc=score(k).acc, lo=score(k).lo, hi=score(k).hi,
                              n=score(k).n) for k in result.scores], index=pd.Index(list(result.scores), name="condition"))


def roles_table(result: Result) -> pd.DataFrame:
    """What each measured candidate does (`segments.head_measures`, averaged over the screen's
    prompts) and the role it was given."""
    m = result.roles.measures
    if m is None or m.empty:
        return pd.DataFrame(columns=["head", "role"])
    found = result.roles.found or {}
    rows = [{"head": str(Head(*h)), "role by behaviour": next((ROLE_NAMES[r] for r in found if found[r] == Head(*h)), "-"),
             "segment ends: own-segment share": row[hd.GATHER_MEASURE],
             "final position: share on segment ends": row[hd.AGGREGATE_MEASURE],
             "final position: mass on the answer's value": row["answer value"],
             "segment ends: share on themselves and the previous token": row[hd.LOCAL_MEASURE]} for h, row in m.iterrows()]
    return pd.DataFrame(rows)


def comparison(result: Result) -> pd.DataFrame:
    s = result.scores
    fmt = lambda name: f"{s[name]}" if name in s else "-"
    llama = registry.cast("paper", "llama")
    g, a = paper("head_zeroing", "gather_head", llama), paper("head_zeroing", "aggregate_head", llama)
    controls = result.control_scores()
    return base.comparison_table([
        ("model", f"Llama-3.1-8B-Instruct, layers 0-{paper('layer_pruning', 'minimal_model_last_layer').value}",
         "same (cells 23-31)", f"{result.cfg.model}, layers 0-{result.layers_kept - 1} of {result.n_layers} "
                               f"({result.cfg.profile} profile; {minimal_source(result)})"),
        ("task", f"MMLU, {paper('released_settings', 'num_fewshot').value}-shot",
         f"lm-eval {paper('released_settings', 'lm_eval_version').value}",
         f"{_task(result)}, fresh prompts disjoint from the screen's"),
        ("Gather head", str(g), "GATHER_HEADS (cell 13)", result.roles.describe("G")),
        ("Aggregate head", str(a), "AGGREGATE_HEADS (cell 15)", result.roles.describe("A")),
        ("no head zeroed", str(paper("head_zeroing", "mmlu_minimal")), "-", fmt(NONE)),
        ("one head zeroed (G or A)", str(paper("head_zeroing", "mmlu_one_head_zeroed")), "-",
         f"G: {fmt(zeroed('G'))}; A: {fmt(zeroed('A'))} (chance {result.chance:.0%})"),
        (f"{CONTROL_SIZE} random heads zeroed", "little change (§3.4)", "-",
         f"{min(c.acc for c in controls):.1%} to {max(c.acc for c in controls):.1%} over {len(controls)} draws"
         if controls else "-"),
        ("knowledge, no head / G / A zeroed", "hardly moves (abstract)", "-", knowledge_row(result)),
        ("only G and A kept in their layers", "accuracy kept (Table 1)", "cells 23-24", fmt(kept_only("G", "A"))),
        ("only G kept / only A kept", "Table 1 (not read)", "cells 27 / 25 (labels swapped)",
         f"{fmt(kept_only('G'))} / {fmt(kept_only('A'))}"),
    ])


def minimal_source(result: Result) -> str:
    if result.depths:
        return f"the layer-pruning chapter's minimal model: the shallowest cut that keeps the task on its {_n_walked(result)} items"
    return "as set" if result.cfg.layers_kept else "the published minimal model"


def _n_walked(result: Result) -> int:
    return next(iter(result.depths.values())).n


def knowledge_row(result: Result) -> str:
    if not result.knowledge:
        return "-"
    cond = [NONE] + [zeroed(r) for r in ROLE_NAMES if zeroed(r) in result.scores]
    return " / ".join(result.knowledge_under(c).brief for c in cond) + f"; tasks: {', '.join(result.knowledge)}"


def draws(result: Result) -> str:
    """What `seed` drew on this page, and the ties the ranking's order broke among the heads
    whose roles were measured."""
    cfg = result.cfg
    if cfg.task == "kv":
        prompts_drawn = f"the screen's KV dictionaries (seed {cfg.seed}) and the check's (seed {cfg.seed + 1})"
    else:
        prompts_drawn = (f"the split of the letter questions into the screen's {result.screen_clean.n} and the "
                         f"check's {result.clean.n}")
    knowledge = f", the {sum(next(iter(s.values())).n for s in result.knowledge.values())} knowledge items" if result.knowledge else ""
    controls = (f"the {len(result.controls)} random control sets (all different)" if result.controls
                else "no random control set (too few heads outside the candidates)")
    text = f"Seed {cfg.seed} drew {prompts_drawn}{knowledge} and {controls}."
    chosen = screen_candidates(result.ranking)
    tied = hd.boundary_ties(result.ranking, chosen)
    if tied:
        last = chosen[-1]
        acc = _screen_row(result, last)[0]
        text += (f" A tie at the candidates' boundary: {len(tied)} more heads ({', '.join(map(str, tied[:6]))}"
                 f"{', ...' if len(tied) > 6 else ''}) leave the screen exactly where {last} does ({acc:.0%}); "
                 "the screen's estimate ordered them, so another seed may measure other candidates.")
    if result.roles.source == "behaviour" and (top := hd.measured(result.ranking)):
        readable, why = v.ranking_readable(result.screen_clean, _screen_row(result, top[0]), result.chance)
        named = any(result.roles.heads[r] for r in ROLE_NAMES)
        if not readable:
            text += f" No head stands out on the screen: {why}." + (
                " The roles are named among heads that tie, so another seed may name other heads; the claims "
                "below are measured on the check all the same." if named else "")
    return text


def _screen_row(result: Result, head: Head) -> tuple[float, float, float]:
    r = result.ranking
    row = r[(r.layer == head.layer) & (r["head"] == head.head)].iloc[0]
    return float(row.acc), float(row.lo), float(row.hi)


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, {result.cfg.model}, layers 0-{result.layers_kept - 1}, {_task(result)}"


def sweep_figure(result: Result):
    """Accuracy on the screen's prompts with each head of the swept layers zeroed alone (the
    layers x heads grid), the roles' heads outlined and lettered G and A."""
    import matplotlib.pyplot as plt

    from .. import plots

    exact = result.ranking.dropna(subset=["acc"])
    if exact.empty:
        plots.style()
        fig, ax = plt.subplots(figsize=(plots.WIDTH, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, f"no exact sweep: more than {MAX_SWEPT} heads in the layers to sweep", ha="center", va="center")
        return fig
    grid = exact.pivot(index="layer", columns="head", values="acc") * 100
    ax = plots.head_heatmap(grid, f"{result.cfg.model}: one head zeroed (none: {result.screen_clean.acc:.0%})",
                            "accuracy (%)")
    for r in ROLE_NAMES:
        for h in result.roles.heads[r]:
            if h.layer in grid.index and h.head in grid.columns:
                y, x = list(grid.index).index(h.layer), list(grid.columns).index(h.head)
                ax.add_patch(plt.Rectangle((x, y), 1, 1, fill=False, edgecolor="tab:cyan", lw=2.5))
                ax.text(x + 0.5, y + 0.5, r, ha="center", va="center", color="tab:cyan", fontweight="bold")
    return ax.figure


def conditions_figure(result: Result):
    """Accuracy under each condition with 95% intervals, on the check's prompts and (beside it,
    where scored) on the knowledge tasks; the clean accuracy and chance as lines."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    panels = [(conditions_table(result, short=True), f"{_task(result)} ({result.clean.n} fresh prompts)", result.chance)]
    if result.knowledge:
        clean = result.knowledge_under(NONE)
        panels.append((conditions_table(result, short=True, knowledge=True), f"knowledge ({clean.n} items)", clean.chance))
    n = len(panels[0][0])
    fig, axes = plt.subplots(1, len(panels), figsize=(plots.WIDTH, 1.6 + 0.32 * n), sharey=True, squeeze=False)
    for ax, (table, title, chance) in zip(axes[0], panels):
        y = np.arange(len(table))[::-1]
        colours = ["0.45" if k in control_names(result) else "tab:blue" for k in table.index]
        ax.barh(y, 100 * table.acc, xerr=[100 * (table.acc - table.lo), 100 * (table.hi - table.acc)], color=colours,
                capsize=2, height=0.6)
        ax.set_yticks(y, table.zeroed)
        ax.axvline(100 * chance, ls=":", color="0.2", lw=1.5, label="chance")
        ax.axvline(100 * table.acc.iloc[0], ls="--", color="0.4", lw=1, label="no head zeroed")
        ax.set(xlabel="accuracy (%)", xlim=(0, 102), title=title)
    plots.legend_below(axes[0][0], ncols=2)
    return fig
