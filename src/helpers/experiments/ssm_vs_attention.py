"""SSMs gather and aggregate too, with smoother attention (the paper's §4, Figs. 4-5).

The claims: SSMs retrieve through the same Gather-and-Aggregate circuit as Transformers, in a
few heads whose removal breaks retrieval; an SSM head's hidden attention is smoother than a
softmax head's, and SSM retrieval falls faster as the dictionary grows. Three parts, one model at
a time (a paper model is loaded once for all three and dropped before the next):

1. KV accuracy against dictionary size (`benchmarks.kv`: the zoo's token task for a toy model,
   the release's prompt for any other).
2. Which heads carry retrieval: the book's shared KV head ranking (`shared.kv_ranking`), whose
   candidate heads are then zeroed one at a time on held-out prompts (prompts the ranking never
   saw: a head is not picked and tested on the same items). A model with thousands of heads in a
   layer (Falcon-Mamba: 8192 channels) is not ranked; the paper's channel sets stand in.
3. What the candidates read (`segments.head_measures`, the attention-maps chapter's measures),
   their roles by behaviour (`heads.assign_roles`), and the Aggregate head of each SSM against
   the Aggregate head of each Transformer, prompt by prompt: like with like, the same role in
   both models, whatever its layer or rank.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import evaluate, reference, registry, synthetic, zoo
from .. import verdicts as v
from ..attention import attention_maps
from ..engine import SweepEngine
from ..errors import ConfigError, InterventionError
from ..heads import (
    AGGREGATE_MEASURE,
    GATHER_MEASURE,
    LOCAL,
    LOCAL_MEASURE,
    Head,
    assign_roles,
)
from ..heads import measured as exactly_measured
from ..protocol import base, checks, fields, loading, shared, stores
from ..protocol.roles import MAX_CANDIDATES, check_roles_of
from ..protocol.roles import harmful as harmful_heads
from ..reference import paper
from ..segments import Segments, measure_heads
from ..specs import Spec
from ..stats import Z95, Difference, Estimate, Score, difference
from ..sweep import sweep

SWEEP_LIMIT = (
    256  # heads per layer the ranking sweeps exactly; Falcon-Mamba's layers have 8192 channels
)
MARGIN = v.MARGIN  # a loss or difference smaller than this counts as none, as on every page
SHARPNESS = "top segment share"  # from the final position: share of the in-segment mass on its heaviest line


@cache
def kv_values() -> int:
    """Distinct values a paper KV dictionary draws from (the release's 0..99)."""
    return len(paper("kv_retrieval", "value_range").integers)


@dataclass(frozen=True)
class Config(base.Config):
    models: tuple = fields.models("attention", "ssm")
    sizes: tuple = fields.counts()  # dictionary sizes of part 1
    n: int = fields.count()  # prompts per model and size, and held-out prompts of part 2
    n_maps: int = fields.count()  # held-out prompts the attention measures average over
    seed: int = fields.seed()

    chapter = "ssm_vs_attention"
    smoke_sizes = dict(sizes=[2, 4], n=4, n_maps=4)

    @classmethod
    def defaults(cls, profile):
        if profile == "cpu":
            return dict(
                models=list(
                    registry.cast_of(
                        profile, ("llama", "llamba", "falcon-mamba", "llamba-unaligned")
                    )
                ),
                sizes=[2, 4, 8, 16, 24, 32],
                n=300,
                n_maps=100,
                seed=0,
            )
        # the release's Fig. 4 settings, applied to every model
        fig4 = registry.cast("paper", "llama")
        return dict(
            models=registry.cast_of(profile, ("llama", "llamba", "falcon-mamba")),
            sizes=paper("kv_retrieval", "released_dictionary_sizes", fig4).integers,
            n=paper("kv_retrieval", "samples_per_configuration", fig4).integer,
            n_maps=100,
            seed=0,
        )

    def __post_init__(self):
        super().__post_init__()
        for name in self.models:
            # the paper's heads, where it names them, are this model's
            check_roles_of(name, None, None)
            most = synthetic.N_VALUES if registry.spec(name).toy else kv_values()
            if max(self.sizes) > most:
                raise ConfigError(
                    f"sizes: a dictionary of {name} holds at most {most} keys (one distinct value "
                    f"each); got {max(self.sizes)}"
                )


@dataclass(frozen=True)
class ModelRun:
    """One model's three parts."""

    name: str
    mixer: str  # "attention" or "ssm"
    by_size: dict[int, Score]  # part 1: keys -> KV accuracy
    chance: dict[int, float]  # keys -> chance level
    # keys or "held out" -> a digest of the prompts (equal digests: paired items)
    prompts: dict[str, str]
    ranking: pd.DataFrame | None  # the shared ranking's table; None where the model is not ranked
    candidates: tuple[Head, ...]  # the heads measured in parts 2 and 3
    # the paper's G and A heads of this model, where it names them
    paper_sets: dict[str, tuple[Head, ...]]
    # part 2, held-out prompts: "clean", a ranked candidate ("L1H0"), "paper G", "paper A"
    zeroed: dict[str, Score]
    # part 3: `head_measures` per candidate head (a string) and held-out prompt
    measures: pd.DataFrame
    roles: dict[str, Head | None]  # "G", "A" by behaviour among the candidates
    # "G", "A": the head `weighed` for the role, and its (hidden)
    maps: dict[str, tuple[Head, np.ndarray]]
    # attention on the first held-out prompt
    segments: Segments  # the lines of that prompt
    trained_up_to: int | None  # the largest dictionary in the model's training (toys), else None
    ranking_clean: Score | None = None  # no head zeroed, on the ranking's prompts (where ranked)

    @property
    def clean(self) -> Score:
        return self.zeroed["clean"]

    @property
    def tested(self) -> list[str]:
        """What part 2's verdict zeroes: the ranking's most harmful head, or the paper's sets."""
        return (
            [str(self.candidates[0])]
            if self.ranking is not None
            else [f"paper {r}" for r in self.paper_sets]
        )

    @property
    def assigning(self) -> pd.DataFrame:
        """The measures the roles were assigned on (the first half of the held-out prompts)."""
        return halves(self.measures)[0]

    @property
    def testing(self) -> pd.DataFrame:
        """The measures the role verdicts read (the other half: a head is not named and judged
        on the same prompts)."""
        return halves(self.measures)[1]

    def role_values(self, role: str, column: str = SHARPNESS) -> pd.Series:
        """A measure of the role's head, one value per testing prompt (indexed by prompt)."""
        head = self.roles[role]
        rows = self.testing[self.testing["head"] == str(head)]
        return rows.set_index("prompt")[column].dropna()


@dataclass(frozen=True)
class Result:
    cfg: Config
    keys: int  # the dictionary size of parts 2 and 3 (the shared ranking's)
    runs: dict[str, ModelRun]
    provenance: dict

    @property
    def kv_chance(self) -> float:
        return 1 / self.keys

    def of(self, mixer: str) -> list[ModelRun]:
        return [r for r in self.runs.values() if r.mixer == mixer]


# --- running ------------------------------------------------------------------------------------


def digest(items) -> str:
    return hashlib.sha256("\x00".join(it.pairs[0][0] for it in items).encode()).hexdigest()[:12]


def measure_size(cell: dict) -> dict:
    """The model's accuracy on KV prompts of `keys` keys (its n, seed and query; a measurement,
    `runner`)."""
    loaded = loading.model_for(cell["model"])
    items = bm.kv(
        loaded.name, loaded.tokenizer, cell["keys"], cell["n"], cell["seed"], cell["query"]
    ).items
    return evaluate.score(loaded.model, loaded.tokenizer, items).to_json()


def run_model(cfg: Config, loaded, settings: dict) -> ModelRun:
    name, tok, query, keys = loaded.name, loaded.tokenizer, settings["query"], settings["pairs"]
    setting = dict(model=name, n=cfg.n, seed=cfg.seed, query=query)

    # 1. Accuracy against dictionary size.
    # what `measure_size` scores
    sets = {k: bm.kv(name, tok, k, cfg.n, cfg.seed, query) for k in cfg.sizes}
    store = stores.open_store(cfg.chapter, cfg.profile, "by-size", [loaded], measure_size)
    rows = sweep(
        store,
        [dict(setting, keys=k) for k in cfg.sizes],
        measure_size,
        desc=f"{name}: dictionary sizes",
    )
    by_size = {r["keys"]: Score.from_json(r) for r in rows}

    # 2. Heads whose zeroing breaks retrieval, confirmed on held-out prompts.
    paper_sets = reference.paper_heads(name) or {}
    widest = max(loaded.adapter.n_heads(layer) for layer in loaded.adapter.head_layers())
    if widest <= SWEEP_LIMIT:
        kv_ranking = shared.kv_ranking(loaded, cfg.profile, cfg.smoke)
        ranking, ranking_clean = kv_ranking.table, kv_ranking.clean
        # The roles' candidates are the heads whose zeroing hurts, most harmful first (`roles.harmful`,
        # as every chapter names them); where none does, the two most harmful are measured all the same.
        harm_order = harmful_heads(ranking, kv_ranking.clean)[:MAX_CANDIDATES]
        measured = tuple(harm_order or exactly_measured(ranking)[:2])
    elif paper_sets:
        ranking, measured = None, tuple(h for hs in paper_sets.values() for h in hs)
        harm_order, ranking_clean = list(measured), None
    else:
        raise InterventionError(
            f"{name} has {widest} {loaded.adapter.head_kind}s in a layer, more than the "
            f"{SWEEP_LIMIT} the ranking sweeps, and data/reference names none of them"
        )
    kv = shared.held_out_kv(name, tok, max(cfg.n, cfg.n_maps), settings["n"], keys, cfg.seed, query)
    engine = cache(lambda: SweepEngine(loaded, tok, kv.items[: cfg.n]))
    # an unranked model's channels are zeroed as the paper's sets
    singles = measured if ranking is not None else ()
    conditions = {
        **{str(h): (h,) for h in singles},
        **{f"paper {r}": hs for r, hs in paper_sets.items()},
        "clean": (),
    }
    store = stores.open_store(cfg.chapter, cfg.profile, "zeroing", [loaded], run_model)
    cells = {
        c: dict(setting, keys=keys, heads=[str(h) for h in hs]) for c, hs in conditions.items()
    }
    scored: dict[tuple, dict] = {}

    def zeroed_score(cell):
        """Every condition the store lacks in one engine call (`score_each`), then stored one by
        one: the engine puts as many conditions into a forward batch as the batch budget holds,
        so a scan that loops over tokens (Falcon-Mamba's, without kernels) runs its loop once per
        batch, not once per condition (with the CPU's default budget and long prompts, a batch
        may hold one condition: then nothing is shared)."""
        if not scored:
            missing = [c for c in cells.values() if c not in store]
            specs = {tuple(c["heads"]): Spec(zero=c["heads"]) for c in missing}
            scored.update({k: s.to_json() for k, s in engine().score_each(specs).items()})
        return scored.pop(tuple(cell["heads"]))

    rows = sweep(store, cells.values(), zeroed_score, desc=f"{name}: heads zeroed")
    scores = {c: Score.from_json(r) for c, r in zip(cells, rows)}
    zeroed = {"clean": scores["clean"], **{c: scores[c] for c in conditions if c != "clean"}}

    # 3. What the candidates read, and their roles.
    items = kv.items[: cfg.n_maps]
    store = stores.open_store(cfg.chapter, cfg.profile, "measures", [loaded], run_model)

    def measure(cell):
        table = measure_heads(loaded, items, kv.segments, list(measured), average=False)
        return {"rows": table.assign(head=table["head"].map(str)).to_dict("records")}

    cell = dict(setting, n=cfg.n_maps, keys=keys, heads=[str(h) for h in measured])
    measures = pd.DataFrame(
        sweep(store, [cell], measure, desc=f"{name}: attention measures")[0]["rows"]
    )
    assigning = halves(measures)[0]  # roles named on these prompts, judged on the others
    roles = assign_roles(means(assigning), harm_order) if harm_order else {"G": None, "A": None}
    shown = {role: h for role, h in weighed(assigning, roles).items() if h is not None}
    ids = tok(items[0].pairs[0][0], return_tensors="pt").input_ids
    layer_maps = attention_maps(loaded, ids, sorted({h.layer for h in shown.values()}))
    maps = {role: (h, layer_maps[h.layer][0, h.head].numpy()) for role, h in shown.items()}
    return ModelRun(
        name,
        registry.spec(name).mixer,
        by_size,
        {k: s.chance for k, s in sets.items()},
        {**{str(k): digest(s.items) for k, s in sets.items()}, "held out": digest(items)},
        ranking,
        measured,
        paper_sets,
        zeroed,
        measures,
        roles,
        maps,
        kv.segments(items[0]),
        zoo.TRAIN_SIZES["kv"][1] if registry.spec(name).toy else None,
        ranking_clean,
    )


def halves(measures: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-prompt measures cut in two by prompt: the first half assigns the roles, the second
    tests them (disjoint prompts, as head zeroing's screen and check are)."""
    prompts = sorted(measures["prompt"].unique())
    first = set(prompts[: max(1, len(prompts) // 2)])
    inside = measures["prompt"].isin(first)
    return measures[inside], measures[~inside]


def weighed(measures: pd.DataFrame, roles: dict[str, Head | None]) -> dict[str, Head | None]:
    """For each role, the head `assign_roles` picked, or the best one it turned down (None: no
    candidate is eligible, e.g. every one but the A head is a previous-token head)."""
    table = means(measures)
    rest = table.drop(index=[roles["A"]] if roles["A"] else [])
    rest = rest[rest[LOCAL_MEASURE] <= LOCAL]
    return {
        "G": roles["G"] or (None if rest.empty else rest[GATHER_MEASURE].idxmax()),
        "A": roles["A"] or table[AGGREGATE_MEASURE].idxmax(),
    }


def means(measures: pd.DataFrame) -> pd.DataFrame:
    """Per-prompt measures averaged per head, indexed by Head (what `assign_roles` reads)."""
    table = measures.drop(columns="prompt").groupby("head", sort=False).mean()
    table.index = pd.Index([Head.parse(h) for h in table.index], tupleize_cols=False, name="head")
    return table


def run(cfg: Config) -> Result:
    timer = base.Timer()
    settings = shared.ranking_settings(cfg.profile, cfg.smoke)
    runs, revisions, record = {}, {}, None
    checks.check_available(cfg.models)  # every model, before the first one computes
    for name in cfg.models:
        loaded = loading.load(name)
        runs[name] = run_model(cfg, loaded, settings)
        # device, dtype, versions: the first model's; taken after its run, which opened the stores
        record = record or base.record(cfg, [loaded], timer)
        revisions[name] = loaded.revision
        del loaded  # a paper model is dropped before the next one loads
    return Result(
        cfg, settings["pairs"], runs, {**record, "models": revisions, "wall_s": timer.seconds}
    )


# --- statistics ---------------------------------------------------------------------------------


def normal_interval(values) -> tuple[float, float, float]:
    """Mean and normal 95% interval of per-prompt values (n_maps is 100 by default)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()) if len(x) else math.nan, -math.inf, math.inf
    half = Z95 * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def change(small: Difference, large: Difference) -> tuple[float, float, float]:
    """large - small for two independent differences, with the MOVER 95% interval built from
    theirs (Zou and Donner, 2008)."""
    est = large.delta - small.delta
    lo = est - math.hypot(large.delta - large.lo, small.hi - small.delta)
    hi = est + math.hypot(large.hi - large.delta, small.delta - small.lo)
    return est, lo, hi


def pts(x: float) -> str:
    return f"{100 * x:+.1f}"


# --- verdicts -----------------------------------------------------------------------------------


def falls_faster(t: ModelRun, s: ModelRun, small: int, large: int) -> tuple[str, str]:
    """Does the SSM's accuracy lose more than the Transformer's from `small` to `large` keys?
    The SSM-minus-Transformer gap at each size (paired where both read the same prompts), and
    the change of that gap with its interval; judged only where both retrieve at `small` and
    not both are still at ceiling at `large`."""
    for r in (t, s):
        if not r.by_size[small].above(r.chance[small]):
            return v.NOT_TESTABLE, (
                f"{r.name} is at chance with {small} keys ({r.by_size[small]}, chance "
                f"{r.chance[small]:.1%}): it has nothing to lose"
            )
    if all(r.by_size[large].hi >= 1 for r in (t, s)):
        return v.NOT_TESTABLE, (
            f"{t.name} and {s.name} are both at ceiling with {large} keys ({t.by_size[large]}, "
            f"{s.by_size[large]}): neither falls, so no fall can be compared"
        )
    gap = {
        k: difference(t.by_size[k], s.by_size[k], paired=t.prompts[str(k)] == s.prompts[str(k)])
        for k in (small, large)
    }
    est, lo, hi = change(gap[small], gap[large])
    outcome = v.REPRODUCED if hi < 0 else v.NOT_REPRODUCED if lo > -MARGIN else v.INCONCLUSIVE
    beyond = [r.trained_up_to for r in (t, s) if r.trained_up_to and large > r.trained_up_to]
    return outcome, (
        f"{s.name} minus {t.name}: {gap[small]} with {small} keys, {gap[large]} with {large} keys; "
        f"the gap changes by {pts(est)} points [{pts(lo)}, {pts(hi)}]"
        + (
            f" ({large} keys is beyond the {beyond[0]} keys of the toys' training: this also tests "
            "length generalisation)"
            if beyond
            else ""
        )
    )


def bottleneck(r: ModelRun, chance: float) -> tuple[str, str]:
    """Does zeroing one head (Falcon-Mamba: one of the paper's channel sets) take retrieval
    halfway to chance or further, on held-out prompts?"""
    parts = [v.collapses(r.clean, r.zeroed[label], chance) for label in r.tested]
    what = (
        "the ranking's top head"
        if r.ranking is not None
        else "the paper's channel sets (not ranked)"
    )
    return v.every(o for o, _ in parts), f"{r.name}, {what}: " + "; ".join(
        f"{label} zeroed: {e}" for label, (_, e) in zip(r.tested, parts)
    )


def roles_found(r: ModelRun) -> tuple[str, str]:
    """Both roles among the candidates: each role's head shows its behaviour on more than half
    its mass (the `assign_roles` line), with the interval over prompts on that side of it."""
    parts, said = [], []
    for role, column in (("G", GATHER_MEASURE), ("A", AGGREGATE_MEASURE)):
        head = weighed(r.assigning, r.roles)[role]
        if head is None:
            parts.append(v.NOT_REPRODUCED)
            said.append(f"no {role}: every other candidate is a previous-token head")
            continue
        rows = r.testing[r.testing["head"] == str(head)][column].dropna()
        m, lo, hi = normal_interval(rows)
        # judged on the testing prompts; a head the naming prompts turned down cannot be reproduced
        below_line = v.NOT_REPRODUCED if hi < 0.5 else v.INCONCLUSIVE
        parts.append(
            v.REPRODUCED
            if lo > 0.5 and r.roles[role] is not None
            else below_line
            if lo <= 0.5
            else v.INCONCLUSIVE
        )
        said.append(
            f"{role} {head if r.roles[role] else f'none (best {head})'}: {column} {m:.2f} [{lo:.2f}, {hi:.2f}]"
        )
    return v.every(parts), f"{r.name}: " + "; ".join(said) + (
        f" (roles named on {r.assigning.prompt.nunique()} prompts, judged on {r.testing.prompt.nunique()} others)"
    )


def smoother(t: ModelRun, s: ModelRun) -> tuple[str, str]:
    """Is the SSM's Aggregate head's read from the final position spread over more lines than
    the Transformer's (a lower share on its heaviest line), prompt by prompt?"""
    for r in (t, s):
        if r.roles["A"] is None:
            best = weighed(r.assigning, r.roles)["A"]
            return v.NOT_TESTABLE, (
                f"{r.name} has no Aggregate head among its candidates (closest: {best}, whose final "
                f"position puts {means(r.assigning).loc[[best], AGGREGATE_MEASURE].iloc[0]:.2f} of its "
                "in-segment read on line ends)"
            )
    a, b = t.role_values("A"), s.role_values("A")
    if t.prompts["held out"] == s.prompts["held out"]:
        both = a.index.intersection(b.index)
        m, lo, hi = normal_interval(b[both] - a[both])
        how = f"paired over {len(both)} prompts"
    else:
        (ma, la, ha), (mb, lb, hb) = normal_interval(a), normal_interval(b)
        m, lo, hi = (
            mb - ma,
            mb - ma - math.hypot(ha - ma, mb - lb),
            mb - ma + math.hypot(ma - la, hb - mb),
        )
        how = f"unpaired, {len(a)} and {len(b)} prompts"
    outcome = v.REPRODUCED if hi < 0 else v.NOT_REPRODUCED if lo > -MARGIN else v.INCONCLUSIVE
    return outcome, (
        f"share on the heaviest line: {s.name} A {s.roles['A']} {b.mean():.2f}, {t.name} A {t.roles['A']} "
        f"{a.mean():.2f}; difference {m:+.3f} [{lo:+.3f}, {hi:+.3f}] ({how})"
    )


def verdicts(result: Result) -> list[v.Verdict]:
    keys, chance = result.keys, result.kv_chance
    attention, ssms = result.of("attention"), result.of("ssm")
    retrieving = {name for name, r in result.runs.items() if r.clean.above(chance)}
    at_chance = lambda r: (
        v.NOT_TESTABLE,
        f"{r.name} is at chance with {keys} keys ({r.clean}, chance {chance:.1%}): "
        "no retrieval to break or to read",
    )
    out = []

    small, large = min(result.cfg.sizes), max(result.cfg.sizes)
    pairs = (
        [falls_faster(t, s, small, large) for t in attention for s in ssms]
        if small < large
        else [(v.NOT_TESTABLE, f"one dictionary size ({small} keys): no slope to compare")]
    )
    out.append(
        v.Verdict(
            f"SSM retrieval falls faster than the Transformer's from {small} to {large} keys",
            "§4 (the text; Fig. 4 shows Llama-3.1-8B only)",
            combine(pairs),
            join(pairs),
        )
    )

    parts = [
        bottleneck(r, chance) if r.name in retrieving else at_chance(r)
        for r in result.runs.values()
    ]
    out.append(
        v.Verdict(
            "In every model, zeroing one head takes KV retrieval halfway to chance or further",
            "§4",
            combine(parts),
            join(parts),
        )
    )

    parts = [roles_found(r) if r.name in retrieving else at_chance(r) for r in result.runs.values()]
    out.append(
        v.Verdict(
            "Among each model's most harmful heads, one gathers and one aggregates (roles by behaviour)",
            "§4, Fig. 5",
            combine(parts),
            join(parts),
        )
    )

    pairs = [
        smoother(t, s)
        if {t.name, s.name} <= retrieving
        else at_chance(t if t.name not in retrieving else s)
        for t in attention
        for s in ssms
    ]
    out.append(
        v.Verdict(
            "The SSMs' Aggregate head reads the lines more smoothly than the Transformer's",
            "§4, Fig. 5",
            combine(pairs),
            join(pairs),
        )
    )
    return out


def combine(parts: list[tuple[str, str]]) -> str:
    """One outcome from (outcome, evidence) parts, one per model or per Transformer-SSM pair:
    each claim is about every model (every pair), so every part must hold (`verdicts.every`);
    not testable with none."""
    return v.every(o for o, _ in parts)


def join(parts: list[tuple[str, str]]) -> str:
    """The parts' evidence, each once (a Transformer at chance is the reason for every pair)."""
    return (
        " | ".join(dict.fromkeys(f"{o}: {e}" for o, e in parts))
        or "no pair of a Transformer and an SSM in this run"
    )


# --- tables and figures -------------------------------------------------------------------------


def comparison(result: Result) -> pd.DataFrame:
    """The settings, then three rows per model: its accuracy from the smallest to the largest
    dictionary, its heads zeroed on held-out prompts, and its G and A heads by behaviour with
    the A head's sharpness; the paper's side names the paper's heads where it has the model's."""
    fig4 = registry.cast("paper", "llama")
    cfg = result.cfg
    small, large = min(cfg.sizes), max(cfg.sizes)
    n_cfg, samples = (
        paper("kv_retrieval", "n_configurations", fig4),
        paper("kv_retrieval", "samples_per_configuration", fig4),
    )
    released = paper("kv_retrieval", "released_dictionary_sizes", fig4)
    rows = [
        (
            "models",
            "Llama-3.1-8B, Llamba-8B, Falcon-Mamba-7B",
            "Llama-3.1-8B-Instruct, Llamba-8B-untied, falcon-mamba-7b-instruct",
            f"{', '.join(cfg.models)} ({cfg.profile} profile)",
        ),
        (
            "dictionary sizes x prompts",
            f"{n_cfg.value} sizes x {samples.value} ({n_cfg.source})",
            f"{released.value.replace(';', ', ')} x {samples.value} ({released.source.split(', ')[-1]}; fails as released)",
            f"{', '.join(map(str, cfg.sizes))} x {cfg.n}; heads zeroed on {cfg.n} held-out prompts of {result.keys} keys",
        ),
    ]
    for r in result.runs.values():
        named = {
            role: paper("head_zeroing", q, r.name)
            for role, q in (("G", "gather_head"), ("A", "aggregate_head"))
            if role in r.paper_sets
        }
        heads = ", ".join(f"{role} {ref.value.replace(';', ', ')}" for role, ref in named.items())
        source = (
            f" ({next(iter(named.values())).source.split(', ')[-1]}; C: channel)" if named else ""
        )
        shown = dict.fromkeys(r.tested + [f"paper {role}" for role in r.paper_sets])
        rows += [
            (
                f"{r.name}: KV accuracy, {small} -> {large} keys",
                "falls faster than a Transformer's (§4; Fig. 4 is Llama only)"
                if r.mixer == "ssm"
                else "holds better than an SSM's (§4; Fig. 4 is Llama only)",
                "-",
                f"{r.by_size[small].brief} -> {r.by_size[large].brief}",
            ),
            (
                f"{r.name}: heads zeroed",
                f"{heads}: each breaks retrieval{source}"
                if named
                else "a G or an A head breaks retrieval (§4)",
                "the same heads" if named else "-",
                f"clean {r.clean.brief}; "
                + "; ".join(f"{label} zeroed {r.zeroed[label].brief}" for label in shown)
                + f"; n={r.clean.n}",
            ),
            (
                f"{r.name}: G and A heads by behaviour",
                "G gathers, A aggregates; SSM maps smoother (§4, Fig. 5)",
                "-",
                f"G {r.roles['G'] or 'none'}; A " + (sharpness(r) if r.roles["A"] else "none"),
            ),
        ]
    return base.comparison_table(rows)


def sharpness(r: ModelRun) -> str:
    m, lo, hi = normal_interval(r.role_values("A"))
    return f"{r.roles['A']}, share on its heaviest line {m:.2f} [{lo:.2f}, {hi:.2f}], n={len(r.role_values('A'))} prompts"


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile: {', '.join(result.runs)}"


def accuracy_by_size(result: Result) -> pd.DataFrame:
    return pd.DataFrame(
        [
            dict(model=r.name, keys=k, acc=s.acc, lo=s.lo, hi=s.hi, n=s.n)
            for r in result.runs.values()
            for k, s in sorted(r.by_size.items())
        ]
    )


def accuracy_table(result: Result) -> pd.DataFrame:
    """KV accuracy with its 95% interval, one row per dictionary size, one column per model."""
    t = accuracy_by_size(result)
    t["cell"] = [Estimate(a, lo, hi, percent=True) for a, lo, hi in zip(t.acc, t.lo, t.hi)]
    table = t.pivot(index="keys", columns="model", values="cell")[list(result.runs)]
    return table.rename_axis(columns=None).reset_index()


def figure_by_size(result: Result):
    """Fig. 4 for this run: KV accuracy against dictionary size, one line per model (bands: 95%
    intervals), chance dotted, the toys' longest training dictionary dashed."""
    from .. import plots

    ax = plots.accuracy_curves(
        accuracy_by_size(result),
        "keys",
        "model",
        title="KV retrieval against dictionary size",
        xlabel="keys in the dictionary",
    )
    sizes = sorted(result.cfg.sizes)
    ax.plot(
        sizes,
        [100 / k for k in sizes],
        ls=":",
        lw=1.2,
        color="0.35",
        label="chance (one over the keys)",
    )
    for longest in sorted(
        {
            r.trained_up_to
            for r in result.runs.values()
            if r.trained_up_to and r.trained_up_to < sizes[-1]
        }
    ):
        ax.axvline(
            longest,
            color="0.3",
            ls="--",
            lw=1,
            label=f"longest dictionary in the toys' training ({longest})",
        )
    plots.legend_below(ax, ncols=2)
    return ax.figure


def figure_heads(result: Result):
    """Accuracy with each head zeroed alone, one heatmap per ranked model (the layers the
    ranking swept exactly; the shared ranking's prompts)."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    ranked = [r for r in result.runs.values() if r.ranking is not None]
    tables = {
        r.name: r.ranking.pivot(index="layer", columns="head", values="acc").dropna(how="all")
        for r in ranked
    }
    cols = 2 if all(t.shape[1] <= 8 for t in tables.values()) and len(tables) > 1 else 1
    rows = max(1, math.ceil(len(tables) / cols))
    tall = max([t.shape[0] for t in tables.values()], default=1)
    fig, axes = plt.subplots(
        rows, cols, figsize=(plots.WIDTH, rows * (1.4 + 0.35 * tall)), squeeze=False
    )
    for ax, r in zip(axes.flat, ranked):
        # from chance to the clean accuracy on the ranking's prompts, never the cells' own range
        # one of the dictionary's values
        chance = 1 / shared.ranking_settings(result.cfg.profile, result.cfg.smoke)["pairs"]
        plots.head_heatmap(
            tables[r.name],
            r.name,
            "accuracy: chance to clean",
            ax=ax,
            limits=(chance, r.ranking_clean.acc if r.ranking_clean else 1.0),
        )
    for ax in list(axes.flat)[len(ranked) :]:
        ax.axis("off")
    if not ranked:
        axes.flat[0].text(0.5, 0.5, "no model was ranked", ha="center", va="center")
    fig.tight_layout()
    return fig


def figure_maps(result: Result, max_tokens: int = 48):
    """Each model's G and A heads on the first held-out prompt: attention (SSMs: |hidden
    attention|), each row scaled to its maximum, over the prompt's last `max_tokens` tokens;
    grey lines end each dictionary line, the red bar marks the answer's line."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    runs = list(result.runs.values())
    fig, axes = plt.subplots(len(runs), 2, figsize=(plots.WIDTH, 2.9 * len(runs)), squeeze=False)
    for row, r in zip(axes, runs):
        seg = r.segments
        start = max(0, len(seg) - max_tokens)
        for ax, role in zip(row, ("G", "A")):
            ax.set_xticks([]), ax.set_yticks([]), ax.grid(False)
            if role not in r.maps:
                ax.text(
                    0.5,
                    0.5,
                    "no eligible candidate",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
                ax.set_title(f"{r.name}: {role}", fontsize=10)
                continue
            head, a = r.maps[role]
            a = np.abs(a[start:, start:])
            ax.imshow(
                a / (a.max(axis=1, keepdims=True) + 1e-12),
                cmap="Blues",
                aspect="auto",
                interpolation="nearest",
            )
            for e in seg.ends:
                if e >= start:
                    ax.axhline(e - start + 0.5, color="0.6", lw=0.5)
                    ax.axvline(e - start + 0.5, color="0.6", lw=0.5)
            answer = [t - start for t in range(start, len(seg)) if seg.segment[t] == seg.target]
            if answer:
                ax.plot(
                    [answer[0] - 0.5, answer[-1] + 0.5],
                    [len(seg) - start - 0.5] * 2,
                    color="tab:red",
                    lw=4,
                    solid_capstyle="butt",
                    clip_on=False,
                )
            ax.set_title(
                f"{r.name}: {role} {head}"
                if head == r.roles[role]
                else f"{r.name}: {head}, not {role}",
                fontsize=10,
            )
    for ax in axes[-1]:
        ax.set_xlabel("key position (read)")
    for row in axes:
        row[0].set_ylabel("query position")
    fig.tight_layout()
    return fig


def figure_sharpness(result: Result):
    """Fig. 5's comparison as numbers: for each model's Aggregate head, the share of the final
    position's in-segment (hidden) attention on its heaviest line, one dot per held-out prompt,
    with the mean and its 95% interval; 1 is one line, one over the keys is uniform. Models at
    chance are grey: they have a head that reads line ends, but no retrieval to compare."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    runs = list(result.runs.values())
    fig, ax = plt.subplots(figsize=(plots.WIDTH, 3.8))
    rng = np.random.default_rng(0)  # horizontal jitter of the dots only
    label = "mean, 95% interval"
    for x, r in enumerate(runs):
        if r.roles["A"] is None:
            ax.text(
                x, 0.5, "no A head", ha="center", va="center", fontsize=plots.MIN_FONT, color="0.3"
            )
            continue
        values = r.role_values("A")
        colour = (
            "0.6"
            if not r.clean.above(result.kv_chance)
            else "tab:blue"
            if r.mixer == "attention"
            else "tab:orange"
        )
        ax.scatter(x + rng.uniform(-0.18, 0.18, len(values)), values, s=9, alpha=0.45, color=colour)
        m, lo, hi = normal_interval(values)
        ax.errorbar(
            x, m, yerr=[[m - lo], [hi - m]], fmt="D", color="black", ms=5, capsize=4, label=label
        )
        label = None
    ax.axhline(
        result.kv_chance,
        ls=":",
        lw=1.2,
        color="0.35",
        label=f"uniform over the {result.keys} lines",
    )
    ax.set_xlim(-0.5, len(runs) - 0.5)
    ax.set_xticks(
        range(len(runs)),
        [
            f"{r.name}\nA {r.roles['A'] or '-'}"
            + ("" if r.clean.above(result.kv_chance) else "\n(at chance)")
            for r in runs
        ],
    )
    ax.set(
        ylim=(0, 1.05),
        ylabel="share on the heaviest line",
        title="Aggregate heads: how sharply the final position reads",
    )
    plots.legend_below(ax, ncols=2)
    return fig
