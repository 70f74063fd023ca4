"""Zeroing single heads of the minimal model (the paper's §3.4 and Table 1).

A head is zeroed where its output enters its layer's output projection (a hook; no weight is
edited). The protocol (`head_screen.screen`, shared with masking) first finds, on one set of
prompts, where the harm is: the minimal model by the paper's rule (the layer-pruning page's),
each layer's whole attention zeroed, the layers that matter swept head by head, the attribution
screen for every head; it names the Gather and the Aggregate head among the heads whose zeroing
hurts (the paper's where it names them for the model). Then, on other prompts disjoint from the
screen's, as many as the claims need (`verdicts.plan`), it zeroes the screen's most harmful head,
each role's heads and both; on a random part of those prompts, as many as the claims that depend
on a head that hurts need (`verdicts.Power.n_dependent`), random heads of the same layers and Table 1's
"keep only" configurations beside the heads they are compared with, and knowledge on the cloze
twins of those prompts.

The task is MMLU-format letter selection: on the CPU profile Qwen2.5-Coder-1.5B-Instruct (a real
pretrained model that picks letters) on the book's letter set, its knowledge the cloze twins of
the very check questions; on the paper profiles the paper's model on MMLU and the released code's
six knowledge tasks. KV retrieval (`task="kv"`) is screened by the book's shared KV ranking.

The headline claims (`verdicts.Verdict.headline`) are the paper's: one head takes the task most of
the way to chance, the harmful heads are a Gather and an Aggregate head, and each of those is such
a bottleneck. The others depend on a head that hurts (`verdicts.gated`): random heads doing little,
Table 1's keep-only, knowledge kept with a head zeroed.
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
from ..heads import Head
from ..protocol import base, head_screen, loading, stores

# The screen (minimal model, prompts split, where the harm is, ranking, roles) is shared with masking:
# this chapter's Config is the screen's; the check (the heads zeroed on fresh prompts) and its verdicts are here.
from ..protocol.head_screen import MAX_SWEPT, NONE, LayerScan, agreement, measure_conditions, screen
from ..protocol.head_screen import ScreenConfig as Config
from ..protocol.roles import ROLE_NAMES, Roles, missing_role
from ..reference import paper
from ..specs import Spec
from ..stats import Score, TaskMean
from ..sweep import sweep

# the SSM side at toy scale, on the letter MCQ (every profile's page shows it)
SSM_TOY = registry.cast("cpu", "llamba")
CONTROL_SIZE = (
    4  # heads per random control: more than any one role holds, so a null result means something
)


# --- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    cfg: Config
    layers_kept: int
    n_layers: int
    screen_clean: Score  # no head zeroed, on the screen's prompts
    ranking: pd.DataFrame  # `heads.ranking_table` on the screen's prompts
    roles: Roles
    scan: LayerScan  # each layer's attention zeroed on the screen's prompts
    scores: dict[str, Score]  # the headline's conditions -> score on the check's prompts
    controls: list[tuple[Head, ...]]
    chance: float
    provenance: dict
    # task -> condition -> score
    knowledge: dict[str, dict[str, Score]] = field(default_factory=dict)
    knowledge_chance: dict[str, float] = field(default_factory=dict)  # task -> chance
    # the task by layers kept on the layer-pruning chapter's items, where the minimal model was found there
    depths: dict[int, Score] = field(default_factory=dict)
    task_name: str = ""  # the check's benchmark (a toy's letter MCQ is not MMLU)
    swept: tuple[int, ...] = ()  # the layers swept exactly on the screen
    power: v.Power | None = (
        None  # how many check questions the claims need (None: set, or the rest of MMLU)
    )
    top: Head | None = None  # the screen's most harmful head, zeroed on the check too
    # condition -> score on the check's first `n_dependent` prompts
    dependent: dict[str, Score] = field(default_factory=dict)

    def knowledge_under(self, condition: str) -> TaskMean:
        """Knowledge under one condition: the unweighted mean over the tasks, as the release scores it."""
        tasks = list(self.knowledge)
        return TaskMean.of(
            [self.knowledge[t][condition] for t in tasks], [self.knowledge_chance[t] for t in tasks]
        )

    @property
    def clean(self) -> Score:
        return self.scores[NONE]

    @property
    def n_dependent(self) -> int:
        """How many of the check's prompts (a part drawn at random) the dependent claims were scored on."""
        return self.dependent[NONE].n

    def control_scores(self) -> list[Score]:
        return [self.dependent[control(i)] for i in range(len(self.controls))]

    def score(self, condition: str) -> Score:
        """A condition's score on the most check prompts it was scored on."""
        return self.scores[condition] if condition in self.scores else self.dependent[condition]

    @property
    def conditions(self) -> list[str]:
        """Every condition of the check: the headline's, then those scored on the random part only."""
        return list(self.scores) + [k for k in self.dependent if k not in self.scores]


BOTH, TOP = "G and A zeroed", "the screen's most harmful head zeroed"


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


def conditions(
    roles: Roles, top: Head | None, n_heads: dict[int, int], n_controls: int, seed: int
) -> tuple[dict[str, tuple[Head, ...]], list[tuple[Head, ...]]]:
    """What is zeroed on the check's prompts: the screen's most harmful head, each role's heads,
    both, Table 1's "keep only" configurations in the roles' layers, and random heads of the
    candidates' layers (the roles', else the harmful heads' or the top head's; other than those
    heads; of every layer in `n_heads` where those layers hold too few others for `n_controls`
    different sets), each as the heads it zeroes."""
    g, a = roles.heads["G"], roles.heads["A"]
    out = {NONE: (), **{zeroed(r): tuple(roles.heads[r]) for r in ROLE_NAMES if roles.heads[r]}}
    if g and a:
        out[BOTH] = tuple(g + a)
    if top is not None and top not in g + a:
        out[TOP] = (top,)
    layers = control_layers(roles, top)
    for kept in (("G", "A"), ("G",), ("A",)):
        if g and a:
            keep = {h for r in kept for h in roles.heads[r]}
            out[kept_only(*kept)] = tuple(
                Head(l, h) for l in layers for h in range(n_heads[l]) if Head(l, h) not in keep
            )
    taken = set(g + a) | set(roles.candidates) | ({top} if top else set())
    pool = [Head(l, h) for l in layers for h in range(n_heads[l]) if Head(l, h) not in taken]
    # a toy's few heads a layer: draw from every layer kept
    if math.comb(len(pool), CONTROL_SIZE) < n_controls:
        pool = [
            Head(l, h)
            for l in sorted(n_heads)
            for h in range(n_heads[l])
            if Head(l, h) not in taken
        ]
    controls = distinct_draws(pool, CONTROL_SIZE, n_controls, seed)
    out |= {control(i): tuple(c) for i, c in enumerate(controls)}
    return out, controls


def control_layers(roles: Roles, top: Head | None) -> list[int]:
    """The layers random heads are drawn from: the roles' heads', else the two most harmful
    candidates', else the top head's."""
    heads = roles.heads["G"] + roles.heads["A"] or roles.candidates[:2] or ((top,) if top else ())
    return sorted({h.layer for h in heads})


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
    loaded = loading.load(cfg.model)
    n_layers = loaded.adapter.n_layers
    found = screen(cfg, loaded)
    check, kept, layers, ranking, roles = (
        found.check,
        found.layers_kept,
        found.layers,
        found.ranking,
        found.roles,
    )
    n_heads = {l: loaded.adapter.n_heads(l) for l in layers}
    top = next(iter(hd.measured(ranking)), None)
    zeroes, controls = conditions(roles, top, n_heads, cfg.n_controls, cfg.seed)
    within = Spec(keep_layers=range(kept))
    specs = {k: within.zeroing(*heads) for k, heads in zeroes.items()}

    # The headline's conditions on every check prompt; the dependent claims' (random heads, keep-only) on a
    # random part of them, as many as they need, beside the heads they are compared with there (their pairs);
    # knowledge where a claim reads it (no head, the roles' and the top head zeroed), on that part's cloze twins.
    headline = {k: a for k, a in specs.items() if k in (NONE, BOTH, TOP, *map(zeroed, ROLE_NAMES))}
    dependent = {k: a for k, a in specs.items() if k != BOTH}
    n_first = found.power.n_dependent if found.power else len(check)
    first = head_screen.check_part(check, n_first, cfg.seed) if n_first < len(check) else check
    # the cloze twins where the set has them
    knowledge = bm.knowledge_of(first, cfg.profile, cfg.n_knowledge, cfg.seed)
    measured = [("check", check, headline if first is not check else specs)]
    measured += [("first", first, dependent)] if first is not check else []
    measured += [(b.name, b, headline) for b in knowledge]
    store = stores.open_store(cfg.chapter, cfg.profile, "check", [loaded], measure_conditions)
    cells = [
        dict(
            model=cfg.model,
            benchmark=b.name,
            items=b.spec,
            specs={k: str(spec) for k, spec in conditions_of.items()},
        )
        for _, b, conditions_of in measured
    ]
    rows = sweep(store, cells, measure_conditions, desc="heads zeroed on fresh prompts")
    scored = {
        key: {c: Score.from_json(row[c]) for c in conditions_of}
        for (key, _, conditions_of), row in zip(measured, rows)
    }
    on_first = scored["first" if first is not check else "check"]
    return Result(
        cfg,
        kept,
        n_layers,
        found.screen_clean,
        ranking,
        roles,
        found.scan,
        {k: scored["check"][k] for k in headline},
        controls,
        check.chance,
        base.record(cfg, [loaded], timer),
        {b.name: scored[b.name] for b in knowledge},
        {b.name: b.chance for b in knowledge},
        found.depths,
        check.name,
        found.swept,
        found.power,
        top,
        {k: on_first[k] for k in dependent},
    )


# --- verdicts ----------------------------------------------------------------------------------


def _task(result: Result) -> str:
    if result.cfg.task == "kv":
        return "KV retrieval"
    # a toy's letter MCQ
    return result.task_name if registry.spec(result.cfg.model).toy and result.task_name else "MMLU"


def top_condition(result: Result) -> str | None:
    """The check's condition that zeroes the screen's most harmful head (a role's, where it has one)."""
    if result.top is None:
        return None
    return next((zeroed(r) for r in ROLE_NAMES if result.roles.heads[r] == (result.top,)), TOP)


def hurts(result: Result, condition: str) -> tuple[str, str]:
    """Does the condition lower the task on the check's prompts (`verdicts.falls`, paired)?"""
    return v.falls(result.clean, result.scores[condition], result.chance)


def one_head(result: Result) -> tuple[str, str]:
    """Does zeroing the screen's most harmful head (picked on the screen's prompts) take the task
    most of the way to chance on the check's, and lower than every random control?"""
    condition = top_condition(result)
    if condition is None:
        return v.NOT_TESTABLE, "no head was measured exactly on the screen"
    outcome, evidence = v.beats_controls(
        result.clean,
        result.scores[condition],
        result.control_scores(),
        result.chance,
        ablated_on_controls=result.dependent[condition],
    )
    return outcome, f"{result.top}: {evidence}"


def roles_found(result: Result) -> tuple[str, str]:
    """Do the heads that hurt include a Gather and an Aggregate head? The paper's heads: do they
    behave as its roles here? One finding for a role that no harmful head plays (not one per
    claim about that role: those are not testable)."""
    if result.roles.source == "paper":
        return behave(result)
    parts = []
    for r in ROLE_NAMES:
        if not result.roles.heads[r]:
            parts.append(missing_role(result.roles, r, result.clean, result.chance))
            continue
        # named among the heads that hurt on the screen's prompts; they must hurt on the check's too
        outcome, evidence = hurts(result, zeroed(r))
        parts.append(
            (
                outcome,
                f"{ROLE_NAMES[r]}: {result.roles.describe(r)}; zeroed on the check: {evidence}",
            )
        )
    return v.every(o for o, _ in parts), "; ".join(e for _, e in parts)


def bottleneck(result: Result, role: str) -> tuple[str, str]:
    """Does zeroing the role's heads take the task most of the way to chance, and lower than every
    random control (`verdicts.beats_controls`, paired on the check's prompts, against the
    controls on the prompts they were scored on)? Not testable where no harmful head plays the
    role (the roles' claim says so, once)."""
    if not result.roles.heads[role]:
        return v.NOT_TESTABLE, f"no {ROLE_NAMES[role]} head to zero ({result.roles.missing(role)})"
    return v.beats_controls(
        result.clean,
        result.scores[zeroed(role)],
        result.control_scores(),
        result.chance,
        ablated_on_controls=result.dependent[zeroed(role)],
    )


def controls_do_little(result: Result) -> tuple[str, str]:
    """Every random draw keeps accuracy (`verdicts.kept` for each, `verdicts.every` over them),
    judged where the most harmful head hurts: beside a head that changes nothing, random heads
    that change nothing say nothing. The page says whether their layers' attention matters."""
    condition = top_condition(result)
    if condition is None or not result.controls:
        return (
            v.NOT_TESTABLE,
            "no random controls were drawn" if condition else "no head was measured exactly",
        )

    def decide():
        parts = [v.kept(result.dependent[NONE], c, result.chance) for c in result.control_scores()]
        lowest = min(range(len(parts)), key=lambda i: result.control_scores()[i].acc)
        drawn = sorted({h.layer for c in result.controls for h in c})
        return v.every(o for o, _ in parts), (
            f"{len(result.controls)} draws of {CONTROL_SIZE} heads of layer"
            f"{'s' if len(drawn) > 1 else ''} {', '.join(map(str, drawn))} "
            f"({layers_matter(result, drawn)}); the lowest, "
            f"{', '.join(map(str, result.controls[lowest]))}: {parts[lowest][1]}"
        )

    return v.gated(
        hurts(result, condition), f"zeroing {result.top} does not lower the task", decide
    )


def only_roles_kept(result: Result) -> tuple[str, str]:
    """Table 1: only G and A left in their layers keep accuracy, judged where zeroing G and A
    together lowers it (else the two carry nothing the claim could keep)."""
    name = kept_only("G", "A")
    if name not in result.dependent:
        missing = [ROLE_NAMES[r] for r in ROLE_NAMES if not result.roles.heads[r]]
        return v.NOT_TESTABLE, f"no {' or '.join(missing)} head to keep (the roles' claim says why)"
    return v.gated(
        hurts(result, BOTH),
        "zeroing G and A together does not lower the task",
        lambda: v.kept(result.dependent[NONE], result.dependent[name], result.chance),
    )


def behave(result: Result) -> tuple[str, str]:
    """Do the paper's heads act as its roles here (`heads.assign_roles` on their measures and the
    screen's candidates)?"""
    found = result.roles.found
    if found is None:
        return v.NOT_TESTABLE, "their attention was not measured (single SSM channels)"
    parts, notes = [], []
    for r in ROLE_NAMES:
        parts.append(v.REPRODUCED if found[r] in result.roles.heads[r] else v.NOT_REPRODUCED)
        notes.append(
            f"{ROLE_NAMES[r]}: the paper's {result.roles.label(r)}, by behaviour "
            f"{found[r] or 'none of the candidates'}"
        )
    return v.every(parts), "; ".join(notes)  # both of the paper's heads must behave


def knowledge_kept(result: Result, role: str) -> tuple[str, str]:
    """Is knowledge kept with the role's heads zeroed (`verdicts.kept` on the unweighted mean over
    the knowledge tasks, each task paired across conditions)? Judged where zeroing them lowers the
    task: knowledge kept beside letters kept is no dissociation."""
    if not result.roles.heads[role]:
        return v.NOT_TESTABLE, f"no {ROLE_NAMES[role]} head to zero (the roles' claim says why)"
    if not result.knowledge:
        return v.NOT_TESTABLE, "no knowledge task was scored"
    clean = result.knowledge_under(NONE)
    return v.gated(
        hurts(result, zeroed(role)),
        f"zeroing {result.roles.label(role)} does not lower the task",
        lambda: v.kept(clean, result.knowledge_under(zeroed(role)), clean.chance),
    )


def verdicts(result: Result) -> list[v.Verdict]:
    task = _task(result)
    roles_claim = (
        "The paper's heads behave as Gather and Aggregate here"
        if result.roles.source == "paper"
        else "Among the heads whose zeroing hurts, one behaves as a Gather head and one as an Aggregate head"
    )
    out = [
        v.Verdict(
            f"Zeroing one head (the screen's most harmful, {result.top or 'none'}) takes {task} most of the "
            "way to chance",
            "§3.4, abstract",
            *one_head(result),
            headline=True,
        )
    ]
    if result.roles.source != "set":
        out.append(v.Verdict(roles_claim, "§3.4, Fig. 1", *roles_found(result), headline=True))
    out += [
        v.Verdict(
            f"Zeroing the {ROLE_NAMES[r]} head ({result.roles.label(r)}) alone takes {task} most of the way "
            "to chance",
            "§3.4, abstract",
            *bottleneck(result, r),
            headline=True,
        )
        for r in ROLE_NAMES
    ]
    out.append(
        v.Verdict(
            f"Zeroing {CONTROL_SIZE} random heads of the same layers does little",
            "§3.4",
            *controls_do_little(result),
        )
    )
    out.append(
        v.Verdict(
            "Keeping only G and A in their layers keeps accuracy",
            "Table 1",
            *only_roles_kept(result),
        )
    )
    out += [
        v.Verdict(
            f"Knowledge is kept with the {ROLE_NAMES[r]} head zeroed",
            "§3.4, abstract",
            *knowledge_kept(result, r),
        )
        for r in ROLE_NAMES
    ]
    return out


def layers_matter(result: Result, layers: list[int]) -> str:
    """Whether the layers' attention matters on the screen's prompts (the layer scan), in words."""
    said = [
        f"L{l}: {'matters' if result.scan.matters(l) else 'does not matter'} ({result.scan.loss(l)})"
        for l in layers
    ]
    return "attention zeroed on the screen: " + "; ".join(said)


# --- tables and figures ------------------------------------------------------------------------


def _describe(result: Result, name: str, short: bool = False) -> str:
    """A condition as a table prints it, or as a figure's axis does (`short`)."""
    if name in (zeroed("G"), zeroed("A")):
        role = name[0]
        return (
            f"{role} {result.roles.label(role)}"
            if short
            else f"{ROLE_NAMES[role]} {result.roles.label(role)} zeroed"
        )
    if name in (drawn := control_names(result)):
        i = drawn.index(name)
        return f"random #{i + 1}" if short else f"{name}: {', '.join(map(str, result.controls[i]))}"
    return (
        name.replace(" kept in its layers", " kept").replace(" kept in their layers", " kept")
        if short
        else name
    )


def rounding_scores(result: Result) -> dict[str, Score]:
    """What the page's near-tie count reads: the headline's conditions on the check's prompts."""
    return {name: s for name, s in result.scores.items() if name not in control_names(result)}


def control_names(result: Result) -> list[str]:
    """The conditions that are random controls, in the order of `result.controls`."""
    return [control(i) for i in range(len(result.controls))]


def conditions_table(result: Result, short: bool = False, knowledge: bool = False) -> pd.DataFrame:
    """One row per condition of the check, indexed by the condition: what was zeroed, acc, lo,
    hi, n (of the task on the most prompts it was scored on, or with `knowledge` of the knowledge
    tasks' unweighted mean)."""
    scored = set(next(iter(result.knowledge.values()), {})) if knowledge else set(result.conditions)
    score = result.knowledge_under if knowledge else result.score
    # knowledge is scored under the conditions a claim reads, not under the controls
    nan = float("nan")
    return pd.DataFrame(
        [
            dict(
                zeroed=_describe(result, k, short),
                **(
                    dict(acc=score(k).acc, lo=score(k).lo, hi=score(k).hi, n=score(k).n)
                    if k in scored
                    else dict(acc=nan, lo=nan, hi=nan, n=nan)
                ),
            )
            for k in result.conditions
        ],
        index=pd.Index(result.conditions, name="condition"),
    )


def roles_table(result: Result) -> pd.DataFrame:
    """What each measured candidate does (`segments.head_measures`, averaged over the screen's
    prompts), most harmful first, with its accuracy zeroed on the screen and the role it was given."""
    m = result.roles.measures
    if m is None or m.empty:
        return pd.DataFrame(columns=["head", "role"])
    found = result.roles.found or {}
    order = list(result.roles.candidates) + [
        Head(*h) for h in m.index if Head(*h) not in result.roles.candidates
    ]
    screen = lambda h: (
        _screen_row(result, h)[0] if h in hd.measured(result.ranking) else float("nan")
    )
    rows = [
        {
            "head": str(h),
            "role by behaviour": next((ROLE_NAMES[r] for r in found if found[r] == h), "-"),
            "screen: accuracy zeroed": screen(h),
            "segment ends: own-segment share": m.loc[[h], hd.GATHER_MEASURE].iloc[0],
            "final position: on the segments": m.loc[[h], hd.SEGMENTS_MEASURE].iloc[0],
            "final position: on segment ends": m.loc[[h], hd.ENDS_MEASURE].iloc[0],
            "final position: on option letters": m.loc[[h], hd.LETTERS_MEASURE].iloc[0],
            "final position: on summary tokens (both)": m.loc[[h], hd.AGGREGATE_MEASURE].iloc[0],
            "segment ends: share on themselves and the previous token": m.loc[
                [h], hd.LOCAL_MEASURE
            ].iloc[0],
        }
        for h in order
    ]
    return pd.DataFrame(rows)


def scan_table(result: Result) -> pd.DataFrame:
    """One row per layer of the minimal model: the task's and knowledge's paired change with the
    layer's whole attention zeroed on the screen's prompts, whether it matters, whether it was
    swept head by head."""
    scan = result.scan
    rows = []
    for l in scan.layers:
        know = scan.knowledge_loss(l)
        rows.append(
            {
                "layer": l,
                f"{_task(result)}: change (points)": str(scan.loss(l)),
                "knowledge: change (points)": str(know) if know else "-",
                "matters": "yes" if scan.matters(l) else "no",
                "swept head by head": "yes" if l in result.swept else "no",
            }
        )
    return pd.DataFrame(rows)


def comparison(result: Result) -> pd.DataFrame:
    fmt = lambda name: f"{result.score(name)}" if name in result.conditions else "-"
    llama = registry.cast("paper", "llama")
    g, a = (
        paper("head_zeroing", "gather_head", llama),
        paper("head_zeroing", "aggregate_head", llama),
    )
    controls = result.control_scores()
    top = top_condition(result)
    rows = [
        (
            "model",
            f"Llama-3.1-8B-Instruct, layers 0-{paper('layer_pruning', 'minimal_model_last_layer').value}",
            "same (cells 23-31)",
            f"{result.cfg.model}, layers 0-{result.layers_kept - 1} of {result.n_layers} "
            f"({result.cfg.profile} profile; {minimal_source(result)})",
        ),
        (
            "task",
            f"MMLU, {paper('released_settings', 'num_fewshot').value}-shot",
            f"lm-eval {paper('released_settings', 'lm_eval_version').value}",
            f"{_task(result)}, {result.clean.n} fresh prompts disjoint from the screen's {result.screen_clean.n}",
        ),
        ("where the harm is", "L16 and L17 (Fig. 3)", "-", harm_row(result)),
        (
            "the most harmful head",
            "G or A (§3.4)",
            "-",
            f"{result.top} (screen {_screen_row(result, result.top)[0]:.1%}; check {fmt(top)})"
            if top
            else "-",
        ),
        ("Gather head", str(g), "GATHER_HEADS (cell 13)", result.roles.describe("G")),
        ("Aggregate head", str(a), "AGGREGATE_HEADS (cell 15)", result.roles.describe("A")),
        ("no head zeroed", str(paper("head_zeroing", "mmlu_minimal")), "-", fmt(NONE)),
        (
            "one head zeroed (G or A)",
            str(paper("head_zeroing", "mmlu_one_head_zeroed")),
            "-",
            f"G: {fmt(zeroed('G'))}; A: {fmt(zeroed('A'))} (chance {result.chance:.0%})",
        ),
        (
            f"{CONTROL_SIZE} random heads zeroed",
            "little change (§3.4)",
            "-",
            f"{min(c.acc for c in controls):.1%} to {max(c.acc for c in controls):.1%} over {len(controls)} draws "
            f"(no head zeroed on those {result.n_dependent}: {result.dependent[NONE].acc:.1%})"
            if controls
            else "-",
        ),
        (
            "knowledge, no head / G / A zeroed",
            "hardly moves (abstract)",
            "-",
            knowledge_row(result),
        ),
        (
            "only G and A kept in their layers",
            "accuracy kept (Table 1)",
            "cell 29",
            fmt(kept_only("G", "A")),
        ),
        (
            "only G kept / only A kept",
            "Table 1 (not read)",
            "cells 25 / 27 (labels swapped)",
            f"{fmt(kept_only('G'))} / {fmt(kept_only('A'))}",
        ),
    ]
    return base.comparison_table(rows)


def harm_row(result: Result) -> str:
    """The layers whose attention matters on the screen, the most harmful first, and those swept."""
    scan = result.scan
    matter = scan.that_matter()
    worst = min(scan.layers, key=lambda l: scan.loss(l).delta)
    return (
        f"most harmful attention: L{worst} ({scan.loss(worst)}); attention matters in "
        f"{', '.join(f'L{l}' for l in sorted(matter)) or 'no layer'}; swept head by head: "
        f"{', '.join(f'L{l}' for l in result.swept) or 'none'}"
    )


def minimal_source(result: Result) -> str:
    if result.depths:
        return (
            f"the layer-pruning chapter's minimal model: the shallowest cut above the sharpest fall of the task on "
            f"its {_n_walked(result)} items"
        )
    return "as set" if result.cfg.layers_kept else "the published minimal model"


def _n_walked(result: Result) -> int:
    return next(iter(result.depths.values())).n


def knowledge_row(result: Result) -> str:
    if not result.knowledge:
        return "-"
    cond = [NONE] + [zeroed(r) for r in ROLE_NAMES if zeroed(r) in result.scores]
    return (
        " / ".join(result.knowledge_under(c).brief for c in cond)
        + f"; tasks: {', '.join(result.knowledge)}"
    )


def draws(result: Result) -> str:
    """What `seed` drew on this page, the ties among the candidates, and whether the screen could
    tell its heads apart."""
    cfg = result.cfg
    if cfg.task == "kv":
        prompts_drawn = (
            f"the screen's KV dictionaries (seed {cfg.seed}) and the check's (seed {cfg.seed + 1})"
        )
    else:
        prompts_drawn = (
            f"the split of the letter questions into the screen's {result.screen_clean.n} and the "
            f"check's {result.clean.n}"
        )
    knowledge = (
        f", the {sum(next(iter(s.values())).n for s in result.knowledge.values())} knowledge items"
        if result.knowledge
        else ""
    )
    controls = (
        f"the {len(result.controls)} random control sets (all different)"
        if result.controls
        else "no random control set (too few heads outside the candidates)"
    )
    text = f"Seed {cfg.seed} drew {prompts_drawn}{knowledge} and {controls}."
    for r in ROLE_NAMES:
        if tied := result.roles.ties.get(r):
            text += (
                f" {', '.join(map(str, tied))} {'is' if len(tied) == 1 else 'are'} as harmful on the screen as "
                f"{result.roles.label(r)} (within its interval) and behave{'s' if len(tied) == 1 else ''} as the "
                f"{ROLE_NAMES[r]} head too: the screen's order named {result.roles.label(r)}."
            )
    if result.roles.source == "behaviour" and (top := hd.measured(result.ranking)):
        readable, why = v.ranking_readable(
            result.screen_clean, _screen_row(result, top[0]), result.chance
        )
        named = any(result.roles.heads[r] for r in ROLE_NAMES)
        if not readable:
            text += f" No head stands out on the screen: {why}." + (
                " The roles are named among heads that tie, so another seed may name other heads; the claims "
                "below are measured on the check all the same."
                if named
                else ""
            )
    return text


def protocol_note(result: Result) -> str:
    """The choices the page made, in numbers: how many check questions and why, where the harm is,
    and how far the attribution screen agrees with the exact sweep."""
    parts = []
    if result.power is not None:
        parts.append(result.power.note("check questions"))
    if result.controls:
        flips = [
            float((result.dependent[NONE].correct != c.correct).mean())
            for c in result.control_scores()
        ]
        parts.append(
            f"The random controls flipped {100 * min(flips):.1f}% to {100 * max(flips):.1f}% of the check's "
            "questions either way."
        )
    beside = " beside the layers of the paper's heads" if result.roles.source == "paper" else ""
    parts.append(
        f"Where the harm is, on the screen's {result.screen_clean.n} prompts: {harm_row(result)}. The "
        f"{result.cfg.harm_layers} most task-specific of the layers that matter ({_task(result)} lost "
        f"beyond knowledge) are swept head by head{beside}, and the attribution screen's top "
        f"{result.cfg.top} heads are zeroed exactly too."
    )
    agree = agreement(result.ranking)
    if agree["n"] >= 5:
        rho, lo, hi = agree["rho"]
        parts.append(
            f"The attribution screen against the exact sweep on the {agree['n']} heads both measured: rank "
            f"correlation {rho:.2f} [{lo:.2f}, {hi:.2f}]; of the sweep's {agree['k']} most harmful heads, "
            f"{agree['recall']} are among the screen's {agree['k']} lowest estimates."
        )
    return " ".join(parts)


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
        ax.text(
            0.5,
            0.5,
            f"no exact sweep: more than {MAX_SWEPT} heads in the layers to sweep",
            ha="center",
            va="center",
        )
        return fig
    grid = exact.pivot(index="layer", columns="head", values="acc") * 100
    # The colours run from chance to the clean accuracy, not over the cells' range: a one-question
    # difference must not look like a collapse.
    ax = plots.head_heatmap(
        grid,
        f"{result.cfg.model}: one head zeroed (none: {result.screen_clean.acc:.0%})",
        f"accuracy (%): chance {result.chance:.0%} to clean",
        limits=(100 * result.chance, 100 * result.screen_clean.acc),
    )
    for r in ROLE_NAMES:
        for h in result.roles.heads[r]:
            if h.layer in grid.index and h.head in grid.columns:
                y, x = list(grid.index).index(h.layer), list(grid.columns).index(h.head)
                ax.add_patch(plt.Rectangle((x, y), 1, 1, fill=False, edgecolor="tab:cyan", lw=2.5))
                ax.text(
                    x + 0.5,
                    y + 0.5,
                    r,
                    ha="center",
                    va="center",
                    color="tab:cyan",
                    fontweight="bold",
                )
    return ax.figure


def scan_figure(result: Result):
    """Each layer's whole attention zeroed on the screen's prompts: the paired change of the task
    and of knowledge (95% intervals), the layers swept head by head marked."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    scan = result.scan
    layers = scan.layers
    fig, ax = plt.subplots(figsize=(plots.WIDTH, 3.8))
    x = np.arange(len(layers))
    series = [(_task(result), [scan.loss(l) for l in layers], "tab:blue", -0.2)]
    if scan.knowledge:
        series.append(
            (
                "knowledge" + (" (the same facts as cloze)" if scan.paired_knowledge else ""),
                [scan.knowledge_loss(l) for l in layers],
                "tab:orange",
                0.2,
            )
        )
    for label, diffs, colour, shift in series:
        d = np.array([100 * x.delta for x in diffs])
        err = [d - [100 * x.lo for x in diffs], [100 * x.hi for x in diffs] - d]
        ax.bar(x + shift, d, 0.4, yerr=err, color=colour, capsize=1.5, label=label)
    for k, l in enumerate(layers):
        if l in result.swept:
            ax.annotate(
                "swept",
                (k, 0),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                fontsize=plots.MIN_FONT,
                rotation=90,
            )
    ax.axhline(0, color="0.3", lw=0.8)
    ax.axhline(
        -100 * (scan.task[NONE].acc - scan.chance),
        ls=":",
        color="0.2",
        lw=1.2,
        label="down to chance",
    )
    ax.set_xticks(x, [str(l) for l in layers], fontsize=plots.MIN_FONT)
    ax.set(
        xlabel="layer whose attention is zeroed",
        ylabel="change (points)",
        title=f"{result.cfg.model}: each layer's attention zeroed ({scan.task[NONE].n} screen questions)",
    )
    plots.legend_below(ax, ncols=3)
    return fig


def conditions_figure(result: Result):
    """Accuracy under each condition with 95% intervals, on the check's prompts and (beside it,
    where scored) on the knowledge tasks; the clean accuracy and chance as lines."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    first = (
        f"; random and keep-only on {result.n_dependent} of them"
        if result.n_dependent < result.clean.n
        else ""
    )
    panels = [
        (
            conditions_table(result, short=True),
            f"{_task(result)} ({result.clean.n} fresh prompts{first})",
            result.chance,
        )
    ]
    if result.knowledge:
        clean = result.knowledge_under(NONE)
        panels.append(
            (
                conditions_table(result, short=True, knowledge=True),
                f"knowledge ({clean.n} items)",
                clean.chance,
            )
        )
    n = len(panels[0][0])
    fig, axes = plt.subplots(
        1, len(panels), figsize=(plots.WIDTH, 1.6 + 0.32 * n), sharey=True, squeeze=False
    )
    for ax, (table, title, chance) in zip(axes[0], panels):
        y = np.arange(len(table))[::-1]
        colours = ["0.45" if k in control_names(result) else "tab:blue" for k in table.index]
        ax.barh(
            y,
            100 * table.acc,
            xerr=[100 * (table.acc - table.lo), 100 * (table.hi - table.acc)],
            color=colours,
            capsize=2,
            height=0.6,
        )
        ax.set_yticks(y, table.zeroed)
        ax.axvline(100 * chance, ls=":", color="0.2", lw=1.5, label="chance")
        ax.axvline(100 * table.acc.iloc[0], ls="--", color="0.4", lw=1, label="no head zeroed")
        ax.set(xlabel="accuracy (%)", xlim=(0, 102), title=title)
    plots.legend_below(axes[0][0], ncols=2)
    return fig
