"""Heads removed three ways (zero, mean, resample) and many at once (the top k against random k):
the head sets, the resample donors, the two measurements, and their verdicts and tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ... import benchmarks as bm
from ... import registry
from ... import verdicts as v
from ...engine import SweepEngine
from ...errors import InterventionError
from ...heads import Head
from ...interventions import site_width
from ...packing import encode_pair
from ...protocol import checks, loading, shared
from ...reference import paper
from ...specs import Spec
from ...stats import Score, difference, paired
from ...tasks import Item

if TYPE_CHECKING:  # the chapter's config and result; the chapter imports this module
    from . import Config, Result

KINDS = ("zero", "mean", "resample")
# the >95%-after-30-heads claim is about this model's MMLU
CLAIM_MODEL = registry.cast("paper", "llamba")
POOL_GROWTH = 20  # resample donors are looked for among up to this many times n reference prompts


# --- head sets ------------------------------------------------------------------------------------


def ranked(table: pd.DataFrame) -> list[Head]:
    """Every head of a ranking table, the exactly measured ones first (most harmful first), then
    the rest in the screen's order (`heads.ranking_table`'s order)."""
    return [Head(int(l), int(h)) for l, h in zip(table.layer, table["head"])]


def random_sets(
    heads: list[Head], exclude: list[Head], size: int, draws: int, seed: int
) -> list[list[Head]]:
    """`draws` distinct random sets of `size` heads, none of `exclude` (the top heads), the same
    for the same seed; fewer where the model has fewer distinct sets."""
    pool = [h for h in heads if h not in exclude]
    if len(pool) < size:
        return []
    rng = np.random.default_rng([seed, size])
    out: list[list[Head]] = []
    for _ in range(50 * draws):
        pick = sorted(pool[i] for i in rng.choice(len(pool), size, replace=False))
        if pick not in out:
            out.append(pick)
        if len(out) == draws:
            break
    return out


def upwards(specs: dict[str, Spec]) -> dict[str, Spec]:
    """Specs ordered by their lowest layer: the engine's cached residual stream then walks up
    the model once instead of starting again from the embeddings (the scores do not change)."""
    return dict(
        sorted(specs.items(), key=lambda kv: min((h.layer for h in kv[1].replaced), default=0))
    )


def names(heads: list[Head]) -> str:
    return ", ".join(map(str, heads))


def parse(text: str) -> list[Head]:
    return [Head.parse(t.strip()) for t in text.split(",") if t.strip()]


# --- resample donors --------------------------------------------------------------------------------


def context_length(tokenizer, item: Item) -> int:
    return len(encode_pair(tokenizer, *item.pairs[0], item.verbatim)[0])


def layout(tokenizer, item: Item) -> tuple:
    """(context tokens, continuation tokens) of each of an item's pairs: two items of one layout
    pack into rows of the same shape, position for position."""
    return tuple(
        (len(c), len(x)) for c, x in (encode_pair(tokenizer, *p, item.verbatim) for p in item.pairs)
    )


def donors(tokenizer, items: list[Item], draw) -> list[Item]:
    """For each measured item, a donor: the first prompt of `draw(n)` (a reference draw that a
    larger n extends) not yet given to another item, whose context, followed by the measured
    item's own candidates, has the measured item's layout (`layout`: as many tokens in the
    context and in each candidate). Each donor serves once: two rows of one context would be
    packed as one (`packing.pack`), and the layouts would part. The draw grows until every item
    has a donor; none within POOL_GROWTH x n prompts: an error with the fix."""
    lengths = [context_length(tokenizer, it) for it in items]
    shapes = [layout(tokenizer, it) for it in items]
    as_donor = lambda it, d: Item(
        tuple((d.pairs[0][0], cont) for _, cont in it.pairs), it.gold, it.group, it.verbatim
    )
    n = len(items)
    while True:
        pool = draw(n)
        by_length: dict[int, list[Item]] = {}
        for d in pool:
            by_length.setdefault(context_length(tokenizer, d), []).append(d)
        used, out, missing = set(), [], []
        for i, (it, l, shape) in enumerate(zip(items, lengths, shapes)):
            donor = next(
                (
                    d
                    for d in by_length.get(l, [])
                    if d.pairs[0][0] not in used and layout(tokenizer, as_donor(it, d)) == shape
                ),
                None,
            )
            if donor is None:
                missing.append(i)
                continue
            used.add(donor.pairs[0][0])
            out.append(as_donor(it, donor))
        if not missing:
            return out
        if n >= POOL_GROWTH * len(items):
            raise InterventionError(
                f"no unused reference prompt among {len(pool)} drawn has the layout of measured "
                f"prompt(s) {missing[:5]} ({lengths[missing[0]]} context tokens): resample "
                f"ablation needs a donor of each measured prompt's layout; try another "
                f"reference_seed"
            )
        n *= 2


def kind_values(
    kind: str,
    engine: SweepEngine,
    reference: SweepEngine | None,
    donor: SweepEngine | None,
    layers: list[int],
) -> dict:
    """What each kind puts in the removed heads' place, per layer."""
    if kind == "zero":
        return {l: torch.zeros(site_width(engine.adapter, l)) for l in layers}
    if kind == "mean":
        return {l: reference.site_mean(l) for l in layers}
    if not engine.same_layout(donor):
        raise InterventionError(
            "the resample donors' rows do not line up with the measured prompts' rows"
        )
    return {l: donor.site_inputs(l) for l in layers}


# --- the measurements ---------------------------------------------------------------------------


def measured_set(loaded, cfg: Config, task: str) -> bm.Benchmark:
    s = shared.ranking_settings(cfg.profile, cfg.smoke)
    if task == "mmlu":
        return bm.letter_mcq(loaded.name, loaded.tokenizer, cfg.profile, cfg.n_mmlu, cfg.seed)
    return bm.kv(
        loaded.name, loaded.tokenizer, cfg.kv_pairs, cfg.n_kv, cfg.seed, s["query"], s["form"]
    )


def head_count(name: str) -> int:
    """How many heads model `name` has (from its config: nothing loaded)."""
    sizes = checks.shape(name)
    return sum(sizes.n_heads(l) for l in sizes.head_layers())


def skipped_ks(result: Result) -> str:
    """What the redundancy curves leave out: the ks at or above a model's head count (a "top k"
    of every head has no random control to compare with), said per model; "" when none."""
    cfg = result.cfg
    said = []
    for name in (cfg.model, cfg.ssm_model):
        if left := [k for k in cfg.ks if k >= head_count(name)]:
            said.append(f"k = {', '.join(map(str, left))} for {name} ({head_count(name)} heads)")
    return f"Left out, as at least every head of the model: {'; '.join(said)}." if said else ""


def with_controls(
    order: list[Head], ks: list[int], cfg: Config
) -> tuple[dict[str, list[Head]], set[str]]:
    """The ranking's top k heads for each k of `ks` (distinct), and `cfg.n_controls` random sets
    of k of the others (`random_sets`): {name: heads}, and the names that are controls."""
    sets, controls = {f"top {k}": order[:k] for k in ks}, set()
    for k in ks:
        for i, heads in enumerate(random_sets(order, order[:k], k, cfg.n_controls, cfg.seed)):
            sets[f"random {k} #{i + 1}"] = heads
            controls.add(f"random {k} #{i + 1}")
    return sets, controls


def measure_kinds(cell: dict) -> dict:
    """Each set of heads (`sets`: name -> heads as text) removed each way (`KINDS`) on the cell's
    KV items: zeroed, replaced by their mean over `n_reference` prompts of the `reference` draw,
    or resampled from that draw's donors (a measurement, `runner`)."""
    attention = loading.model_for(cell["model"])
    items = bm.from_spec(cell["items"], attention.tokenizer).items
    draw = lambda n: bm.from_spec({**cell["reference"], "n": n}, attention.tokenizer).items
    engine = SweepEngine(attention, attention.tokenizer, items)
    reference = SweepEngine(attention, attention.tokenizer, draw(cell["n_reference"]))
    donor = SweepEngine(attention, attention.tokenizer, donors(attention.tokenizer, items, draw))
    sets = {name: parse(h) for name, h in cell["sets"].items()}
    layers = sorted({h.layer for heads in sets.values() for h in heads})
    out = {"clean": engine.score().to_json()}
    for kind in KINDS:
        specs = upwards({name: Spec().with_heads(kind, heads) for name, heads in sets.items()})
        scores = engine.score_replaced(specs, kind_values(kind, engine, reference, donor, layers))
        out[kind] = {name: sc.to_json() for name, sc in scores.items()}
    return out


def measure_cut(cell: dict) -> dict:
    """Each set of heads (`sets`) zeroed on the cell's items, and none (a measurement, `runner`)."""
    model = loading.model_for(cell["model"])
    engine = SweepEngine(model, model.tokenizer, bm.from_spec(cell["items"], model.tokenizer).items)
    scores = engine.score_each(upwards({n: Spec(zero=parse(h)) for n, h in cell["sets"].items()}))
    return {
        "clean": engine.score().to_json(),
        "scores": {n: sc.to_json() for n, sc in scores.items()},
    }


def registry_toy(name: str) -> bool:
    return registry.spec(name).toy


# --- verdicts -------------------------------------------------------------------------------------


def scores_of(frame: pd.DataFrame, **where) -> list[Score]:
    rows = frame
    for k, val in where.items():
        rows = rows[rows[k] == val]
    return list(rows.score)


def kind_verdicts(result: Result) -> list[v.Verdict]:
    """Per kind: is the largest top-head set a bottleneck (most of the way to chance, and below
    every random set of its size), `verdicts.beats_controls`?"""
    key = result.cfg.model + " (KV)"
    clean, chance = result.clean[key], result.chance[key]
    size = int(result.kinds[~result.kinds.control]["size"].max())
    out = []
    for kind in KINDS:
        top = scores_of(result.kinds, kind=kind, size=size, control=False)[0]
        controls = scores_of(result.kinds, kind=kind, size=size, control=True)
        outcome, evidence = v.beats_controls(clean, top, controls, chance)
        # Zero ablation is the paper's; mean and resample ablation are this book's checks of it.
        out.append(
            v.Verdict(
                f"The ranking's top {size} heads are a KV-retrieval bottleneck under {kind} ablation",
                "§3.4, Table 5" if kind == "zero" else "this book's check of §3.4, Table 5",
                outcome,
                f"{result.cfg.model}: " + evidence,
                v.CLAIM if kind == "zero" else v.CHECK,
            )
        )
    return out


def redundancy_verdicts(result: Result) -> list[v.Verdict]:
    cfg, r = result.cfg, result.redundancy
    first = lambda model, k, control: scores_of(r, model=model, k=k, control=control)
    out = []
    attn_clean, attn_chance = result.clean[cfg.model], result.chance[cfg.model]
    attn_one = first(cfg.model, 1, False)
    broken, evidence = (
        v.beats_controls(attn_clean, attn_one[0], first(cfg.model, 1, True), attn_chance)
        if attn_one
        else (v.NOT_TESTABLE, "no single head ranked")
    )
    out.append(
        v.Verdict(
            f"One head breaks the attention model ({result.tasks[cfg.model]})",
            "§3.4, Table 1",
            broken,
            f"{cfg.model}: " + evidence,
        )
    )
    ssm_clean, ssm_chance = result.clean[cfg.ssm_model], result.chance[cfg.ssm_model]
    ssm_one = first(cfg.ssm_model, 1, False)
    if ssm_one:
        kept, kept_evidence = v.kept(ssm_clean, ssm_one[0], ssm_chance)
        outcome = v.every([broken, kept])
        evidence = f"attention at k=1: {broken}; {cfg.ssm_model} at k=1: {kept_evidence}"
    else:
        outcome, evidence = v.NOT_TESTABLE, f"{cfg.ssm_model}: no single head ranked"
    out.append(
        v.Verdict(
            "The SSM degrades gracefully where attention breaks at one head",
            "a secondary summary of the paper",
            outcome,
            evidence,
        )
    )
    out.append(claim_30(result))
    return out


def claim_30(result: Result) -> v.Verdict:
    """Llamba-8B keeps over 95% of its MMLU after its 30 top heads are removed: `verdicts.kept`
    with a margin of 5% of the clean accuracy; only on that model and MMLU."""
    cfg = result.cfg
    ref = paper("head_zeroing", "mmlu_kept_fraction_30_heads_removed", CLAIM_MODEL)
    claim = f"{CLAIM_MODEL} keeps over {ref.number:.0%} of its MMLU after 30 G&A heads are removed"
    source = ref.source
    if cfg.ssm_model != CLAIM_MODEL or cfg.task != "mmlu":
        return v.Verdict(
            claim,
            source,
            v.NOT_TESTABLE,
            f"the claim is about {CLAIM_MODEL}'s MMLU; this run's SSM is {cfg.ssm_model} on "
            f"{result.tasks[cfg.ssm_model]} (its curve is below)",
        )
    cut = scores_of(result.redundancy, model=CLAIM_MODEL, k=30, control=False)
    if not cut:
        return v.Verdict(claim, source, v.NOT_TESTABLE, "k = 30 is not among this run's ks")
    clean = result.clean[CLAIM_MODEL]
    outcome, evidence = v.kept(
        clean, cut[0], result.chance[CLAIM_MODEL], margin=(1 - ref.number) * clean.acc
    )
    return v.Verdict(claim, source, outcome, evidence)


# --- tables ---------------------------------------------------------------------------------------


def kinds_table(result: Result) -> pd.DataFrame:
    """One row per head set: its accuracy under each kind, and mean and resample against zero
    (paired on the same prompts)."""
    rows = []
    for name, group in result.kinds.groupby("set", sort=False):
        by = dict(zip(group.kind, group.score))
        rows.append(
            {
                "set": name,
                "heads": group.heads.iloc[0],
                **{k: by[k] for k in KINDS},
                "mean - zero": difference(by["zero"], by["mean"]),
                "resample - zero": difference(by["zero"], by["resample"]),
            }
        )
    return pd.DataFrame(rows)


def redundancy_table(result: Result) -> pd.DataFrame:
    rows = []
    for (model, k), group in result.redundancy.groupby(["model", "k"], sort=False):
        top = group[~group.control].score.iloc[0]
        controls = list(group[group.control].score)
        clean = result.clean[model]
        rows.append(
            {
                "model": model,
                "task": result.tasks[model],
                "k": k,
                "top-k removed": top,
                "kept (of clean)": f"{top.acc / clean.acc:.0%}" if clean.acc else "-",
                "random k (worst of draws)": min(controls, key=lambda s: s.acc)
                if controls
                else "-",
                "clean": clean,
            }
        )
    return pd.DataFrame(rows)


def above_clean(result: Result) -> str:
    """The random sets of the redundancy curves that score above the clean model, each with its
    paired difference from clean: a random head can add noise to the answer (zeroing it then
    helps) and a few items can flip by chance, so the note says which of the two the intervals
    allow. "" when no random set scores above clean."""
    found = []
    for row in result.redundancy[result.redundancy.control].itertuples():
        clean = result.clean[row.model]
        if row.score.acc > clean.acc:
            found.append((row.model, row.k, row.score, clean, paired(clean, row.score)))
    if not found:
        return ""
    listed = "; ".join(
        f"{m}, {k} random heads: {s.brief} against {c.brief} clean, {d}" for m, k, s, c, d in found
    )
    helped = [f"{m} (k = {k})" for m, k, s, c, d in found if d.lo > 0]
    verdict = (
        f"zeroing those heads helps beyond chance for {', '.join(helped)} (the interval above 0): heads that "
        "add noise to the answer"
        if helped
        else "every interval holds 0: the items flipped either way, and no set is shown to help"
    )
    return f"Random sets scoring above the clean model, paired on the same prompts: {listed}. Read: {verdict}."
