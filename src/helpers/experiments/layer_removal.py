"""Removing one layer at a time from the minimal model (the paper's Fig. 3).

The minimal model is the published one where there is one (Llama-3.1-8B: layers 0-17), else the
one the layer-pruning chapter finds (`minimal.minimal_depth` on that chapter's walk, `minimal.prune`,
at its own sizes and settings through its results store, so both pages name the same minimal
model). Each of its layers is then skipped in turn and the retrieval probe (MMLU, or KV retrieval
where the model picks letters at chance) and the knowledge tasks are scored without it, beside
the minimal model itself on the same items. The sweep engine reuses the residual stream below the removed
layer, so each removal reruns only the layers above it; the whole sweep costs about d/2 full
passes for a minimal model of d layers. On the CPU profile (the letter model, Qwen2.5-Coder-1.5B,
on the letter set, knowledge the cloze twins of the same facts) the items are as many as the
claims need at the minimal model's accuracy (`verdicts.plan`), at least 150.

The paper's claim: only the removal of a critical layer or two (L16, L17 in Llama-3.1-8B)
takes retrieval to chance, while the knowledge tasks change little whichever layer goes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from .. import benchmarks as bm
from .. import registry
from .. import verdicts as v
from ..engine import SweepEngine
from ..errors import ConfigError
from ..evaluate import mean_over_tasks
from ..protocol import base, checks, fields, loading, minimal, stores
from ..reference import paper
from ..specs import Spec
from ..stats import Score, TaskMean
from ..sweep import sweep

CPU_FLOOR = 150  # the CPU profile's items per benchmark for each removal: at least these (more where the claims need them)
FEW = 0.15  # "a few layers": at most this share of the minimal model's layers (the paper: 2 of 18), and at least 2


@dataclass(frozen=True)
class Config(base.BenchmarkConfig):
    model: str = fields.model("attention", "ssm")
    minimal_layers: int | None = fields.count(optional=True)  # None: `run` resolves it

    chapter = "layer_removal"
    # At smoke size the pruning walk cannot shorten the model, so every layer of the 28-layer letter
    # model is removed in turn (~14 full passes per item, about 1 s each on 2 cores): the fewest items
    # that exercise each path (2 letter questions and 1 fact: 58 s in the notebook, where 3 and 2 took 74 s).
    smoke_sizes = dict(n_mmlu=2, n_knowledge=1, n_kv=2)

    @classmethod
    def defaults(cls, profile):
        # The benchmarks of the layer-pruning chapter; the minimal model is resolved in `run`, since it depends on
        # the model. On the CPU profile n_mmlu None is as many letter questions as the claims need at the minimal
        # model's accuracy (at least CPU_FLOOR), their cloze twins the knowledge; on the paper profiles every question.
        sizes = dict(n_mmlu=None, n_knowledge=None, n_kv=CPU_FLOOR) if profile == "cpu" else {}
        return {**minimal.PruningConfig.defaults(profile), **sizes, "minimal_layers": None}

    def __post_init__(self):
        super().__post_init__()
        checks.refuse_toy(self.chapter, "model", self.model)
        checks.check_kv_sizes(self.model, "kv_pairs", [self.kv_pairs])
        n_layers = checks.shape(self.model).n_layers
        if self.minimal_layers is not None and self.minimal_layers > n_layers:
            raise ConfigError(
                f"minimal_layers must be at most {n_layers} for {self.model}, got {self.minimal_layers}"
            )


@dataclass(frozen=True)
class Result(base.ByRole):
    cfg: Config
    minimal_layers: int
    source: str  # where the minimal model comes from: "given", "published" or "found" from the data
    probe: str  # the retrieval benchmark the verdicts read (MMLU, or KV where MMLU is at chance)
    full: dict[str, Score]  # benchmark -> the whole model's score
    minimal: dict[str, Score]  # benchmark -> the minimal model's score
    removed: dict[str, dict[int, Score]]  # benchmark -> layer removed -> score
    roles: dict[str, str]  # benchmark -> bm.RETRIEVAL or bm.KNOWLEDGE
    chance: dict[str, float]
    provenance: dict
    # benchmark -> its kind (`benchmarks.Benchmark.kind`)
    kinds: dict[str, str] = field(default_factory=dict)
    power: v.Power | None = None  # how many items the claims need (None: set, or every question)

    def knowledge(self, layer: int | None = None) -> TaskMean:
        """Knowledge as the release scores it, the unweighted mean over the knowledge tasks, with
        `layer` removed (None: the minimal model)."""
        pick = (lambda t: self.minimal[t]) if layer is None else (lambda t: self.removed[t][layer])
        return TaskMean.of(
            [pick(t) for t in self.knowledge_tasks], [self.chance[t] for t in self.knowledge_tasks]
        )

    @property
    def knowledge_chance(self) -> float:
        return self.knowledge().chance

    def collapse(self, layer: int) -> tuple[str, str]:
        """Does removing `layer` take the probe most of the way to chance (paired, against the
        minimal model)?"""
        return v.collapses(
            self.minimal[self.probe], self.removed[self.probe][layer], self.chance[self.probe]
        )

    def collapsing(self) -> tuple[list[int], list[int]]:
        """The layers whose removal collapses the probe, and those that cannot be told apart."""
        outcomes = {l: self.collapse(l)[0] for l in self.removed[self.probe]}
        return (
            [l for l, o in outcomes.items() if o == v.REPRODUCED],
            [l for l, o in outcomes.items() if o == v.INCONCLUSIVE],
        )


def run(cfg: Config) -> Result:
    timer = base.Timer()
    pruning = minimal.prune(pruning_config(cfg))
    probe = minimal.probe(pruning)
    given = cfg.minimal_layers or minimal.published_minimal(cfg.model)
    d = given or pruning.minimal()
    loaded = loading.load(cfg.model)
    if d > loaded.adapter.n_layers:
        raise ConfigError(
            f"minimal_layers must be at most {loaded.adapter.n_layers} for {cfg.model}, got {d}"
        )
    # The probe and the knowledge tasks (Fig. 3's curves), on this chapter's items: as many as the claims need.
    power = None
    if probe == pruning.mmlu:
        n = cfg.n_mmlu
        if n is None and cfg.profile == "cpu":
            every = len(
                bm.letter_mcq(cfg.model, loaded.tokenizer, cfg.profile, None, cfg.seed, cfg.k_shot)
            )
            power = v.plan(
                pruning.scores[probe][min(d, pruning.n_layers)].acc,
                pruning.chance[probe],
                CPU_FLOOR,
                every,
            )
            n = power.n
        letters = bm.letter_mcq(cfg.model, loaded.tokenizer, cfg.profile, n, cfg.seed, cfg.k_shot)
        # the cloze twins where there are
        sets = [
            letters,
            *bm.knowledge_of(letters, cfg.profile, cfg.n_knowledge, cfg.seed),
        ]
    else:
        sets = [
            bm.kv(cfg.model, loaded.tokenizer, cfg.kv_pairs, cfg.n_kv, cfg.seed, cfg.kv_query),
            *bm.knowledge(cfg.model, cfg.profile, cfg.n_knowledge, cfg.seed),
        ]
    kept = list(range(d))
    store = stores.open_store(cfg.chapter, cfg.profile, "removed", [loaded], measure_removals)
    cells = [dict(model=cfg.model, benchmark=b.name, items=b.spec, minimal_layers=d) for b in sets]
    rows = sweep(store, cells, measure_removals, desc="benchmarks x layers removed")
    removed = {r["benchmark"]: {l: Score.from_json(r[str(l)]) for l in kept} for r in rows}
    at = lambda key: {r["benchmark"]: Score.from_json(r[key]) for r in rows}
    return Result(
        cfg,
        d,
        "given" if cfg.minimal_layers else "published" if given else "found",
        probe,
        at("full"),
        at("minimal"),
        removed,
        {b.name: b.role for b in sets},
        {b.name: b.chance for b in sets},
        base.record(cfg, [loaded], timer),
        {b.name: b.kind for b in sets},
        power,
    )


def measure_removals(cell: dict) -> dict:
    """One benchmark (the cell's items, `benchmarks.from_spec`) on the whole model, on its first
    `minimal_layers` layers, and on those with each one removed (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    engine = SweepEngine(
        loaded, loaded.tokenizer, bm.from_spec(cell["items"], loaded.tokenizer).items
    )
    kept = list(range(cell["minimal_layers"]))
    minimal = Spec(keep_layers=kept)
    removed = engine.layer_sweep(kept, minimal)
    return {
        "full": engine.score().to_json(),
        "minimal": engine.score(minimal).to_json(),
        **{str(l): s.to_json() for l, s in removed.items()},
    }


def pruning_config(cfg: Config) -> minimal.PruningConfig:
    """The layer-pruning chapter's walk for this model and prompt settings, at that chapter's own
    sizes (its results store then serves both pages)."""
    return minimal.PruningConfig.for_profile(
        cfg.profile,
        cfg.smoke,
        model=cfg.model,
        k_shot=cfg.k_shot,
        kv_pairs=cfg.kv_pairs,
        kv_query=cfg.kv_query,
        seed=cfg.seed,
    )


def few(n_layers: int) -> int:
    """How many layers still count as "a few" of a minimal model of `n_layers`."""
    return max(2, math.floor(FEW * n_layers))


def _layers(layers: list[int]) -> str:
    return ", ".join(f"L{l}" for l in layers) or "none"


def collapse(result: Result) -> tuple[str, str]:
    """Does removing some layer take the probe below the line (paired, per layer)?"""
    name, base_score = result.probe, result.minimal[result.probe]
    collapsing, unclear = result.collapsing()
    lowest = sorted(result.removed[name], key=lambda l: result.removed[name][l].acc)[:3]
    shown = "; ".join(
        f"without L{l}: {result.removed[name][l]}" for l in dict.fromkeys(collapsing + lowest)
    )
    outcome = v.REPRODUCED if collapsing else v.INCONCLUSIVE if unclear else v.NOT_REPRODUCED
    return outcome, (
        f"minimal model (layers 0-{result.minimal_layers - 1}) {base_score}; {shown}; the line: a paired "
        f"loss beyond half the gap to chance {result.chance[name]:.0%} (`verdicts.collapses`); layers past "
        f"it: {_layers(collapsing)}; not decided: {_layers(unclear)}"
    )


def only_a_few(result: Result) -> tuple[str, str]:
    collapsing, unclear = result.collapsing()
    limit = few(result.minimal_layers)
    outcome = (
        v.NOT_REPRODUCED
        if len(collapsing) > limit
        else v.INCONCLUSIVE
        if len(collapsing + unclear) > limit
        else v.REPRODUCED
        if collapsing
        else v.NOT_TESTABLE
    )
    return outcome, (
        f"{len(collapsing)} of {result.minimal_layers} layers below the line ({_layers(collapsing)}), "
        f"{len(unclear)} not decided; a few: at most {limit} (the paper: 2 of 18)"
    )


def knowledge_stays(result: Result) -> tuple[str, str]:
    """Is knowledge (the mean over its tasks) kept, paired, when each collapsing layer goes
    (`verdicts.every`: when every one of them goes)?"""
    parts = {
        l: v.kept(result.knowledge(), result.knowledge(l), result.knowledge_chance)
        for l in result.collapsing()[0]
    }
    if not parts:
        return (
            v.NOT_TESTABLE,
            "no layer's removal takes retrieval below the line: nothing to contrast knowledge with",
        )
    evidence = "; ".join(f"without L{l}: {e}" for l, (_, e) in parts.items())
    return v.every(o for o, _ in parts.values()), (
        f"knowledge, the mean over {', '.join(result.knowledge_tasks)}, chance "
        f"{result.knowledge_chance:.0%}: {evidence}"
    )


def the_papers_layers(result: Result) -> tuple[str, str]:
    collapsing, unclear = result.collapsing()
    critical = set(_published_critical(result.cfg.model))
    outcome = (
        v.REPRODUCED
        if set(collapsing) == critical
        else v.INCONCLUSIVE
        if set(collapsing) <= critical <= set(collapsing + unclear)
        else v.NOT_REPRODUCED
    )
    return outcome, f"below the line here: {_layers(collapsing)}; not decided: {_layers(unclear)}"


def verdicts(result: Result) -> list[v.Verdict]:
    name = result.probe
    label = "MMLU" if result.kinds.get(name) == bm.MCQ else f"{name} (in place of MMLU)"
    claims = {
        f"Removing one layer takes {label} most of the way to chance": collapse,
        "Only a few layers do": only_a_few,
        "Knowledge stays when those layers go": knowledge_stays,
    }
    critical = _published_critical(result.cfg.model)
    if critical and max(critical) < result.minimal_layers:
        claims[f"The layers are the paper's ({_layers(critical)})"] = the_papers_layers
    # knowledge "stays" only beside layers that break retrieval
    headline = lambda decide: decide is not knowledge_stays
    base_score, chance = result.minimal[name], result.chance[name]
    if not base_score.above(chance):
        reason = f"the minimal model's {name} {base_score} does not clear chance {chance:.0%}: nothing to remove"
        return [
            v.Verdict(claim, "Fig. 3", v.NOT_TESTABLE, reason, headline=headline(d))
            for claim, d in claims.items()
        ]
    return [
        v.Verdict(claim, "Fig. 3", *decide(result), headline=headline(decide))
        for claim, decide in claims.items()
    ]


def power_note(result: Result) -> str:
    """How many items each removal was scored on, and why."""
    if result.power is None:
        return f"n = {result.minimal[result.probe].n} items per removal, as set."
    return result.power.note("letter questions per removal, and their cloze twins")


def _published_critical(model: str) -> list[int]:
    try:
        return list(paper("layer_removal", "critical_layers", model).integers)
    except KeyError:
        return []


def curves(result: Result) -> pd.DataFrame:
    """One row per benchmark and layer removed (acc, lo, hi, n); the knowledge tasks as the
    released code's mean."""
    rows = pd.DataFrame(
        [
            dict(benchmark=b, removed=l, acc=s.acc, lo=s.lo, hi=s.hi, n=s.n)
            for b, by_layer in result.removed.items()
            for l, s in by_layer.items()
        ]
    )
    knowledge = mean_over_tasks(rows[rows.benchmark.isin(result.knowledge_tasks)], by="removed")
    return pd.concat(
        [rows[~rows.benchmark.isin(result.knowledge_tasks)], knowledge], ignore_index=True
    )


def comparison(result: Result) -> pd.DataFrame:
    name, d = result.probe, result.minimal_layers
    collapsing, unclear = result.collapsing()
    worst = min(result.removed[name], key=lambda l: result.removed[name][l].acc)
    critical = _published_critical(registry.cast("paper", "llama"))
    how = {
        "found": f"found by the layer-pruning rule on {name}",
        "given": "given (minimal_layers)",
        "published": "the published minimal model",
    }[result.source]
    know = [result.knowledge(l).acc for l in result.removed[name]]
    return base.comparison_table(
        [
            (
                "model",
                "Llama-3.1-8B-Instruct",
                "same, lm-eval 0.4.7",
                f"{result.cfg.model} ({result.cfg.profile} profile)",
            ),
            ("weights", "as published", "as published", base.weights(result.provenance)),
            (
                "minimal model",
                f"layers 0-{paper('layer_pruning', 'minimal_model_last_layer').value} "
                f"({paper('layer_pruning', 'minimal_model_last_layer').source})",
                "layers 0-17",
                f"layers 0-{d - 1}, {how}",
            ),
            (
                "retrieval of the minimal model",
                f"MMLU {paper('head_zeroing', 'mmlu_minimal')}",
                "-",
                f"{name}: {result.minimal[name]} (whole model {result.full[name]})",
            ),
            (
                "layers whose removal takes retrieval to chance",
                f"{_layers(critical)} ({paper('layer_removal', 'critical_layers').source})",
                "L16 only (cell 22)",
                f"{_layers(collapsing)} (paired, past the line most of the way to chance); not decided: {_layers(unclear)}",
            ),
            (
                "retrieval without the most harmful layer",
                "near chance (size not stated)",
                "-",
                f"without L{worst}: {result.removed[name][worst]} (chance {result.chance[name]:.0%})",
            ),
            (
                "knowledge when one layer goes",
                "changes little (Fig. 3)",
                "mean acc of 6 tasks",
                f"mean of the tasks {min(know):.1%} to {max(know):.1%} over the {d} removals; minimal model {result.knowledge()}",
            ),
        ]
    )


def rounding_scores(result: Result) -> dict[str, Score]:
    """What the page's near-tie count reads: the probe on the whole and the minimal model."""
    return {
        f"{result.probe}, whole model": result.full[result.probe],
        f"{result.probe}, minimal model": result.minimal[result.probe],
    }


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, {result.cfg.model} cut to layers 0-{result.minimal_layers - 1}"


def figure(result: Result):
    """Fig. 3's panel for this run: every retrieval benchmark and the knowledge mean against
    the layer removed, the minimal model's probe accuracy and chance as lines."""
    from .. import plots

    name = result.probe
    table = curves(result)
    chance = {b: result.chance[b] for b in result.retrieval}
    ax = plots.accuracy_curves(
        table,
        "removed",
        "benchmark",
        chance=chance,
        title=f"{result.cfg.model}, layers 0-{result.minimal_layers - 1}: one layer removed",
        xlabel="layer removed from the minimal model",
    )
    ax.axhline(
        100 * result.minimal[name].acc,
        color="0.3",
        lw=1,
        ls="--",
        label=f"{name.split(' (')[0]}, minimal model ({result.minimal[name].acc:.0%})",
    )
    plots.legend_below(ax)
    return ax.figure
