"""Synthetic KV retrieval against dictionary size, and the heads ranked by it (the paper's Fig. 4,
App. A.5 and Table 5).

The task is the release's: memorise a dictionary of `word:number` lines, then give one key's
value; every value in the dictionary is a candidate (`tasks.kv_items`, in lm-eval's scoring
convention). Each dictionary size is scored with the model as it is and with its Gather and
its Aggregate head zeroed, all three on the same prompts (side by side in the sweep engine), so
that each size gives a paired comparison.

The heads are ranked with the book's shared KV ranking (`shared.kv_ranking`: the screen, then
an exact sweep of the layers it points to and of the paper heads' layers) in two forms of the
query (`tasks.KV_FORMS`): the released scoring, the value right after the query ("is42"), and the
book's spaced form ("is 42"). The trailing-space form ("is " + "42") is the spaced form's tokens
under Llama-3's tokenizer, so it is compared only where the tokenizer tells them apart. The Gather and Aggregate heads are the paper's where it names them for the model,
else the ranking's candidates that behave as them (`roles.find_roles`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .. import benchmarks as bm
from .. import registry, runner
from .. import verdicts as v
from ..engine import SweepEngine
from ..heads import Head, measured
from ..protocol import base, checks, fields, loading, shared, stores
from ..protocol.roles import ROLE_NAMES, Roles, check_pair, check_roles_of, find_roles, missing_role
from ..reference import paper
from ..specs import Spec
from ..stats import Estimate, Score, difference_in_differences
from ..sweep import sweep
from ..tasks import KV_FORMS, kv_items

TOP = 4  # "the top-ranked heads" of Table 5's claim
CURVES_SEED = (
    10_000  # the size curves' dictionaries: seed CURVES_SEED + seed, never the ranking's (seed)
)


@dataclass(frozen=True)
class Config(base.Config):
    model: str = fields.model("attention", "ssm")
    sizes: tuple[int, ...] = fields.counts()
    n_per_size: int = fields.count()
    kv_query: str = fields.one_of("paper", "repeat")
    # None: the paper's, or found by behaviour
    gather: tuple[Head, ...] | None = fields.heads(optional=True)
    aggregate: tuple[Head, ...] | None = fields.heads(optional=True)
    seed: int = fields.seed()
    # Ray workers for the sweeps (None: this process)
    workers: int | None = fields.count(optional=True, maximum=1024, none_means="in this process")

    chapter = "kv_retrieval"
    smoke_sizes = dict(sizes=[2, 8], n_per_size=3)

    @classmethod
    def defaults(cls, profile):
        if profile == "cpu":
            return dict(
                model=registry.cast(profile, "retrieval"),
                sizes=[2, 4, 8, 16, 32, 48],
                n_per_size=100,
                kv_query="repeat",
                gather=None,
                aggregate=None,
                seed=0,
                workers=None,
            )
        # The release states 55 configurations of 1,000 samples but not their sizes: every size 1..55.
        return dict(
            model=registry.cast(profile, "retrieval"),
            sizes=list(range(1, paper("kv_retrieval", "n_configurations").integer + 1)),
            n_per_size=paper("kv_retrieval", "samples_per_configuration").integer,
            kv_query="paper",
            gather=None,
            aggregate=None,
            seed=0,
            workers=None,
        )

    def __post_init__(self):
        super().__post_init__()
        check_pair(self.gather, self.aggregate)
        checks.check_kv_sizes(self.model, "sizes", self.sizes)
        check_roles_of(self.model, self.gather, self.aggregate)
        # Ray installed and large enough: now, before any model loads
        runner.check_workers_fit(self.workers)


# the rankings compared: the released scoring, and the book's spaced form
FORMS = (
    "released",
    "spaced",
)


@dataclass(frozen=True)
class Result:
    cfg: Config
    # condition ("model", "G removed", "A removed") -> size -> score
    scores: dict[str, dict[int, Score]]
    roles: Roles
    # form (`FORMS`; only "released" for a toy task) -> the shared ranking
    rankings: dict[str, shared.Ranking]
    provenance: dict
    # (form, form) -> same model input
    same_tokens: dict[tuple[str, str], bool] = field(default_factory=dict)

    @property
    def sizes(self) -> list[int]:
        return sorted(self.scores["model"])

    @staticmethod
    def chance(size: int) -> float:
        return 1 / size


def condition(role: str) -> str:
    return f"{role} removed"


def run(cfg: Config) -> Result:
    timer = base.Timer()
    loaded = loading.load(cfg.model)
    toy = registry.spec(cfg.model).toy  # the zoo's token task has no query forms
    rankings = {
        form: shared.kv_ranking(loaded, cfg.profile, cfg.smoke, form, cfg.seed, workers=cfg.workers)
        for form in (FORMS[:1] if toy else FORMS)
    }
    same = {} if toy else same_tokens(loaded.tokenizer, shared.RANKING[cfg.profile]["query"])
    roles = find_roles(loaded, cfg.profile, cfg.smoke, cfg.gather, cfg.aggregate, seed=cfg.seed)
    conditions = size_conditions(heads={r: roles.heads[r] for r in ROLE_NAMES})
    store = stores.open_store(cfg.chapter, cfg.profile, "sizes", [loaded], measure_size)
    heads = {r: [str(h) for h in roles.heads[r]] for r in ROLE_NAMES}
    cells = [
        dict(
            model=cfg.model,
            pairs=k,
            n=cfg.n_per_size,
            seed=CURVES_SEED + cfg.seed,
            query=cfg.kv_query,
            heads=heads,
        )
        for k in cfg.sizes
    ]
    rows = sweep(store, cells, measure_size, desc="dictionary sizes", workers=cfg.workers)
    scores = {c: {r["pairs"]: Score.from_json(r[c]) for r in rows} for c in conditions}
    return Result(cfg, scores, roles, rankings, base.record(cfg, [loaded], timer), same)


def size_conditions(heads: dict[str, list]) -> dict[str, Spec]:
    """The conditions each size is scored in: the model as it is, and each role's heads zeroed."""
    return {"model": Spec(), **{condition(r): Spec(zero=heads[r]) for r in ROLE_NAMES if heads[r]}}


def measure_size(cell: dict) -> dict:
    """One dictionary size (a cell of `run`'s sweep) in every condition, on the same prompts: a
    measurement that travels to a Ray worker (it reads only its cell, and loads the model by name)."""
    loaded = loading.model_for(cell["model"])
    items = bm.kv_of(cell, loaded.tokenizer).items
    engine = SweepEngine(loaded, loaded.tokenizer, items)
    return {
        name: s.to_json() for name, s in engine.score_each(size_conditions(cell["heads"])).items()
    }


def same_tokens(tokenizer, query: str, n: int = 4) -> dict[tuple[str, str], bool]:
    """For each pair of forms, whether they give the model the same input for every candidate
    of `n` prompts (`packing.encode_pair`, as scored): then their rankings are one computation."""
    from ..packing import encode_pair

    def inputs(form):
        return [
            sum(encode_pair(tokenizer, c, x, it.verbatim), [])
            for it in kv_items(8, n, 0, query, form)
            for c, x in it.pairs
        ]

    seen = {form: inputs(form) for form in KV_FORMS}
    return {(a, b): seen[a] == seen[b] for i, a in enumerate(KV_FORMS) for b in KV_FORMS[i + 1 :]}


# --- verdicts ----------------------------------------------------------------------------------


def trend(result: Result) -> tuple[str, str]:
    """Does accuracy fall from the smallest dictionary to the largest? Independent prompts, so
    an unpaired interval; the smallest size with a choice to make (size 1 has one candidate)."""
    sizes = [k for k in result.sizes if k > 1]
    if len(sizes) < 2:
        return v.NOT_TESTABLE, f"needs two sizes above 1, got {result.sizes}"
    small, large = (result.scores["model"][k] for k in (sizes[0], sizes[-1]))
    if not small.above(result.chance(sizes[0])):
        return (
            v.NOT_TESTABLE,
            f"at {sizes[0]} keys the model is at chance ({small}): nothing can fall",
        )
    outcome, evidence = v.lower(small, large, paired=False)
    return outcome, f"{sizes[0]} keys {small}; {sizes[-1]} keys {evidence}"


def roles_found(result: Result) -> tuple[str, str]:
    """Among the heads whose zeroing hurts retrieval, is one a Gather and one an Aggregate head?
    One finding for a role no harmful head plays; the claims about that role's head are then not
    testable. (The paper's heads, where named, are tested by their rank instead: `in_top`.)"""
    model = result.scores["model"]
    # the size the model does best above chance
    best = max(model, key=lambda k: model[k].lo - result.chance(k))
    parts = [
        (v.REPRODUCED, f"{ROLE_NAMES[r]}: {result.roles.describe(r)}")
        if result.roles.heads[r]
        else missing_role(result.roles, r, model[best], result.chance(best))
        for r in ROLE_NAMES
    ]
    return v.every(o for o, _ in parts), "; ".join(e for _, e in parts)


def widening_gap(result: Result, role: str) -> tuple[str, str]:
    """Fig. 4: with the role's heads zeroed, retrieval falls further behind the model as the
    dictionary grows: the loss at the largest size above chance beyond the loss at the smallest
    (a difference in differences, each loss paired on its size's prompts, the sizes' prompts
    independent), judged where zeroing the heads lowers retrieval at some size."""
    if not result.roles.heads[role]:
        return v.NOT_TESTABLE, f"no {ROLE_NAMES[role]} head to zero (the roles' claim says why)"
    model, removed = result.scores["model"], result.scores[condition(role)]
    sizes = [k for k in result.sizes if k > 1 and model[k].above(result.chance(k))]
    if len(sizes) < 2:
        return v.NOT_TESTABLE, f"fewer than two sizes above chance ({sizes})"
    falls = {k: v.falls(model[k], removed[k], result.chance(k)) for k in sizes}
    worst = max(sizes, key=lambda k: model[k].acc - removed[k].acc)

    def decide():
        small, large = sizes[0], sizes[-1]
        did = difference_in_differences(model[large], removed[large], model[small], removed[small])
        outcome = (
            v.REPRODUCED
            if did.hi < 0
            else v.NOT_REPRODUCED
            if did.lo > -v.MARGIN
            else v.INCONCLUSIVE
        )
        return outcome, (
            f"{small} keys: {removed[small]} against {model[small]}; {large} keys: {removed[large]} against "
            f"{model[large]}; the loss at {large} keys minus the loss at {small}: {did} (negative: the gap widens)"
        )

    return v.gated(
        falls[worst],
        f"zeroing {result.roles.label(role)} lowers retrieval at no size (at {worst} keys)",
        decide,
    )


def in_top(result: Result, role: str) -> tuple[str, str]:
    """Are the role's heads among the `TOP` heads of every ranking (each form of the query)? A head
    ranked lower counts as undecided while its interval overlaps the last top head's. Read only
    past the chance and ceiling checks (`verdicts.ranking_readable`)."""
    heads = result.roles.heads[role]
    if result.roles.source != "paper" or not heads:
        return v.NOT_TESTABLE, (
            f"{ROLE_NAMES[role]} heads found by behaviour among the ranking's top heads cannot "
            "test the ranking; the paper profile tests it with the paper's heads"
        )
    parts, notes = [], []
    for form, ranking in result.rankings.items():
        exact = ranking.table.dropna(subset=["acc"]).reset_index(drop=True)
        if exact.empty:
            return v.NOT_TESTABLE, f"the {form} ranking measured no head exactly"
        # the chance and ceiling checks, before any rank is read
        readable, why = v.ranking_readable(
            ranking.clean, tuple(exact.loc[0, ["acc", "lo", "hi"]]), 1 / ranking.settings["pairs"]
        )
        if not readable:
            return v.NOT_TESTABLE, f"{form} form: {why}"
        order = measured(ranking.table)
        for h in heads:
            label = f"{h}, {form} form"
            # the paper heads' layers are always swept: only a layer too wide to sweep
            if h not in order:
                parts.append(v.NOT_TESTABLE)
                notes.append(
                    f"{label}: its layer was not swept exactly (screen rank {_screen_rank(ranking.table, h)})"
                )
                continue
            rank = order.index(h)
            cut = exact.iloc[min(TOP, len(exact)) - 1]
            parts.append(
                v.REPRODUCED
                if rank < TOP
                else v.INCONCLUSIVE
                if exact.lo[rank] <= cut.hi
                else v.NOT_REPRODUCED
            )
            notes.append(
                f"{label}: rank {rank + 1}, {exact.acc[rank]:.1%} [{exact.lo[rank]:.1%}, {exact.hi[rank]:.1%}] "
                f"zeroed (rank {TOP}: {cut.acc:.1%})"
            )
    return v.every(parts), "; ".join(notes)  # in the top of both rankings


def _screen_rank(table: pd.DataFrame, head: Head) -> str:
    order = table.sort_values("estimate").reset_index(drop=True)
    match = order[(order.layer == head.layer) & (order["head"] == head.head)]
    return f"{match.index[0] + 1} of {len(order)}" if len(match) else "-"


def verdicts(result: Result) -> list[v.Verdict]:
    out = [
        v.Verdict("Accuracy falls as the dictionary grows", "Fig. 4", *trend(result), headline=True)
    ]
    if result.roles.source == "behaviour":
        out.append(
            v.Verdict(
                "Among the heads whose zeroing hurts, one behaves as a Gather head and one as an Aggregate "
                "head",
                "Table 5, Fig. 1",
                *roles_found(result),
                headline=True,
            )
        )
    for r in ROLE_NAMES:
        out.append(
            v.Verdict(
                f"Removing the {ROLE_NAMES[r]} head ({result.roles.label(r)}) widens the gap as the "
                "dictionary grows",
                "Fig. 4",
                *widening_gap(result, r),
            )
        )
    for r in ROLE_NAMES:
        out.append(
            v.Verdict(
                f"The {ROLE_NAMES[r]} head is among the {TOP} top-ranked heads",
                "Table 5, App. A.5",
                *in_top(result, r),
                headline=result.roles.source == "paper",
            )
        )
    return out


# --- tables and figures ------------------------------------------------------------------------


def curves(result: Result) -> pd.DataFrame:
    return pd.DataFrame(
        [
            dict(keys=k, condition=_legend(result, c), acc=s.acc, lo=s.lo, hi=s.hi, n=s.n)
            for c, by_size in result.scores.items()
            for k, s in by_size.items()
        ]
    )


def _legend(result: Result, name: str) -> str:
    if name == "model":
        return "model as it is"
    role = name.split()[0]
    return f"{ROLE_NAMES[role]} {result.roles.label(role)} zeroed"


def top_heads(result: Result, k: int = 5) -> pd.DataFrame:
    """Table 5's view: the `k` most harmful heads of each ranking, accuracy with each zeroed."""
    rows = []
    for form, ranking in result.rankings.items():
        exact = ranking.table.dropna(subset=["acc"]).head(k)
        for rank, r in enumerate(exact.itertuples(), start=1):
            rows.append(
                {
                    "value follows": FORM_LABELS[form],
                    "rank": rank,
                    "head": str(Head(int(r.layer), int(r.head))),
                    "role": result.roles.role_of(Head(int(r.layer), int(r.head))),
                    "zeroed": Estimate(r.acc, r.lo, r.hi, percent=True),
                    "none zeroed": f"{ranking.clean.acc:.1%}",
                    "n": int(r.n),
                }
            )
    return pd.DataFrame(rows)


FORM_LABELS = {
    "released": "with no space (released)",
    "spaced": "after a space (book)",
    "trailing": "after the prompt's trailing space",
}


def _sizes(sizes: list[int]) -> str:
    if len(sizes) > 3 and sizes == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    return ", ".join(map(str, sizes))


def comparison(result: Result) -> pd.DataFrame:
    sizes = result.sizes
    model = result.scores["model"]
    settings = result.rankings["released"].settings
    removed = "; ".join(
        f"{ROLE_NAMES[r]} {result.roles.label(r)}: "
        + ", ".join(
            f"{k} keys {result.scores[condition(r)][k].acc:.0%}" for k in (sizes[0], sizes[-1])
        )
        for r in ROLE_NAMES
        if result.roles.heads[r]
    )
    top = ", ".join(
        top_heads(result, TOP).query(f"`value follows` == '{FORM_LABELS['released']}'")["head"]
    )
    released = paper("kv_retrieval", "released_dictionary_sizes")
    return base.comparison_table(
        [
            (
                "model",
                "Llama-3.1-8B (caption; the code loads -Instruct)",
                "Llama-3.1-8B-Instruct",
                f"{result.cfg.model} ({result.cfg.profile} profile)",
            ),
            (
                "dictionary sizes",
                f"{paper('kv_retrieval', 'n_configurations').value} configurations, sizes not stated",
                f"{len(released.integers)} sizes: {_sizes(list(released.integers))}",
                f"{len(sizes)} sizes: {_sizes(sizes)}",
            ),
            (
                "prompts per size",
                paper("kv_retrieval", "samples_per_configuration").value,
                "1000",
                f"{result.cfg.n_per_size} ({result.cfg.kv_query} query; dictionaries of seed {CURVES_SEED + result.cfg.seed}, "
                f"the ranking's and the roles' of seed {result.cfg.seed}: disjoint)",
            ),
            (
                "accuracy against size",
                "falls as the dictionary grows (Fig. 4)",
                "-",
                f"{sizes[0]} keys {model[sizes[0]]}; {sizes[-1]} keys {model[sizes[-1]]}",
            ),
            (
                "head removed",
                " or ".join(map(str, paper("kv_retrieval", "head_ablated_summary").heads))
                + " (Fig. 4; secondary summary)",
                f"{paper('kv_retrieval', 'head_ablated').value} only, o_proj columns zeroed in place",
                f"{removed or 'none found'} (heads: G {result.roles.describe('G')}, A {result.roles.describe('A')})",
            ),
            (
                "top-ranked heads",
                "the G and A heads (Table 5)",
                "-",
                f"{top} ({settings['pairs']} keys, n={settings['n']}; G/A: {result.roles.label('G')}, {result.roles.label('A')})",
            ),
            (
                "how the value follows the query",
                "no space, a deliberate probe choice (App. A.5; secondary summary)",
                "no space ('is42')",
                forms_note(result),
            ),
        ]
    )


def same_top(result: Result) -> str:
    """How far the two forms' rankings agree: their top `TOP` heads' overlap (against what random
    orders would share) and the rank correlation of every head measured exactly in both."""
    if len(result.rankings) < 2:
        return "one form only (the zoo's token task has no query forms)"
    a, b = (r.table for r in result.rankings.values())
    g = shared.agreement(a, b, TOP)
    tops = [set(measured(t)[:TOP]) for t in (a, b)]
    differ = (
        "" if tops[0] == tops[1] else f" ({', '.join(sorted(map(str, tops[0] ^ tops[1])))} differ)"
    )
    rho = (
        f"Spearman {g['rho']:.2f} [{g['lo']:.2f}, {g['hi']:.2f}] over the {g['n']} heads measured in both"
        if g["rho"] == g["rho"]
        else f"no rank correlation ({g['n']} heads measured in both)"
    )
    return (
        f"{g['overlap']} of {TOP} shared (random orders: {g['chance_overlap']:.1f}){differ}; {rho}"
    )


def forms_note(result: Result) -> str:
    """The released form against the spaced one, and what the tokenizer makes of the trailing space."""
    if len(result.rankings) < 2:
        return "the released form only (the zoo's token task has no query forms)"
    trailing = (
        "same tokens as the spaced form here, so not ranked apart"
        if result.same_tokens.get(("spaced", "trailing"))
        else "other tokens than the spaced form here (not ranked)"
    )
    if result.same_tokens.get(("released", "spaced")):
        return f"released and spaced: same tokens on this tokenizer, one computation; the trailing-space form: {trailing}"
    return f"released against spaced, top {TOP}: {same_top(result)}; the trailing-space form: {trailing}"


def rounding_scores(result: Result) -> dict[str, Score]:
    """What the page's near-tie count reads: each condition over every size's prompts."""
    return {
        _legend(result, c): Score.pooled(by_size.values()) for c, by_size in result.scores.items()
    }


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, {result.cfg.model}"


def figure(result: Result):
    """Fig. 4 for this run: accuracy against dictionary size, the model as it is and with each
    role's heads zeroed, and chance (one over the number of keys)."""
    from .. import plots

    ax = plots.accuracy_curves(
        curves(result),
        "keys",
        "condition",
        title=f"{result.cfg.model}: KV retrieval ({result.cfg.kv_query} query)",
        xlabel="keys in the dictionary",
    )
    keys = range(result.sizes[0], result.sizes[-1] + 1)
    ax.plot(
        keys,
        [100 * result.chance(k) for k in keys],
        ls=":",
        lw=1.2,
        color="0.35",
        label="chance (1 / keys)",
    )
    plots.legend_below(ax, ncols=2)
    return ax.figure
