"""What several chapters share, computed once per model and setting: the KV-retrieval head
ranking (head zeroing, KV retrieval, attention maps and masking all start from it; the roles its
top heads play are `roles`), and the prompts held out from the ranking. (Which model each
profile runs is `registry.cast`.)

The ranking's settings live here, once per profile, so that every chapter asks for the same
ranking and the results store computes it once.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from .. import benchmarks as bm
from ..engine import SweepEngine
from ..heads import Head, layers_to_sweep, measured, ranking_table
from ..reference import paper, paper_heads
from ..screen import attribution
from ..stats import Score, rank_correlation
from ..sweep import sweep
from . import loading, stores

# The screen's setting: a layer's gradient taken with its heads at half strength finds heads
# that the clean gradient misses (README, "Fast, exact sweeps"); on the paper profiles the chapters
# sweep their layers exactly anyway, and the midpoint costs one pass per layer on every prompt.
# The form is the released scoring's (the value right after the query, `tasks.KV_FORMS`).
RANKING = {
    "cpu": dict(pairs=8, n=40, query="repeat", form="released", top=10, alpha=0.5, seed=0),
    "paper": dict(pairs=8, n=200, query="paper", form="released", top=10, alpha=1.0, seed=0),
    "paper-3b": dict(pairs=8, n=200, query="paper", form="released", top=10, alpha=0.5, seed=0),
}
SWEEP_WIDEST = (
    256  # a named layer is swept exactly only up to this many heads (Falcon-Mamba: 8192 channels)
)
# At smoke size: short prompts (the rehearsal runs 64-layer SSMs on CPU) and the screen's one pass
# (alpha 1): at 0.5 a pass per layer was most of the CPU smoke book's KV chapter (73 s of SmolLM2's
# 30 layers a form, on 4 prompts); the per-layer screen is tested in tests/test_engine.py.
SMOKE = dict(n=4, top=3, pairs=4, alpha=1.0)


@dataclass(frozen=True)
class Ranking:
    model: str
    settings: dict
    clean: Score  # KV accuracy with no head zeroed, on the ranking's prompts
    table: pd.DataFrame  # `heads.ranking_table`: measured heads first, most harmful first


def ranking_settings(profile: str, smoke: bool) -> dict:
    return {**RANKING[profile], **(SMOKE if smoke else {})}


def paper_layers(loaded) -> list[int]:
    """The layers of the release's heads of this model (none for a model it names none of), those
    narrow enough to sweep exactly: every ranking sweeps them, whatever its screen says, so that a
    verdict on the paper's heads never rests on the screen alone (at alpha = 1 it can rank the
    most harmful head near last)."""
    named = paper_heads(loaded.name) or {}
    layers = sorted({h.layer for hs in named.values() for h in hs})
    return [l for l in layers if loaded.adapter.n_heads(l) <= SWEEP_WIDEST]


def kv_ranking(
    loaded,
    profile: str,
    smoke: bool,
    form: str | None = None,
    seed: int | None = None,
    workers: int | None = None,
) -> Ranking:
    """The model's heads ranked by what zeroing each does to KV retrieval (the screen, then the
    layers it points to and the paper heads' layers swept exactly), through the results store.
    `form`: how the value follows the query (`tasks.KV_FORMS`; None: the profile's); `seed`: which
    dictionaries (None: the profile's, the ranking every chapter shares); `workers`: Ray workers
    for the exact sweep, one cell per layer (None: this process). A layer's heads are zeroed one
    at a time whatever other layers are swept, so the per-layer cells give the numbers of one
    sweep of all the layers (`screen.rank_heads`)."""
    settings = ranking_settings(profile, smoke)
    settings = {
        **settings,
        "form": form or settings["form"],
        "paper_layers": paper_layers(loaded),
        "seed": settings["seed"] if seed is None else seed,
    }
    store = stores.open_store(
        "head_ranking", profile, "kv", [loaded], (measure_screen, measure_layer)
    )
    loading.hold(loaded)  # the measurements below, run here, find this model by its name
    try:  # the layer sweep runs on the screen's prompts: it reuses the screen's engine
        screen = sweep(
            store,
            [dict(model=loaded.name, part="screen", **settings)],
            measure_screen,
            desc="KV head ranking: screen",
            workers=workers,
        )[0]
        estimate = {Head(l, h): e for l, h, e in screen["estimate"]}
        layers = sorted(
            set(layers_to_sweep(estimate, settings["top"])) | set(settings["paper_layers"])
        )
        rows = swept_layers(loaded, profile, {k: settings[k] for k in PROMPTS}, layers, workers)
    finally:
        _engines.clear()  # in this process: the prompts' cached residual stream goes with the ranking
    exact = {
        Head(r["layer"], int(h)): Score.from_json(s) for r in rows for h, s in r["heads"].items()
    }
    return Ranking(
        loaded.name, settings, Score.from_json(screen["clean"]), ranking_table(estimate, exact)
    )


def swept_layers(
    loaded,
    profile: str,
    prompts: dict,
    layers: list[int],
    workers: int | None = None,
    desc: str = "KV head ranking: layers swept",
) -> list[dict]:
    """Every head of `layers` zeroed alone on the KV prompts of `prompts` (`PROMPTS`: pairs, n,
    seed, query, form), one cell per layer of the ranking's store, so that a sweep on the
    ranking's own prompts is the ranking's (robustness's stability reads it there): per layer
    {"layer", "heads": {head index: {"correct", "margin"}}} (`measure_layer`)."""
    store = stores.open_store(
        "head_ranking", profile, "kv", [loaded], (measure_screen, measure_layer)
    )
    loading.hold(loaded)
    try:
        return sweep(
            store,
            [
                dict(model=loaded.name, part="layer", layer=l, **{k: prompts[k] for k in PROMPTS})
                for l in layers
            ],
            measure_layer,
            desc=desc,
            workers=workers,
        )
    finally:
        _engines.clear()  # in this process: the prompts' cached residual stream goes with the sweep


PROMPTS = ("pairs", "n", "seed", "query", "form")  # the settings that choose a ranking's prompts
# one engine per process: the screen's, reused by the layer sweeps
_engines: dict[tuple, SweepEngine] = {}


def _engine(cell: dict) -> SweepEngine:
    """The sweep engine on the ranking's prompts of `cell`, built once per process and model."""
    loaded = loading.model_for(cell["model"])
    key = (id(loaded.model), *(cell[k] for k in PROMPTS))
    if key not in _engines:
        _engines.clear()
        items = bm.kv_of(cell, loaded.tokenizer).items
        _engines[key] = SweepEngine(loaded, loaded.tokenizer, items)
    return _engines[key]


def measure_screen(cell: dict) -> dict:
    """The ranking's first step (a measurement, `runner`): the accuracy with no head zeroed, and
    the attribution screen's estimate for every head, as [layer, head, estimate] rows."""
    engine = _engine(cell)
    estimate = attribution(engine, alpha=cell["alpha"])
    return {
        "clean": engine.score().to_json(),
        "estimate": [[h.layer, h.head, e] for h, e in estimate.items()],
    }


def measure_layer(cell: dict) -> dict:
    """One layer of the ranking's exact sweep (a measurement): each of its heads zeroed alone,
    {head index: its score (`Score.to_json`) and per prompt the gold answer's margin (what breaks
    ties in accuracy, `SweepEngine.margins`)}."""
    engine = _engine(cell)
    lls = engine.head_loglikelihoods(layers=[cell["layer"]])
    return {
        "heads": {
            str(h.head): {
                **engine.score_loglikelihoods(ll).to_json(),
                "margin": engine.margins(torch.as_tensor(ll)).double().numpy().tolist(),
            }
            for h, ll in lls.items()
        }
    }


def agreement(a: pd.DataFrame, b: pd.DataFrame, k: int) -> dict:
    """How far two rankings agree: the overlap of their top `k` measured heads (and what random
    orders of the heads measured in both would share on average, k^2 / n), and Spearman's rank
    correlation of the accuracies of the heads measured exactly in both (`stats.rank_correlation`)."""
    acc = lambda t: {
        Head(int(l), int(h)): x for l, h, x in zip(t.layer, t["head"], t.acc) if x == x
    }
    x, y = acc(a), acc(b)
    both = [h for h in x if h in y]
    rho, lo, hi = rank_correlation([x[h] for h in both], [y[h] for h in both])
    top_a, top_b = set(measured(a)[:k]), set(measured(b)[:k])
    return dict(
        k=k,
        overlap=len(top_a & top_b),
        chance_overlap=k * k / len(both) if both else float("nan"),
        rho=rho,
        lo=lo,
        hi=hi,
        n=len(both),
    )


def held_out_kv(
    model: str,
    tokenizer,
    n: int,
    skip: int,
    pairs: int,
    seed: int,
    query: str,
    form: str = "released",
) -> bm.Benchmark:
    """`n` KV prompts (`bm.kv`'s settings) that a ranking of the first `skip` prompts drawn with
    them did not see: those after its own (a draw of more prompts begins with those of fewer). A
    chapter whose prompts differ from the shared ranking's (`ranking_settings`, its `n`) skips as
    many all the same, so that its prompts do not depend on whether its settings match."""
    return bm.part(bm.kv(model, tokenizer, pairs, skip + n, seed, query, form), skip)


def mmlu(cfg, model: str, tokenizer, n: int | None) -> bm.Benchmark:
    """MMLU questions with the release's number of shots (`cfg`: profile and seed)."""
    return bm.letter_mcq(
        model,
        tokenizer,
        cfg.profile,
        n,
        cfg.seed,
        paper("released_settings", "num_fewshot").integer,
    )
