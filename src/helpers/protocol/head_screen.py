"""The head screen: the first half of the head-zeroing protocol, which masking reads too.

1. The minimal model: the published one, else the one the layer-pruning page names by the
   paper's rule (`minimal.task_depths`, `minimal.minimal_depth`: that chapter's walk of this
   task, at this seed).
2. The prompts, split in two, disjoint (`prompts`): the screen's and the check's, the check as
   large as its claims need (`verdicts.plan`, at the walk's accuracy of the minimal model).
3. Where the harm is (`layer_scan`): on the screen's prompts (letters or KV retrieval, and beside
   them the letters' cloze twins or the knowledge tasks), each layer's whole attention zeroed in
   turn. The layers whose zeroing surely lowers the task matter (`LayerScan.that_matter`); the
   most task-specific of them (the task lost beyond knowledge) are swept exactly, beside the
   layers of the paper's heads, and the attribution screen's top heads are zeroed exactly too
   (`rank`).
4. The roles, among the heads whose zeroing hurts on the screen's prompts, most harmful first
   (`roles.find_roles`).

Head zeroing then zeroes them on the check's prompts; masking masks them there, in the same
minimal model, with the same roles, through the same results stores (one role assignment for
both pages). Nothing is picked and tested on the same prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .. import benchmarks as bm
from .. import heads as hd
from .. import registry
from .. import verdicts as v
from ..engine import SweepEngine
from ..errors import ConfigError
from ..heads import Head
from ..reference import paper_heads
from ..screen import attribution, gradient_batch_tokens
from ..specs import Spec
from ..stats import Difference, Score, TaskMean, paired, rank_correlation
from ..sweep import sweep
from . import base, checks, fields, loading, minimal, shared, stores
from .roles import Roles, check_pair, check_roles_of, find_roles

SWEEP_ALL = 64  # a minimal model with at most this many heads is swept whole
CHECK_FLOOR = (
    500  # the CPU profile's check: at least this many questions (more where the claims need more)
)
AGREEMENT_TOP = 5  # the screen's top-k recall is read at this k
MAX_SWEPT = 1024  # an exact sweep covers at most this many heads (Falcon-Mamba has 8192 one-channel heads a layer)


# --- the config --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScreenConfig(base.Config):
    """The head-zeroing chapter's settings (its `Config`): the screen's, and its check's sizes."""

    model: str = fields.model("attention", "ssm")
    task: str = fields.one_of("kv", "mmlu")
    # None: the published minimal model, else found on the screen
    layers_kept: int | None = fields.count(optional=True)
    n_screen: int | None = fields.count(optional=True)  # MMLU: None = half the test set
    n_check: int | None = fields.count(optional=True)  # MMLU: None = the other half
    n_knowledge: int | None = fields.count(optional=True)  # knowledge items per task (None: all)
    kv_pairs: int = fields.count()
    kv_query: str = fields.one_of("paper", "repeat")
    top: int = fields.count()
    screen_alpha: float = fields.number(0, 1)
    # None: where the harm is, the paper's heads' and the screen's
    sweep_layers: tuple[int, ...] | None = fields.layers(optional=True)
    harm_layers: int = fields.count()  # of the layers whose attention matters, how many are swept exactly (most task-specific first)
    # None: the paper's, or found by behaviour
    gather: tuple[Head, ...] | None = fields.heads(optional=True)
    aggregate: tuple[Head, ...] | None = fields.heads(optional=True)
    n_controls: int = fields.count()
    seed: int = fields.seed()

    chapter = "head_zeroing"
    smoke_sizes = dict(
        n_screen=shared.SMOKE["n"], top=1, n_check=4, n_controls=1, n_knowledge=4, harm_layers=1
    )

    @classmethod
    def defaults(cls, profile):
        # The screen's settings are the shared KV ranking's, so that on KV the ranking is computed once for the book.
        s = shared.RANKING[profile]
        common = dict(
            kv_pairs=s["pairs"],
            kv_query=s["query"],
            sweep_layers=None,
            gather=None,
            aggregate=None,
            n_controls=5,
            seed=s["seed"],
            layers_kept=None,
        )
        if profile == "cpu":
            # A 1.5B model on 2 CPU cores: 80 screen questions; the screen's gradient in one pass (alpha = 1); of the
            # layers whose attention matters the three most letter-specific swept exactly, and the screen's top two heads;
            # the check as large as its claims need, at least CHECK_FLOOR questions (n_check None), its knowledge the
            # cloze twins. (At 100 screen questions, alone on 2 cores: the layer scan 6:24, the screen 8:05 with two
            # more layers swept whole, the check 4:30.)
            return dict(
                model=registry.cast(profile, "letters"),
                task="mmlu",
                n_screen=80,
                n_check=None,
                n_knowledge=None,
                top=2,
                harm_layers=3,
                screen_alpha=1.0,
                **common,
            )
        # MMLU, split in two; on a 16 GB GPU the 3B model's screen takes 500 questions.
        return dict(
            model=registry.cast(profile, "letters"),
            task="mmlu",
            n_screen=None if profile == "paper" else 500,
            n_check=None,
            n_knowledge=500,
            top=s["top"],
            harm_layers=8,
            screen_alpha=s["alpha"],
            **common,
        )

    def __post_init__(self):
        super().__post_init__()
        check_pair(self.gather, self.aggregate)
        if self.task == "kv" and (self.n_screen is None or self.n_check is None):
            raise ConfigError(
                "task='kv' needs n_screen and n_check as numbers of KV prompts, e.g. 200 and 1000 "
                "(None means half of MMLU)"
            )
        # Against the model, from its config: before the screen runs.
        n_layers = checks.shape(self.model).n_layers
        if self.layers_kept is not None and self.layers_kept > n_layers:
            raise ConfigError(
                f"layers_kept must be at most {n_layers} for {self.model}, got {self.layers_kept}"
            )
        kept = self.layers_kept or minimal.published_minimal(self.model) or n_layers
        checks.check_layers_of(self.model, "sweep_layers", self.sweep_layers, below=kept)
        check_roles_of(self.model, self.gather, self.aggregate, below=kept)
        if self.task == "kv":
            checks.check_kv_sizes(self.model, "kv_pairs", [self.kv_pairs])
        elif (held := bm.letter_mcq_size(self.model, self.profile)) is not None:
            asked = (self.n_screen or held // 2) + (self.n_check or 0)
            if asked > held:
                raise ConfigError(
                    f"n_screen + n_check must be at most the {held} letter questions of {self.model} on "
                    f"the {self.profile} profile, got {asked} (n_screen None: half of them; n_check None: "
                    f"as many as the claims need of the rest)"
                )


def prompts(
    cfg: ScreenConfig, loaded, clean: float | None = None
) -> tuple[bm.Benchmark, bm.Benchmark, v.Power | None]:
    """The screen's prompts and the check's, disjoint: KV dictionaries of two seeds, or MMLU's
    test set shuffled with `seed` and cut in two (the screen's part first). The check's size,
    where not set: on the CPU profile the n its claims need at the expected clean accuracy
    `clean` (`verdicts.plan`, at least CHECK_FLOOR, at most what the set holds), else the rest
    of MMLU."""
    if cfg.task == "kv":
        make = lambda n, seed: bm.kv(
            cfg.model, loaded.tokenizer, cfg.kv_pairs, n, seed, cfg.kv_query
        )
        return make(cfg.n_screen, cfg.seed), make(cfg.n_check, cfg.seed + 1), None
    every = bm.letter_mcq(cfg.model, loaded.tokenizer, cfg.profile, None, cfg.seed)
    n_screen = cfg.n_screen or len(every) // 2
    power = None
    if cfg.n_check is None and cfg.profile == "cpu":
        chance = every.chance
        power = v.plan(
            chance if clean is None else clean,
            chance,
            min(CHECK_FLOOR, len(every) - n_screen),
            len(every) - n_screen,
        )
    n_check = cfg.n_check or (power.n if power else len(every) - n_screen)
    if n_screen + n_check > len(every):
        raise ConfigError(
            f"n_screen + n_check must be at most the {len(every)} MMLU questions, got {n_screen + n_check}"
        )
    shuffle = f"mmlu-split-{cfg.seed}"
    return (
        bm.part(every, 0, n_screen, shuffle),
        bm.part(every, n_screen, n_screen + n_check, shuffle),
        power,
    )


def check_part(check: bm.Benchmark, n: int, seed: int) -> bm.Benchmark:
    """`n` of the check's prompts drawn with `seed`, for the claims scored on fewer (head zeroing's
    dependent claims, the masking page): drawn, since the letter set keeps its sources' order and
    its first prompts are not a sample of it. A smaller `n` draws a subset of a larger one's."""
    return bm.part(check, 0, n, f"check-part-{seed}")


def rank(
    cfg: ScreenConfig,
    loaded,
    screen: bm.Benchmark,
    layers: list[int],
    sweep_layers: list[int] | None,
    add_top: bool = True,
) -> tuple[Score, pd.DataFrame]:
    """The screen's ranking on its prompts: the shared KV ranking where this is the same
    computation, else the screen here, through this chapter's store (`measure_screen`: the
    layers `sweep_layers` swept exactly, with `add_top` those of the screen's `top` heads too)."""
    settings = shared.ranking_settings(cfg.profile, cfg.smoke)
    # `prompts` draws the released form (bm.kv's default)
    mine = dict(
        pairs=cfg.kv_pairs,
        n=cfg.n_screen,
        query=cfg.kv_query,
        form="released",
        top=cfg.top,
        alpha=cfg.screen_alpha,
        seed=cfg.seed,
    )
    if (
        cfg.task == "kv"
        and len(layers) == loaded.adapter.n_layers
        and not sweep_layers
        and mine == settings
    ):
        ranking = shared.kv_ranking(loaded, cfg.profile, cfg.smoke)
        return ranking.clean, ranking.table
    store = stores.open_store(cfg.chapter, cfg.profile, "screen", [loaded], measure_screen)
    cell = dict(
        model=cfg.model,
        items=screen.spec,
        layers=len(layers),
        sweep_layers=sweep_layers,
        top=cfg.top,
        alpha=cfg.screen_alpha,
        add_top=add_top,
    )
    row = sweep(store, [cell], measure_screen, desc="screen")[0]
    return Score.from_json(row["clean"]), pd.DataFrame(row["table"])


def measure_screen(cell: dict) -> dict:
    """The screen on its prompts (the cell's items) in the model's first `layers` layers (a
    measurement, `runner`): the attribution estimate of every head at `alpha`, then every head of
    the layers `sweep_layers` zeroed exactly and, with `add_top`, the screen's `top` heads too
    (each alone: a whole layer of the bottom of the model costs a full pass per head); the
    accuracy with no head zeroed and the ranking table's records."""
    loaded = loading.model_for(cell["model"])
    items = bm.from_spec(cell["items"], loaded.tokenizer).items
    within = Spec(keep_layers=range(cell["layers"]))
    engine = SweepEngine(
        loaded, loaded.tokenizer, items, batch_tokens=gradient_batch_tokens(loaded.model)
    )
    estimate = attribution(engine, within, cell["alpha"])
    chosen = list(cell["sweep_layers"] or [])
    if sum(loaded.adapter.n_heads(l) for l in chosen) > MAX_SWEPT:
        chosen = []  # one-channel heads: the screen's estimate stands alone
    exact = engine.head_sweep(layers=chosen, within=within) if chosen else {}
    if cell["add_top"]:
        tops = [
            h for h in sorted(estimate, key=estimate.get)[: cell["top"]] if h.layer not in chosen
        ]
        exact |= {
            Head.parse(k): s
            for k, s in engine.score_each({str(h): within.zeroing(h) for h in tops}).items()
        }
    return {
        "clean": engine.score(within).to_json(),
        "table": hd.ranking_table(estimate, exact).to_dict("records"),
    }


def measure_conditions(cell: dict) -> dict:
    """One benchmark (the cell's items) under each of the cell's `specs` ({condition: a spec's
    text}), {condition: score} (a measurement, `runner`): the layer scan's, head zeroing's and
    the atlas's checks."""
    loaded = loading.model_for(cell["model"])
    engine = SweepEngine(
        loaded, loaded.tokenizer, bm.from_spec(cell["items"], loaded.tokenizer).items
    )
    return {name: s.to_json() for name, s in engine.score_each(cell["specs"]).items()}


# --- where the harm is -------------------------------------------------------------------------

NONE = "no head zeroed"


def attention_of(layer: int) -> str:
    return f"L{layer} attention zeroed"


@dataclass(frozen=True)
class LayerScan:
    """Each layer's whole attention (every head) zeroed in turn in the minimal model, on the
    screen's prompts: the task, and beside it knowledge (the cloze twins of the same facts where
    the set has them, else the knowledge tasks)."""

    task: dict[str, Score]  # condition (NONE, `attention_of(l)`) -> score on the screen's prompts
    knowledge: dict[str, dict[str, Score]]  # knowledge task -> condition -> score
    chance: float
    paired_knowledge: bool  # the knowledge items are the task items' cloze twins

    @property
    def layers(self) -> list[int]:
        return [int(c.split()[0][1:]) for c in self.task if c != NONE]

    def loss(self, layer: int) -> Difference:
        """The task's paired change with the layer's attention zeroed (negative: a loss)."""
        return paired(self.task[NONE], self.task[attention_of(layer)])

    def knowledge_loss(self, layer: int) -> Difference | None:
        """Knowledge's paired change (the mean over its tasks, each paired) with the layer's
        attention zeroed; None where no knowledge was scored."""
        if not self.knowledge:
            return None
        means = {
            c: TaskMean.of([t[c] for t in self.knowledge.values()], [0.0] * len(self.knowledge))
            for c in (NONE, attention_of(layer))
        }
        return paired(means[NONE], means[attention_of(layer)])

    def matters(self, layer: int) -> bool:
        """Whether zeroing the layer's attention surely lowers the task (`verdicts.below`)."""
        return v.below(self.task[NONE], self.task[attention_of(layer)])[0] == v.REPRODUCED

    def specific(self, layer: int) -> float:
        """The task's loss beyond knowledge's (points of the task lost minus points of knowledge
        lost): high where the layer's attention serves the letters and not the facts."""
        know = self.knowledge_loss(layer)
        return -self.loss(layer).delta + (know.delta if know is not None else 0.0)

    def breaks_knowledge(self, layer: int) -> bool:
        """Whether zeroing the layer's attention surely lowers knowledge too (its interval below
        zero)."""
        know = self.knowledge_loss(layer)
        return know is not None and know.hi < 0

    def that_matter(self) -> list[int]:
        """The layers whose attention matters, those that keep knowledge first (the paper's
        critical layers lose the task while knowledge stays; a layer that breaks both, such as an
        early one that every later layer reads, is no evidence of a task-specific circuit), each
        group most letter-specific first (`specific`)."""
        return sorted(
            (l for l in self.layers if self.matters(l)),
            key=lambda l: (self.breaks_knowledge(l), -self.specific(l), l),
        )


def layer_scan(cfg: ScreenConfig, loaded, screened: bm.Benchmark, kept: int) -> LayerScan:
    """Each layer's attention zeroed in turn in the first `kept` layers, on the screen's prompts
    and beside them knowledge (`benchmarks.knowledge_of`: the cloze twins where there are),
    through the chapter's results store, one cell per benchmark."""
    knowledge = bm.knowledge_of(
        screened, cfg.profile, min(cfg.n_knowledge or len(screened), len(screened)), cfg.seed
    )
    within = Spec(keep_layers=range(kept))
    specs = {
        NONE: within,
        **{
            attention_of(l): within.zeroing(*(Head(l, h) for h in range(loaded.adapter.n_heads(l))))
            for l in range(kept)
        },
    }
    store = stores.open_store(cfg.chapter, cfg.profile, "layers", [loaded], measure_conditions)
    cells = [
        dict(
            model=cfg.model,
            benchmark=b.name,
            items=b.spec,
            specs={c: str(spec) for c, spec in specs.items()},
        )
        for b in [screened, *knowledge]
    ]
    rows = {
        r["benchmark"]: r
        for r in sweep(store, cells, measure_conditions, desc="each layer's attention zeroed")
    }
    scores = lambda name: {c: Score.from_json(rows[name][c]) for c in specs}
    return LayerScan(
        scores(screened.name),
        {b.name: scores(b.name) for b in knowledge},
        screened.chance,
        bm.twins(screened) is not None,
    )


def agreement(ranking: pd.DataFrame, k: int = AGREEMENT_TOP) -> dict:
    """How far the attribution screen's estimate agrees with the exact sweep on the heads both
    measured: Spearman's rank correlation of estimate and zeroed accuracy, and the top-k recall
    (of the exact sweep's k most harmful heads, how many are among the screen's k lowest
    estimates of the same heads)."""
    exact = ranking.dropna(subset=["acc"])
    rho = rank_correlation(exact.estimate, exact.acc)
    heads = lambda rows: {Head(int(l), int(h)) for l, h in zip(rows.layer, rows["head"])}
    top_exact = heads(exact.sort_values(["acc", "estimate"], kind="stable").head(k))
    top_screen = heads(exact.sort_values("estimate", kind="stable").head(k))
    return dict(rho=rho, recall=len(top_exact & top_screen), k=min(k, len(exact)), n=len(exact))


@dataclass(frozen=True)
class Screen:
    screen: bm.Benchmark  # the screen's prompts
    check: bm.Benchmark  # the check's, disjoint from the screen's
    layers_kept: int  # the minimal model's layers
    # the task by layers kept on the layer-pruning chapter's items, where the minimal model was found
    depths: dict[int, Score]
    screen_clean: Score  # no head zeroed, on the screen's prompts
    ranking: pd.DataFrame  # `heads.ranking_table` on the screen's prompts
    roles: Roles
    scan: LayerScan  # each layer's attention zeroed on the screen's prompts
    swept: tuple[int, ...] = ()  # the layers swept exactly
    power: v.Power | None = None  # how the check's size was chosen (None: set, or the rest of MMLU)

    @property
    def layers(self) -> list[int]:
        return list(range(self.layers_kept))


def screen(cfg: ScreenConfig, loaded) -> Screen:
    """The minimal model, the prompts split, where the harm is, the screen's ranking and the
    roles of `loaded`."""
    given = cfg.layers_kept or minimal.published_minimal(cfg.model)
    depths, chance = (
        ({}, None)
        if given
        else minimal.task_depths(
            loaded, cfg.profile, cfg.smoke, cfg.seed, cfg.task, cfg.kv_pairs, cfg.kv_query
        )
    )
    kept = given or minimal.minimal_depth(depths, chance)
    # the minimal model found may be shallower
    check_roles_of(cfg.model, cfg.gather, cfg.aggregate, below=kept)
    screened, check, power = prompts(cfg, loaded, depths[kept].acc if depths else None)
    layers = list(range(kept))
    named = paper_heads(cfg.model) if cfg.gather is None else {"G": cfg.gather, "A": cfg.aggregate}
    scan = layer_scan(cfg, loaded, screened, kept)
    # Swept exactly: as set; else every head of a toy; else the layers of the paper's heads, the most
    # task-specific of the layers that matter, and (in `measure_screen`) the screen's top heads.
    toy = sum(loaded.adapter.n_heads(l) for l in layers) <= SWEEP_ALL
    harm = scan.that_matter()[: cfg.harm_layers]
    sweep_layers = (
        list(cfg.sweep_layers)
        if cfg.sweep_layers
        else layers
        if toy
        else sorted({h.layer for hs in (named or {}).values() for h in hs} | set(harm))
    )
    if bad := [l for l in sweep_layers if l >= kept]:
        raise ConfigError(f"sweep_layers {bad} are not in the model's layers 0..{kept - 1}")
    screen_clean, ranking = rank(
        cfg, loaded, screened, layers, sweep_layers, add_top=not cfg.sweep_layers
    )
    roles = find_roles(
        loaded,
        cfg.profile,
        cfg.smoke,
        cfg.gather,
        cfg.aggregate,
        screened,
        ranking,
        screen_clean,
        name="the letter screen" if cfg.task == "mmlu" else "the KV screen",
    )
    swept = tuple(sorted({h.layer for h in hd.measured(ranking)}))
    return Screen(screened, check, kept, depths, screen_clean, ranking, roles, scan, swept, power)
