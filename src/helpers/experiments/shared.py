"""What several chapters share, computed once per model and setting: the KV-retrieval head
ranking (head zeroing, KV retrieval, attention maps and masking all start from it; the roles its
top heads play are `roles`), the profiles' shared model choices, and the prompts held out from
the ranking.

The ranking's settings live here, once per profile, so that every chapter asks for the same
ranking and the results store computes it once.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .. import benchmarks as bm
from ..engine import SweepEngine
from ..heads import Head, measured
from ..reference import paper
from ..screen import rank_heads
from ..stats import Score, rank_correlation
from ..sweep import sweep
from . import base

# The screen's setting: a layer's gradient taken with its heads at half strength finds heads
# that the clean gradient misses (DESIGN.md section 4); on the paper profiles the chapters
# sweep their layers exactly anyway, and the midpoint costs one pass per layer on every prompt.
# The form is the released scoring's (the value right after the query, `tasks.KV_FORMS`).
RANKING = {
    "cpu": dict(pairs=8, n=40, query="repeat", form="released", top=10, alpha=0.5, seed=0),
    "paper": dict(pairs=8, n=200, query="paper", form="released", top=10, alpha=1.0, seed=0),
    "paper-3b": dict(pairs=8, n=200, query="paper", form="released", top=10, alpha=0.5, seed=0),
}
# The CPU profile's model that picks MMLU letters (SmolLM2-135M picks them at chance): every
# chapter whose task is letter selection defaults to it on the CPU profile.
LETTER_MODEL = "qwen2.5-coder-1.5b-instruct"
# The paper profiles' attention model (the paper's Llama, the 3B one on a 16 GB GPU).
PAPER_MODEL = {"paper": "llama-3.1-8b-instruct", "paper-3b": "llama-3.2-3b-instruct"}
SWEEP_WIDEST = 256  # a named layer is swept exactly only up to this many heads (Falcon-Mamba: 8192 channels)
SMOKE = dict(n=4, top=3, pairs=4)  # short prompts: the rehearsal runs 64-layer SSMs on CPU


def paper_heads(model: str) -> dict[str, tuple[Head, ...]] | None:
    """The release's Gather ("G") and Aggregate ("A") heads of `model` (data/reference), None
    where it names none (Falcon-Mamba's are inner channels: heads of one channel)."""
    try:
        return {"G": paper("head_zeroing", "gather_head", model).heads,
                "A": paper("head_zeroing", "aggregate_head", model).heads}
    except KeyError:
        return None


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


def kv_ranking(loaded, profile: str, smoke: bool, form: str | None = None, seed: int | None = None) -> Ranking:
    """The model's heads ranked by what zeroing each does to KV retrieval (the screen, then the
    layers it points to and the paper heads' layers swept exactly), through the results store.
    `form`: how the value follows the query (`tasks.KV_FORMS`; None: the profile's); `seed`: which
    dictionaries (None: the profile's, the ranking every chapter shares)."""
    settings = ranking_settings(profile, smoke)
    settings = {**settings, "form": form or settings["form"], "paper_layers": paper_layers(loaded),
                "seed": settings["seed"] if seed is None else seed}

    def compute(cell):
        items = bm.kv(loaded.name, loaded.tokenizer, settings["pairs"], settings["n"], settings["seed"],
                      settings["query"], settings["form"]).items
        engine = SweepEngine(loaded, loaded.tokenizer, items)
        table = rank_heads(engine, settings["top"], alpha=settings["alpha"], also=settings["paper_layers"])
        return {"clean": engine.score().to_json(), "table": table.to_dict("records")}

    store = base.open_store("head_ranking", profile, "kv", [loaded])
    row = sweep(store, [dict(model=loaded.name, **settings)], compute, desc="KV head ranking")[0]
    return Ranking(loaded.name, settings, Score.from_json(row["clean"]), pd.DataFrame(row["table"]))


def agreement(a: pd.DataFrame, b: pd.DataFrame, k: int) -> dict:
    """How far two rankings agree: the overlap of their top `k` measured heads (and what random
    orders of the heads measured in both would share on average, k^2 / n), and Spearman's rank
    correlation of the accuracies of the heads measured exactly in both (`stats.rank_correlation`)."""
    acc = lambda t: {Head(int(l), int(h)): x for l, h, x in zip(t.layer, t["head"], t.acc) if x == x}
    x, y = acc(a), acc(b)
    both = [h for h in x if h in y]
    rho, lo, hi = rank_correlation([x[h] for h in both], [y[h] for h in both])
    top_a, top_b = set(measured(a)[:k]), set(measured(b)[:k])
    return dict(k=k, overlap=len(top_a & top_b), chance_overlap=k * k / len(both) if both else float("nan"),
                rho=rho, lo=lo, hi=hi, n=len(both))


def held_out_kv(cfg, model: str, tokenizer, n: int) -> bm.Benchmark:
    """`n` KV prompts the shared ranking did not see: those after its own (with the ranking's
    settings the first prompts are the ranking's; with others, skipping them costs nothing).
    `cfg`: a chapter's config with profile, smoke, kv_pairs, seed and kv_query."""
    skip = ranking_settings(cfg.profile, cfg.smoke)["n"]
    kv = bm.kv(model, tokenizer, cfg.kv_pairs, skip + n, cfg.seed, cfg.kv_query)
    return bm.Benchmark(kv.name, kv.role, kv.items[skip:], kv.segments)


def mmlu(cfg, model: str, tokenizer, n: int | None) -> bm.Benchmark:
    """MMLU questions with the release's number of shots (`cfg`: profile and seed)."""
    return bm.letter_mcq(model, tokenizer, cfg.profile, n, cfg.seed, paper("released_settings", "num_fewshot").integer)
