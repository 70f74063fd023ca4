"""The head screen: the first half of the head-zeroing protocol, which masking reads too.

The prompts are split in two, disjoint (`prompts`): the screen's and the check's. The minimal
model is the published one, else the one the layer-pruning page names (`minimal.task_depths`,
`minimal.minimal_depth`: that chapter's walk of this task, at this seed). On the screen's prompts
the heads are ranked (the attribution estimate for every head, then the layers it points to, or
the paper's heads' layers, swept exactly: `rank`), and the Gather and Aggregate heads are named
among the ranking's candidates (`roles.find_roles`). Head zeroing then zeroes them on the check's
prompts; masking masks them there, in the same minimal model, with the same roles, through the
same results stores (one role assignment for both pages).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .. import benchmarks as bm
from .. import registry
from .. import heads as hd
from ..reference import paper_heads
from ..engine import SweepEngine
from ..errors import ConfigError
from ..heads import Head
from ..screen import attribution, gradient_batch_tokens
from ..stats import Score
from ..sweep import sweep
from . import base, minimal, shared
from .roles import Roles, check_pair, check_roles_of, find_roles

SWEEP_ALL = 64  # a minimal model with at most this many heads is swept whole
MAX_SWEPT = 1024  # an exact sweep covers at most this many heads (Falcon-Mamba has 8192 one-channel heads a layer)


# --- the config --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScreenConfig(base.Config):
    """The head-zeroing chapter's settings (its `Config`): the screen's, and its check's sizes."""

    model: str = base.model("attention", "ssm")
    task: str = base.one_of("kv", "mmlu")
    layers_kept: int | None = base.count(optional=True)  # None: the published minimal model, else found on the screen
    n_screen: int | None = base.count(optional=True)  # MMLU: None = half the test set
    n_check: int | None = base.count(optional=True)  # MMLU: None = the other half
    n_knowledge: int | None = base.count(optional=True)  # knowledge items per task (None: all)
    kv_pairs: int = base.count()
    kv_query: str = base.one_of("paper", "repeat")
    top: int = base.count()
    screen_alpha: float = base.number(0, 1)
    sweep_layers: tuple[int, ...] | None = base.layers(optional=True)  # None: the paper's heads' layers, else the screen's
    gather: tuple[Head, ...] | None = base.heads(optional=True)  # None: the paper's, or found by behaviour
    aggregate: tuple[Head, ...] | None = base.heads(optional=True)
    n_controls: int = base.count()
    seed: int = base.seed()

    chapter = "head_zeroing"
    smoke_sizes = dict(n_screen=shared.SMOKE["n"], top=1, n_check=4, n_controls=1, n_knowledge=4)

    @classmethod
    def defaults(cls, profile):
        # The screen's settings are the shared KV ranking's, so that on KV the ranking is computed once for the book.
        s = shared.RANKING[profile]
        common = dict(kv_pairs=s["pairs"], kv_query=s["query"], sweep_layers=None,
                      gather=None, aggregate=None, n_controls=5, seed=s["seed"], layers_kept=None)
        if profile == "cpu":
            # A 1.5B model on 2 CPU cores: the screen's gradient in one pass (alpha = 1), the found minimal
            # model's last two layers swept exactly (see `screen`); sizes that fit the book's 15 minutes a chapter
            # (seed 0, alone on 2 cores, cold: 11:04, of which layer pruning's walk of the letters 2:16, which the
            # book has stored by then, the screen 4:39, the roles 0:42, the check's 12 conditions on 150
            # questions and 150 facts 3:18).
            return dict(model=registry.cast(profile, "letters"), task="mmlu", n_screen=100, n_check=150, n_knowledge=150, top=2,
                        screen_alpha=1.0, **common)
        # MMLU, split in two; on a 16 GB GPU the 3B model's screen takes 500 questions.
        return dict(model=registry.cast(profile, "letters"), task="mmlu", n_screen=None if profile == "paper" else 500, n_check=None,
                    n_knowledge=500, top=s["top"], screen_alpha=s["alpha"], **common)

    def __post_init__(self):
        super().__post_init__()
        check_pair(self.gather, self.aggregate)
        if self.task == "kv" and (self.n_screen is None or self.n_check is None):
            raise ConfigError("task='kv' needs n_screen and n_check as numbers of KV prompts, e.g. 200 and 1000 "
                              "(None means half of MMLU)")
        # Against the model, from its config: before the screen runs.
        n_layers = base.shape(self.model).n_layers
        if self.layers_kept is not None and self.layers_kept > n_layers:
            raise ConfigError(f"layers_kept must be at most {n_layers} for {self.model}, got {self.layers_kept}")
        kept = self.layers_kept or minimal.published_minimal(self.model) or n_layers
        base.check_layers_of(self.model, "sweep_layers", self.sweep_layers, below=kept)
        check_roles_of(self.model, self.gather, self.aggregate, below=kept)
        if self.task == "kv":
            base.check_kv_sizes(self.model, "kv_pairs", [self.kv_pairs])


def prompts(cfg: ScreenConfig, loaded) -> tuple[bm.Benchmark, bm.Benchmark]:
    """The screen's prompts and the check's, disjoint: KV dictionaries of two seeds, or MMLU's
    test set shuffled with `seed` and cut in two (the screen's part first)."""
    if cfg.task == "kv":
        make = lambda n, seed: bm.kv(cfg.model, loaded.tokenizer, cfg.kv_pairs, n, seed, cfg.kv_query)
        return make(cfg.n_screen, cfg.seed), make(cfg.n_check, cfg.seed + 1)
    every = bm.letter_mcq(cfg.model, loaded.tokenizer, cfg.profile, None, cfg.seed)
    n_screen = cfg.n_screen or len(every) // 2
    n_check = cfg.n_check or len(every) - n_screen
    if n_screen + n_check > len(every):
        raise ConfigError(f"n_screen + n_check must be at most the {len(every)} MMLU questions, got {n_screen + n_check}")
    shuffle = f"mmlu-split-{cfg.seed}"
    return bm.part(every, 0, n_screen, shuffle), bm.part(every, n_screen, n_screen + n_check, shuffle)


def rank(cfg: ScreenConfig, loaded, screen: bm.Benchmark, layers: list[int], sweep_layers: list[int] | None) -> tuple[Score, pd.DataFrame]:
    """The screen's ranking on its prompts: the shared KV ranking where this is the same
    computation, else the screen here, through this chapter's store."""
    settings = shared.ranking_settings(cfg.profile, cfg.smoke)
    mine = dict(pairs=cfg.kv_pairs, n=cfg.n_screen, query=cfg.kv_query, form="released", top=cfg.top,
                alpha=cfg.screen_alpha, seed=cfg.seed)  # `prompts` draws the released form (bm.kv's default)
    if cfg.task == "kv" and len(layers) == loaded.adapter.n_layers and not sweep_layers and mine == settings:
        ranking = shared.kv_ranking(loaded, cfg.profile, cfg.smoke)
        return ranking.clean, ranking.table
    store = base.open_store(cfg.chapter, cfg.profile, "screen", [loaded])
    cell = dict(model=cfg.model, items=screen.spec, layers=len(layers), sweep_layers=sweep_layers, top=cfg.top,
                alpha=cfg.screen_alpha)
    row = sweep(store, [cell], measure_screen, desc="screen")[0]
    return Score.from_json(row["clean"]), pd.DataFrame(row["table"])


def measure_screen(cell: dict) -> dict:
    """The screen on its prompts (the cell's items) in the model's first `layers` layers (a
    measurement, `runner`): the attribution estimate of every head at `alpha`, then the layers
    `sweep_layers` (None: the `top` heads' layers) swept exactly; the accuracy with no head
    zeroed and the ranking table's records."""
    loaded = base.model_for(cell["model"])
    items = bm.from_spec(cell["items"], loaded.tokenizer).items
    layers = list(range(cell["layers"]))
    engine = SweepEngine(loaded, loaded.tokenizer, items, batch_tokens=gradient_batch_tokens(loaded.model))
    estimate = attribution(engine, layers, cell["alpha"])
    chosen = cell["sweep_layers"] or hd.layers_to_sweep(estimate, cell["top"])
    if sum(loaded.adapter.n_heads(l) for l in chosen) > MAX_SWEPT:
        chosen = []  # one-channel heads: the screen's estimate stands alone
    exact = engine.head_sweep(layers=chosen, model_layers=layers) if chosen else {}
    return {"clean": engine.score(layers=layers).to_json(), "table": hd.ranking_table(estimate, exact).to_dict("records")}


def screen_candidates(ranking: pd.DataFrame) -> list[Head]:
    """The heads whose roles are measured: the ranking's candidates where two or more layers were
    swept, else every head measured."""
    return hd.candidates(ranking) if len({h.layer for h in hd.measured(ranking)}) >= 2 else hd.measured(ranking)


@dataclass(frozen=True)
class Screen:
    screen: bm.Benchmark  # the screen's prompts
    check: bm.Benchmark  # the check's, disjoint from the screen's
    layers_kept: int  # the minimal model's layers
    depths: dict[int, Score]  # the task by layers kept on the layer-pruning chapter's items, where the minimal model was found
    screen_clean: Score  # no head zeroed, on the screen's prompts
    ranking: pd.DataFrame  # `heads.ranking_table` on the screen's prompts
    roles: Roles

    @property
    def layers(self) -> list[int]:
        return list(range(self.layers_kept))


def screen(cfg: ScreenConfig, loaded) -> Screen:
    """The prompts split, the minimal model, the screen's ranking and the roles of `loaded`."""
    screened, check = prompts(cfg, loaded)
    given = cfg.layers_kept or minimal.published_minimal(cfg.model)
    depths = {} if given else minimal.task_depths(loaded, cfg.profile, cfg.smoke, cfg.seed, cfg.task, cfg.kv_pairs,
                                                  cfg.kv_query)
    kept = given or minimal.minimal_depth(depths)
    check_roles_of(cfg.model, cfg.gather, cfg.aggregate, below=kept)  # the minimal model found may be shallower
    layers = list(range(kept))
    named = paper_heads(cfg.model) if cfg.gather is None else {"G": cfg.gather, "A": cfg.aggregate}
    # Swept exactly: as set; else the paper's heads' layers; else, where the minimal model was found
    # from the data on MMLU, its last two layers (the paper's minimal model ends with its Aggregate layer, and
    # only its last two layers matter for MMLU, Fig. 3); else the layers the screen points to.
    found = [kept - 2, kept - 1] if depths and cfg.task == "mmlu" and kept >= 2 else []
    if found and sum(loaded.adapter.n_heads(l) for l in range(kept)) <= SWEEP_ALL:
        found = list(range(kept))  # a toy: every head is swept exactly, the first layer's too
    sweep_layers = list(cfg.sweep_layers or sorted({h.layer for hs in (named or {}).values() for h in hs}) or found)
    if bad := [l for l in sweep_layers if l >= kept]:
        raise ConfigError(f"sweep_layers {bad} are not in the model's layers 0..{kept - 1}")
    screen_clean, ranking = rank(cfg, loaded, screened, layers, sweep_layers)
    roles = find_roles(loaded, cfg.profile, cfg.smoke, cfg.gather, cfg.aggregate, screened, screen_candidates(ranking),
                       ranking="the letter screen" if cfg.task == "mmlu" else "the KV screen")
    return Screen(screened, check, kept, depths, screen_clean, ranking, roles)

