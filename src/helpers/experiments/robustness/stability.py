"""Stability of the ablation ranking: its layers swept exactly again on other prompt seeds, the
other query form and with the trailing space, each condition's ranking against the book's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ... import benchmarks as bm
from ... import verdicts as v
from ...engine import SweepEngine
from ...heads import Head, measured
from ...protocol import loading, shared, stores
from ...stats import Estimate, Score
from ...sweep import sweep
from .agreement import BOOTSTRAP, CHECK_SOURCE, base_chance, interval, overlap_chance, spearman
from .removal import registry_toy

if TYPE_CHECKING:  # the chapter's config and result; the chapter imports this module
    from . import Config, Result

# What a ranking costs decides the design: the screen (a gradient pass per layer over every
# prompt) took ~60 s per layer of SmolLM2 at n = 100 on this project's busy CPU (30 min a ranking,
# ~7 GB), so 12 screened rankings do not fit the chapter's budget. Each condition instead sweeps
# exactly the layers the book's ranking swept (the screen's layers, `shared.kv_ranking`), on as
# many prompts as the ranking, through the ranking's own cells (`shared.swept_layers`): the
# reference condition is the book's ranking itself, read from the store, and whether another
# screen would have pointed elsewhere is not tested (the page says so).


@dataclass(frozen=True)
class Stability:
    # one row per ranking: seed, query, form, n, clean, readable, why, top (names)
    conditions: pd.DataFrame
    # each condition against the reference (the first): rho, lo, hi, overlap (lo, hi), chance
    pairs: pd.DataFrame
    in_every_top: list  # heads in the top k of every readable ranking
    k: int
    layers: list  # the layers swept exactly


def stability_conditions(cfg: Config, toy: bool) -> list[tuple[int, str, str]]:
    """(seed, query, form) of each ranking: the ranking's seed and the next ones x the two query
    forms x the trailing space off ("released": the value right after the query) and on
    ("trailing"); the ranking's own seed, query and form first (the reference: the book's ranking). "one-factor" (the CPU profile's
    default: each exact ranking of SmolLM2's screened layers costs minutes on a 2-core CPU) varies
    one factor at a time from the reference: the other seeds, then the other query, then the other
    form (4 rankings for 2 seeds, 3 of them measured, where the factorial needs 8).
    `stability_queries` = 1 ranks the profile's query form only. A toy's prompt has no query forms:
    seeds only, at least two (something to compare)."""
    s = shared.RANKING[cfg.profile]
    queries = ([s["query"]] + [q for q in ("repeat", "paper") if q != s["query"]])[
        : cfg.stability_queries
    ]
    forms = [s["form"]] + [f for f in ("released", "trailing") if f != s["form"]]
    seeds = cfg.stability_seeds
    if toy:
        queries, forms, seeds = queries[:1], forms[:1], max(2, seeds)
    seeds = [s["seed"] + i for i in range(seeds)]  # the ranking's, then the next ones
    if cfg.stability_design == "one-factor":
        return (
            [(seed, queries[0], forms[0]) for seed in seeds]
            + [(seeds[0], q, forms[0]) for q in queries[1:]]
            + [(seeds[0], queries[0], f) for f in forms[1:]]
        )
    return [(seed, q, f) for seed in seeds for q in queries for f in forms]


def _order(acc: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """Heads (columns) most harmful first: lowest accuracy, ties by lowest gold log-probability."""
    return np.lexsort((margin, acc), axis=-1)


def compare_conditions(a: dict, b: dict, k: int, resamples: int = BOOTSTRAP) -> dict:
    """Two exact rankings of the same heads (`condition_heads` of each condition's own prompts):
    Spearman's rho of the heads' accuracies when zeroed and the overlap of the two top-k sets,
    with percentile-bootstrap intervals (each condition's prompts resampled on their own), and
    what random orders would share (mean and 97.5% point)."""
    heads = sorted(a)
    stats = []
    for side, seed in ((a, 1), (b, 2)):
        correct = np.array([side[h]["correct"] for h in heads], dtype=float)  # [heads, prompts]
        margin = np.array([side[h]["margin"] for h in heads])
        w = (
            np.random.default_rng(seed)
            .multinomial(
                correct.shape[1], np.full(correct.shape[1], 1 / correct.shape[1]), resamples
            )
            .astype(float)
            / correct.shape[1]
        )
        stats.append((correct.mean(1), margin.mean(1), w @ correct.T, w @ margin.T))
    (acc_a, m_a, boot_a, bm_a), (acc_b, m_b, boot_b, bm_b) = stats
    k = min(k, len(heads))
    overlap = len(set(_order(acc_a, m_a)[:k].tolist()) & set(_order(acc_b, m_b)[:k].tolist()))
    oa, ob = _order(boot_a, bm_a)[:, :k], _order(boot_b, bm_b)[:, :k]
    overlaps = np.array([len(set(x) & set(y)) for x, y in zip(oa.tolist(), ob.tolist())])
    rho = spearman(acc_a, acc_b)
    rhos = np.array([spearman(x, y) for x, y in zip(boot_a, boot_b)])
    mean, line = overlap_chance(len(heads), k)
    r_lo, r_hi = interval(rhos)
    return dict(
        rho=rho,
        lo=r_lo,
        hi=r_hi,
        overlap=overlap,
        overlap_lo=float(np.quantile(overlaps, 0.025)),
        overlap_hi=float(np.quantile(overlaps, 0.975)),
        chance=mean,
        chance_line=line,
        k=k,
        n=len(heads),
    )


def condition_heads(rows: list[dict]) -> dict:
    """`shared.swept_layers`' rows as {head name: {"correct": [bool per prompt], "margin": [...]}}."""
    return {
        str(Head(r["layer"], int(h))): dict(
            correct=Score.from_json(x).correct.tolist(), margin=x["margin"]
        )
        for r in rows
        for h, x in r["heads"].items()
    }


def run_stability(loaded, cfg: Config) -> Stability:
    """The exact ranking of the book's screened layers on every (seed, query, form) condition,
    each against the first (the book's ranking: its seed, query and form)."""
    reference = shared.kv_ranking(loaded, cfg.profile, cfg.smoke)
    layers = sorted({h.layer for h in measured(reference.table)})
    pairs, n = reference.settings["pairs"], reference.settings["n"]
    store = stores.open_store(cfg.chapter, cfg.profile, "stability", [loaded], measure_clean)
    conditions = stability_conditions(cfg, registry_toy(loaded.name))
    prompts = [
        dict(pairs=pairs, n=n, seed=seed, query=query, form=form)
        for seed, query, form in conditions
    ]
    cleans = sweep(
        store,
        [dict(model=loaded.name, **p) for p in prompts],
        measure_clean,
        desc="stability: clean",
    )
    results = [
        condition_heads(
            shared.swept_layers(
                loaded,
                cfg.profile,
                p,
                layers,
                desc=f"stability: seed {p['seed']}, {p['query']}, {p['form']}",
            )
        )
        for p in prompts
    ]
    chance = base_chance(pairs, loaded)
    rows = []
    for (seed, query, form), c, r in zip(conditions, cleans, results):
        clean = Score.from_json(c["clean"])
        accs = {h: float(np.mean(x["correct"])) for h, x in r.items()}
        worst = Score.of(r[min(accs, key=accs.get)]["correct"])
        ok, why = v.ranking_readable(clean, (worst.acc, worst.lo, worst.hi), chance)
        heads = sorted(r)
        order = _order(
            np.array([accs[h] for h in heads]), np.array([np.mean(r[h]["margin"]) for h in heads])
        )
        rows.append(
            dict(
                seed=seed,
                query=query,
                form=form,
                n=n,
                clean=clean,
                readable=ok,
                why=why,
                top=", ".join(heads[i] for i in order[: cfg.overlap_k]),
            )
        )
    table = pd.DataFrame(rows)
    compared = pd.DataFrame(
        [
            dict(
                seed=c[0],
                query=c[1],
                form=c[2],
                readable=bool(table.readable[0] and table.readable[i]),
                **compare_conditions(results[0], results[i], cfg.overlap_k),
            )
            for i, c in enumerate(conditions)
            if i > 0
        ]
    )
    tops = [set(t.split(", ")) for t, ok in zip(table.top, table.readable) if ok]
    every_top = sorted(set.intersection(*tops), key=lambda h: Head.parse(h)) if tops else []
    return Stability(table, compared, every_top, cfg.overlap_k, layers)


def measure_clean(cell: dict) -> dict:
    """KV accuracy with no head zeroed on the prompts of the cell's pairs, n, seed, query and form
    (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    items = bm.kv_of(cell, loaded.tokenizer).items
    return {"clean": SweepEngine(loaded, loaded.tokenizer, items).score().to_json()}


STABLE_CLAIM = "The ranking's top heads are stable across seeds, query forms and the trailing space"


def stability_verdict(s: Stability) -> v.Verdict:
    """Every condition's ranking against the reference's (`verdicts.rankings_agree`, `every`:
    one condition that disagrees fails the claim); conditions whose ranking cannot be read are
    not testable (the model at chance on that query form)."""
    parts, notes = [], []
    for r in s.pairs.itertuples():
        name = f"seed {r.seed}, {r.query}, {r.form}"
        if not r.readable:
            parts.append(v.NOT_TESTABLE)
            notes.append(f"{name}: not readable")
            continue
        outcome, evidence = v.rankings_agree(
            (r.rho, r.lo, r.hi),
            (r.overlap, r.overlap_lo, r.overlap_hi),
            r.chance,
            r.chance_line,
            name,
        )
        parts.append(outcome)
        notes.append(f"{outcome}: {evidence}")
    unread = [
        f"seed {c.seed}, {c.query}, {c.form} ({c.why})"
        for c in s.conditions.itertuples()
        if not c.readable
    ]
    if not s.conditions.readable.iloc[0]:
        return v.Verdict(
            STABLE_CLAIM,
            CHECK_SOURCE,
            v.NOT_TESTABLE,
            f"the reference ranking cannot be read: {unread[0]}",
            v.CHECK,
        )
    outcome = v.every(parts)
    every = ", ".join(s.in_every_top) or "none"
    return v.Verdict(
        STABLE_CLAIM,
        CHECK_SOURCE,
        outcome,
        f"{len(parts)} conditions against seed {s.conditions['seed'].iloc[0]} ({s.conditions['query'].iloc[0]}, "
        f"{s.conditions['form'].iloc[0]}), layers {s.layers}; in every readable top {s.k}: {every}; "
        + "; ".join(notes)
        + (f"; not readable: {'; '.join(unread)}" if unread else ""),
        v.CHECK,
    )


def stability_table(result: Result) -> pd.DataFrame:
    s = result.stability
    rows = []
    for i, c in enumerate(s.conditions.itertuples()):
        row = {
            "seed": c.seed,
            "query": c.query,
            "form": c.form,
            "clean": c.clean,
            f"top {s.k}": c.top,
        }
        if i == 0:
            row |= {"rho [95%]": "reference", "overlap [95%]": "reference"}
        else:
            r = s.pairs.iloc[i - 1]
            # Spearman's rho of a constant is 0/0
            rho = (
                Estimate(r.rho, r.lo, r.hi)
                if r.rho == r.rho
                else "undefined (every head ties in a ranking)"
            )
            row |= {
                "rho [95%]": rho,
                "overlap [95%]": Estimate(r.overlap, r.overlap_lo, r.overlap_hi),
                "overlap by chance": f"{r.chance:.2f}",
            }
        rows.append(row)
    return pd.DataFrame(rows)
