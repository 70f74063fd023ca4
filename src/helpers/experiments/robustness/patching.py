"""Activation patching: each clean prompt beside a corrupted one (the same dictionary queried for
another key, `key_swapped`), one head's clean output put into the corrupted run, and how much of
the clean answer comes back, against the ablation ranking."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ... import benchmarks as bm
from ... import verdicts as v
from ...engine import SweepEngine
from ...errors import InterventionError
from ...heads import Head, measured
from ...protocol import loading, shared, stores
from ...specs import Spec
from ...stats import Estimate, Score
from ...sweep import sweep
from ...tasks import KV_HEADER, Item
from .agreement import BOOTSTRAP, CHECK_SOURCE, base_chance, interval, overlap_chance, spearman
from .removal import POOL_GROWTH, layout, names, parse

if TYPE_CHECKING:  # the chapter's config and result; the chapter imports this module
    from . import Config, Result


def key_swapped(tokenizer, item: Item) -> Item | None:
    """The item's dictionary queried for another of its keys: the first key, in the dictionary's
    order, whose prompt has the item's layout (`layout`: as many tokens in the context and each
    candidate, so that every row and position of the two runs line up), scored on the item's own
    candidates with the item's gold (the clean answer). None where no key of the dictionary fits.
    Works on the release's prompt (either query) and on the zoo's token prompt."""
    ctx = item.pairs[0][0]
    if ctx.startswith(KV_HEADER):
        body, _, query = ctx.rpartition("\n")
        keys = [line.split(":")[0] for line in body[len(KV_HEADER) :].split("\n")]
        target = keys[item.gold]
        if query.startswith(f"{target}:"):  # query "repeat": `key:`
            swap = lambda k: f"{body}\n{k}{query[len(target) :]}"
        elif f"'{target}'" in query:  # query "paper": `The value of the key 'key' is`
            swap = lambda k: body + "\n" + query.replace(f"'{target}'", f"'{k}'", 1)
        else:
            raise InterventionError(
                f"not a KV prompt's query (the key {target!r} is not asked): {query!r}"
            )
    else:  # the zoo's prompt: `<s> k1 k2 : v \\n ... ? k1 k2 :`
        words = ctx.split(" ")
        colons = [i for i, w in enumerate(words) if w == ":"]
        if len(colons) < 2 or words[colons[-1] - 3] != "?":
            raise InterventionError(
                f"not a KV prompt (no `? key :` query at its end): {ctx[-40:]!r}"
            )
        keys = [tuple(words[i - 2 : i]) for i in colons[:-1]]
        target = keys[item.gold]
        swap = lambda k: " ".join(words[: colons[-1] - 2] + list(k) + [":"])
    shape = layout(tokenizer, item)
    for k in keys:
        if k == target:
            continue
        other = Item(
            tuple((swap(k), cont) for _, cont in item.pairs), item.gold, item.group, item.verbatim
        )
        if layout(tokenizer, other) == shape:
            return other
    return None


def patch_prompts(
    loaded, pairs: int, n_patch: int, seed: int, query: str, form: str
) -> tuple[list[Item], list[Item]]:
    """The clean prompts (the first `n_patch` of the draw of `seed` whose dictionary holds a key
    that swaps in with the same layout) and their key-swapped corruptions; the draw grows until
    n_patch have one, up to POOL_GROWTH x n_patch, else an error with the fix."""
    n = n_patch
    while True:
        pool = bm.kv(loaded.name, loaded.tokenizer, pairs, n, seed, query, form).items
        found = [(it, c) for it in pool if (c := key_swapped(loaded.tokenizer, it)) is not None]
        if len(found) >= n_patch:
            found = found[:n_patch]
            return [p[0] for p in found], [p[1] for p in found]
        if n >= POOL_GROWTH * n_patch:
            raise InterventionError(
                f"only {len(found)} of {n} KV prompts of {loaded.name} have a key that swaps in "
                f"with the same tokens' layout; set a smaller n_patch or another seed"
            )
        n *= 2


@dataclass(frozen=True)
class Patching:
    # one row per head: head, recovery, lo, hi, ablation acc (the ranking's), rank of each
    heads: pd.DataFrame
    # per clean prompt: the clean answer's log-probability (log-softmax over the candidates)
    clean: np.ndarray
    corrupted: np.ndarray  # the same in the key-swapped run
    patched: dict  # head name -> per prompt, the same with that head patched from the clean run
    agreement: (
        dict  # rho, lo, hi, overlap, overlap lo / hi, chance overlap and its 95% upper point, k, n
    )
    ranking_clean: Score  # the ablation ranking's clean accuracy (on its own prompts)
    readable: tuple  # `verdicts.ranking_readable` of the ablation ranking: (bool, why)
    clean_acc: Score  # KV accuracy of the clean prompts
    corrupted_acc: Score  # how often the corrupted run still picks the clean answer


def recoveries(
    clean: np.ndarray, corrupted: np.ndarray, patched: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Normalised recovery of each head ([heads]; [resamples, heads] with `weights`, each row how
    often each prompt is drawn): (patched - corrupted) / (clean - corrupted), each a sum over the
    prompts, so that prompts whose corruption barely moves the answer do not divide by ~0.
    0: the head's clean output restores nothing; 1: it restores the clean answer's log-probability."""
    gap, gain = clean - corrupted, patched - corrupted[None, :]  # [prompts], [heads, prompts]
    if weights is None:
        return gain.sum(1) / gap.sum()
    return (weights @ gain.T) / (weights @ gap)[:, None]


def patch_agreement(
    table: pd.DataFrame,
    patched: dict,
    clean: np.ndarray,
    corrupted: np.ndarray,
    k: int,
    resamples: int = BOOTSTRAP,
) -> tuple[pd.DataFrame, dict]:
    """Heads ranked by recovery against the ablation ranking (`table`, `heads.ranking_table`:
    the heads measured exactly, most harmful first): Spearman's rho of recovery and harm (minus
    the accuracy left when zeroed), the overlap of the two top-k sets, and percentile-bootstrap
    intervals of both over the patching prompts (the ablation ranking held fixed)."""
    order = measured(table)
    acc = {Head(int(l), int(h)): a for l, h, a in zip(table.layer, table["head"], table.acc)}
    harm = -np.array([acc[h] for h in order])
    p = np.stack([patched[str(h)] for h in order])
    rec = recoveries(clean, corrupted, p)
    top_ablation = set(range(min(k, len(order))))
    top = lambda r: set(np.argsort(-r, kind="stable")[:k].tolist())
    weights = np.random.default_rng(0).multinomial(
        len(clean), np.full(len(clean), 1 / len(clean)), resamples
    )
    boot = recoveries(clean, corrupted, p, weights.astype(float))
    lo, hi = np.quantile(boot, [0.025, 0.975], axis=0)
    rhos = np.array([spearman(b, harm) for b in boot])
    overlaps = np.array([len(top(b) & top_ablation) for b in boot])
    mean, line = overlap_chance(len(order), min(k, len(order)))
    by_recovery = np.argsort(-rec, kind="stable")
    heads = pd.DataFrame(
        dict(
            head=[str(h) for h in order],
            recovery=rec,
            lo=lo,
            hi=hi,
            **{"acc (zeroed)": [acc[h] for h in order]},
            **{
                "rank (ablation)": np.arange(1, len(order) + 1),
                "rank (patching)": np.argsort(by_recovery) + 1,
            },
        )
    )
    r_lo, r_hi = interval(rhos)
    return heads, dict(
        rho=spearman(rec, harm),
        lo=r_lo,
        hi=r_hi,
        overlap=len(top(rec) & top_ablation),
        overlap_lo=float(np.quantile(overlaps, 0.025)),
        overlap_hi=float(np.quantile(overlaps, 0.975)),
        chance=mean,
        chance_line=line,
        k=min(k, len(order)),
        n=len(order),
        prompts=len(clean),
    )


def run_patching(loaded, cfg: Config) -> Patching:
    """Each head the ablation ranking measured exactly (the screen's layers) patched alone from
    the clean run into the key-swapped run, through the engine (`SweepEngine.patched`: the heads
    of a layer side by side), and ranked by recovery against that ranking."""
    ranking = shared.kv_ranking(loaded, cfg.profile, cfg.smoke)
    heads = measured(ranking.table)
    store = stores.open_store(cfg.chapter, cfg.profile, "patching", [loaded], measure_patching)
    cell = dict(
        model=loaded.name,
        n=cfg.n_patch,
        pairs=cfg.kv_pairs,
        seed=cfg.seed,
        corruption="query key swapped",
        query=ranking.settings["query"],
        form=ranking.settings["form"],
        heads=names(heads),
    )
    row = sweep(store, [cell], measure_patching, desc="activation patching")[0]
    clean, corrupted = np.array(row["clean"]), np.array(row["corrupted"])
    patched = {name: np.array(x) for name, x in row["patched"].items()}
    table, agreement = patch_agreement(ranking.table, patched, clean, corrupted, cfg.overlap_k)
    first = ranking.table.dropna(subset=["acc"]).iloc[0]
    readable = v.ranking_readable(
        ranking.clean,
        (first.acc, first.lo, first.hi),
        base_chance(ranking.settings["pairs"], loaded),
    )
    return Patching(
        table,
        clean,
        corrupted,
        patched,
        agreement,
        ranking.clean,
        readable,
        Score.from_json(row["clean_acc"]),
        Score.from_json(row["corrupted_acc"]),
    )


def measure_patching(cell: dict) -> dict:
    """Each of the cell's heads patched alone from the clean run into the key-swapped run
    (`patch_prompts` of the cell's settings): the gold margins clean, corrupted and patched, and
    the two runs' accuracies (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    items, corrupted = patch_prompts(
        loaded, cell["pairs"], cell["n"], cell["seed"], cell["query"], cell["form"]
    )
    clean_run = SweepEngine(loaded, loaded.tokenizer, items)
    corrupted_run = SweepEngine(loaded, loaded.tokenizer, corrupted)
    gold = lambda engine, flat: engine.margins(torch.as_tensor(flat)).double().numpy().tolist()
    lls = corrupted_run.patched({str(h): Spec(patch=(h,)) for h in parse(cell["heads"])}, clean_run)
    return {
        "clean": gold(clean_run, clean_run.loglikelihoods([Spec()])[0]),
        "clean_acc": clean_run.score().to_json(),
        "corrupted": gold(corrupted_run, corrupted_run.loglikelihoods([Spec()])[0]),
        "corrupted_acc": corrupted_run.score().to_json(),
        "patched": {name: gold(corrupted_run, ll) for name, ll in lls.items()},
    }


# --- verdict and table ----------------------------------------------------------------------------

PATCH_CLAIM = "The heads that carry the answer (activation patching) are the heads whose removal hurts (zeroing)"


def patching_verdict(p: Patching) -> v.Verdict:
    """`verdicts.rankings_agree` on the recovery ranking against the ablation ranking; not
    testable where the ablation ranking cannot be read (`verdicts.ranking_readable`) or the
    corruption does not lower the clean answer's log-probability (nothing to recover)."""
    from ...stats import mean_interval

    ok, why = p.readable
    if not ok:
        return v.Verdict(
            PATCH_CLAIM,
            CHECK_SOURCE,
            v.NOT_TESTABLE,
            f"the ablation ranking cannot be read: {why}",
            v.CHECK,
        )
    gap, lo, hi = mean_interval(p.clean - p.corrupted)
    moved = f"swapping the query key lowers the clean answer's log-probability by {gap:.2f} [{lo:.2f}, {hi:.2f}] nats"
    if not lo > 0:
        return v.Verdict(
            PATCH_CLAIM, CHECK_SOURCE, v.NOT_TESTABLE, f"{moved}: nothing to recover", v.CHECK
        )
    a = p.agreement
    outcome, evidence = v.rankings_agree(
        (a["rho"], a["lo"], a["hi"]),
        (a["overlap"], a["overlap_lo"], a["overlap_hi"]),
        a["chance"],
        a["chance_line"],
        f"recovery against harm, {a['n']} heads, top {a['k']}",
    )
    return v.Verdict(
        PATCH_CLAIM,
        CHECK_SOURCE,
        outcome,
        f"{moved}; {evidence} (n={a['prompts']} prompts)",
        v.CHECK,
    )


def patching_table(result: Result, rows: int = 10) -> pd.DataFrame:
    """The heads with the highest recovery, with their place in both rankings."""
    t = result.patching.heads.sort_values("recovery", ascending=False, kind="stable").head(rows)
    return pd.DataFrame(
        {
            "head": t["head"],
            "recovery [95%]": [Estimate(r, a, b) for r, a, b in zip(t.recovery, t.lo, t.hi)],
            "rank (patching)": t["rank (patching)"],
            "rank (zeroing)": t["rank (ablation)"],
            "KV acc. zeroed": [f"{x:.1%}" for x in t["acc (zeroed)"]],
        }
    )
