"""Which heads play the Gather and the Aggregate role: one assignment for every chapter.

A role's heads are the reader's where set, else the paper's for the model (data/reference),
else found among the heads whose zeroing hurts: the candidates are the exactly measured heads of
a ranking (the shared KV ranking's, or the one a chapter's screen hands in) whose zeroing lowers
accuracy on the ranking's prompts, item by item (`harmful`), most harmful first; the most harmful
candidate that behaves as a role takes it (`heads.assign_roles`), measured on those prompts, and
candidates that tie with it are reported. Where no candidate behaves as a role the role stays
empty: one finding ("another mechanism"), which the claims about that role's head then cannot be
tested against. The chapters that must draw or mask a head for every role (attention maps,
masking) then take the candidate that comes closest (`with_closest`), and say so.

Every chapter that names roles comes here (head zeroing, KV retrieval, attention maps, masking,
the hybrid swap's "KV ranking" rule), so no two pages name different roles for the same heads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import heads as hd
from .. import verdicts as v
from ..errors import ConfigError
from ..heads import ROLE_MEASURES, Head
from ..hooks import MIXER, hooked
from ..reference import paper_heads
from ..segments import Segments, head_measures
from ..stats import Score, mean_interval
from ..sweep import sweep
from . import checks, loading, shared, stores

ROLE_NAMES = {"G": "Gather", "A": "Aggregate"}
ANSWER_END = "final position: answer end's share of the segment ends"


def check_pair(gather, aggregate) -> None:
    """Both roles set, or neither (a half-named pair would mix the paper's heads with ours)."""
    if (gather is None) != (aggregate is None):
        raise ConfigError(
            "set gather and aggregate together (lists of heads like ['L16H22']), or neither "
            "(None: the paper's heads of the model, or heads found by behaviour)"
        )


def check_roles_of(model: str, gather, aggregate, below: int | None = None) -> None:
    """The heads set as `gather` and `aggregate`, or where they are unset the paper's heads of
    `model`, are heads of `model` (in its first `below` layers): checked from its config, before
    any work, naming the parameters that fix it."""
    named = paper_heads(model) if gather is None else {"G": gather, "A": aggregate}
    for role, field in (("G", "gather"), ("A", "aggregate")):
        checks.check_heads_of(
            model, field, (named or {}).get(role), paper=gather is None, below=below
        )


# --- the roles ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roles:
    """The heads of each role ("G", "A"; empty where no candidate behaves as the role), and how
    they were named: "paper" (data/reference), "set" (the reader's parameters) or "behaviour"."""

    heads: dict[str, tuple[Head, ...]]
    source: str
    # the candidates', where measured
    measures: pd.DataFrame | None = dataclasses.field(default=None, repr=False)
    found: dict[str, Head | None] | None = None  # by behaviour among the candidates, where measured
    # roles no candidate plays, given to the closest one (`with_closest`)
    closest: tuple[str, ...] = ()
    ranking: str = "the KV ranking"  # whose top heads the candidates are
    # the heads whose zeroing hurts, most harmful first (where found by behaviour)
    candidates: tuple[Head, ...] = ()
    # role -> candidates that also behave so, as harmful within the interval
    ties: dict[str, tuple[Head, ...]] = dataclasses.field(default_factory=dict)

    @property
    def filled(self) -> dict[str, bool]:
        """Per role: whether its heads play it (not a closest stand-in)."""
        return {r: r not in self.closest for r in ROLE_NAMES}

    def label(self, role: str) -> str:
        return ", ".join(map(str, self.heads[role])) or "none"

    def describe(self, role: str) -> str:
        """The role's heads and how they were named, with the candidates that tie with them."""
        how = {"paper": "the paper's", "set": "as set"}.get(self.source)
        if how is None:
            nobody = (
                f"no head whose zeroing hurts on {self.ranking}'s prompts behaves as the {ROLE_NAMES[role]} head"
                if self.candidates
                else f"no head's zeroing hurts on {self.ranking}'s prompts"
            )
            how = (
                f"{nobody}: the closest"
                if role in self.closest
                else f"the most harmful head of {self.ranking} that behaves so"
                if self.heads[role]
                else nobody
            )
        tied = self.ties.get(role, ())
        ties = (
            f"; as harmful within the interval and behaving so too: {', '.join(map(str, tied))}"
            if tied
            else ""
        )
        return f"{self.label(role)} ({how}{ties})"

    def role_of(self, head: Head) -> str:
        return next((r for r in ROLE_NAMES if head in self.heads[r]), "")

    def _eligible(self, role: str) -> tuple[pd.DataFrame, list]:
        """The measured candidates that could play the role, and the previous-token heads left out
        (they stay inside their segment whatever they do: not a Gather head)."""
        m = self.measures
        local = list(m.index[m[hd.LOCAL_MEASURE].astype(float) > hd.LOCAL]) if role == "G" else []
        return m.drop(index=local), local

    def surely_missing(self, role: str) -> bool:
        """No eligible candidate can play the role: even the top of each one's interval (over the
        prompts) stays at or under the line. A measure without its interval counts as exact."""
        column = hd.GATHER_MEASURE if role == "G" else hd.AGGREGATE_MEASURE
        eligible, _ = self._eligible(role)
        top = eligible[f"{column} hi"] if f"{column} hi" in eligible else eligible[column]
        return bool((top.astype(float) <= hd.LINE).all())

    def missing(self, role: str) -> str:
        """Why a role has no head: no head hurts, or the best candidate's measure (and its
        interval) against the line."""
        column = hd.GATHER_MEASURE if role == "G" else hd.AGGREGATE_MEASURE
        if self.source == "behaviour" and not self.candidates:
            return f"no {ROLE_NAMES[role]} head: no head's zeroing lowers accuracy on {self.ranking}'s prompts"
        if self.measures is None or self.measures.empty:
            return f"no {ROLE_NAMES[role]} head: no candidate could be measured"
        eligible, local = self._eligible(role)
        best = eligible[column].astype(float)
        interval = ""
        if len(best) and {f"{column} lo", f"{column} hi"} <= set(eligible):
            top = Head(*best.idxmax())
            interval = f" [{eligible.loc[[top], f'{column} lo'].iloc[0]:.2f}, {eligible.loc[[top], f'{column} hi'].iloc[0]:.2f}]"
        why = (
            f"the highest '{column}' among {', '.join(str(Head(*h)) for h in best.index)} is {best.max():.2f}"
            f"{interval} ({Head(*best.idxmax())}), at most {hd.LINE} is not the behaviour"
            if len(best)
            else ""
        )
        if len(local):
            why = "; ".join(
                filter(
                    None,
                    [
                        f"{', '.join(str(Head(*h)) for h in local)} read{'s' if len(local) == 1 else ''} "
                        f"the previous token (local share above {hd.LOCAL})",
                        why,
                    ],
                )
            )
        return (
            f"no candidate behaves as a{'n' if role == 'A' else ''} {ROLE_NAMES[role]} head: {why}"
        )


def missing_role(roles: Roles, role: str, clean: Score, chance: float) -> tuple[str, str]:
    """A role no candidate plays: not reproduced (`verdicts.another_mechanism`) where the model can
    do the task (`clean` clears `chance`) and the candidates were measured; not testable where it
    cannot or they were not (every chapter that zeroes or masks a role's heads says this)."""
    if not v.testable(clean, chance):
        return v.NOT_TESTABLE, f"clean {clean} does not clear chance {chance:.0%}"
    measured = roles.measures is not None and not roles.measures.empty
    return v.another_mechanism(
        ROLE_NAMES[role], roles.missing(role), measured, measured and roles.surely_missing(role)
    )


def closest_roles(measures: pd.DataFrame) -> tuple[dict[str, tuple[Head, ...]], dict[str, bool]]:
    """`heads.assign_roles` on the candidates' measures (one row per head, indexed by Head),
    every role filled: where no candidate shows a role's behaviour, the one that comes closest
    takes it (for G, a non-local one where there is one), and `filled` says so."""
    found = hd.assign_roles(measures)
    filled = {r: found[r] is not None for r in ROLE_NAMES}
    for r in ROLE_NAMES:
        if not filled[r]:
            found[r] = closest(measures, r, [h for h in found.values() if h is not None])
    return {r: (found[r],) for r in ROLE_NAMES}, filled


def closest(measures: pd.DataFrame, role: str, taken: list[Head]) -> Head | None:
    """The head of `measures`, other than `taken`, that comes closest to the role's behaviour
    (for G a non-local one where there is one); None where no head is left."""
    rest = measures.drop(index=[h for h in taken if h in measures.index])
    if role == "G":
        not_local = rest[rest[hd.LOCAL_MEASURE].astype(float) <= hd.LOCAL]
        rest = not_local if not not_local.empty else rest
    column = hd.GATHER_MEASURE if role == "G" else hd.AGGREGATE_MEASURE
    return None if rest.empty else Head(*rest[column].astype(float).idxmax())


def with_closest(roles: Roles) -> Roles:
    """`roles` with every role that no candidate plays given to the measured head that comes
    closest (`closest`, never a head that plays the other role), named in `closest`: for the
    chapters that must draw or mask a head of each role. The roles that are played keep their
    heads; where too few heads were measured, the roles are left as they are."""
    missing = tuple(r for r in ROLE_NAMES if not roles.heads[r])
    if not missing or roles.measures is None:
        return roles
    taken = [h for r in ROLE_NAMES for h in roles.heads[r]]
    picks = {}
    for r in missing:
        picks[r] = closest(roles.measures, r, taken + list(picks.values()))
        if picks[r] is None:
            return roles
    return dataclasses.replace(
        roles, heads={r: roles.heads[r] or (picks[r],) for r in ROLE_NAMES}, closest=missing
    )


MAX_CANDIDATES = 8  # the most harmful heads whose attention is measured for the roles


def harmful(ranking: pd.DataFrame, clean: Score) -> list[Head]:
    """The exactly measured heads of a ranking (`heads.ranking_table`, with each head's items)
    whose zeroing lowers accuracy against `clean` on the same prompts (`verdicts.below`: the
    paired interval below zero), most harmful first."""
    rows = ranking.dropna(subset=["acc"])
    scores = {
        Head(int(l), int(h)): Score.from_json({"correct": c})
        for l, h, c in zip(rows.layer, rows["head"], rows.correct)
    }
    return [h for h, s in scores.items() if v.below(clean, s)[0] == v.REPRODUCED]


def near_ties(ranking: pd.DataFrame, chosen: Head, others: list[Head]) -> tuple[Head, ...]:
    """Of `others`, those whose zeroed accuracy lies inside the 95% interval of `chosen`'s: as
    harmful as it, as far as the ranking's prompts can tell."""
    at = {
        Head(int(l), int(h)): (a, lo, hi)
        for l, h, a, lo, hi in zip(
            ranking.layer, ranking["head"], ranking.acc, ranking.lo, ranking.hi
        )
        if a == a
    }
    if chosen not in at:
        return ()
    _, lo, hi = at[chosen]
    return tuple(h for h in others if h != chosen and h in at and lo <= at[h][0] <= hi)


def find_roles(
    loaded,
    profile: str,
    smoke: bool,
    gather=None,
    aggregate=None,
    benchmark: bm.Benchmark | None = None,
    ranking: pd.DataFrame | None = None,
    clean: Score | None = None,
    seed: int | None = None,
    measure: bool = True,
    name: str = "the KV ranking",
) -> Roles:
    """The heads of each role: as set; else the paper's for this model; else among the heads
    whose zeroing hurts on the prompts of `ranking` (a `heads.ranking_table`, its clean score
    `clean`, its prompts `benchmark`; default: the shared KV ranking, on its own prompts, as
    every chapter measures them; `seed` draws that ranking's dictionaries, None the shared one's;
    `name` says whose ranking it is): the most harmful that behaves as the role
    (`heads.assign_roles` on their attention, measured on those prompts), with the candidates as
    harmful within the interval that behave so too (`near_ties`). The paper's heads are measured
    beside the candidates too, so that a verdict can ask whether they behave; `measure=False`
    skips that (and the ranking) where the heads are named."""
    n = shared.ranking_settings(profile, smoke)["n"]
    if gather is not None:
        return Roles({"G": tuple(gather), "A": tuple(aggregate)}, "set", ranking=name)
    named = paper_heads(loaded.name)
    if named and not measure:
        return Roles(named, "paper", ranking=name)
    if benchmark is None:
        kv = shared.kv_ranking(loaded, profile, smoke, seed=seed)
        s = kv.settings
        benchmark = bm.kv(
            loaded.name, loaded.tokenizer, s["pairs"], max(n, s["n"]), s["seed"], s["query"]
        )
        ranking, clean = kv.table, kv.clean
    candidates = harmful(ranking, clean)[:MAX_CANDIDATES] if ranking is not None else []
    # Where fewer than two heads hurt, the ranking's next most harmful heads are measured too: no role is
    # named among them, but a chapter that must draw a head for every role takes the closest (`with_closest`).
    others = [h for h in hd.measured(ranking) if h not in candidates] if ranking is not None else []
    measured = candidates + others[: max(0, 2 - len(candidates))]
    heads = list(dict.fromkeys(measured + [h for hs in (named or {}).values() for h in hs]))
    measures = measure_roles(loaded, profile, benchmark, heads, n) if heads else None
    found = (
        hd.assign_roles(
            measures.loc[[h for h in measures.index if Head(*h) in candidates]], candidates
        )
        if candidates
        else {r: None for r in ROLE_NAMES}
    )
    if named:
        return Roles(named, "paper", measures, found, ranking=name, candidates=tuple(candidates))
    behaves = lambda r, h: (
        measures.loc[[h], hd.AGGREGATE_MEASURE if r == "A" else hd.GATHER_MEASURE].iloc[0] > hd.LINE
    )
    ties = {
        r: near_ties(
            ranking, found[r], [h for h in candidates if behaves(r, h) and h not in found.values()]
        )
        for r in ROLE_NAMES
        if found[r]
    }
    return Roles(
        {r: (found[r],) if found[r] else () for r in ROLE_NAMES},
        "behaviour",
        measures,
        found,
        ranking=name,
        candidates=tuple(candidates),
        ties=ties,
    )


# --- measuring what heads do -------------------------------------------------------------------


def head_maps(loaded, context: str, heads: list[Head]) -> dict[Head, np.ndarray]:
    """Each head's [T, T] attention over `context` (hidden attention for SSM heads), one pass.
    Falcon-Mamba's layers have 8192 single-channel heads: only the channels asked for are
    materialised (attention.attention_maps would build all of them)."""
    from ..adapters import MambaAdapter, unwrap
    from ..attention import attention_maps

    model, adapter = unwrap(loaded)
    ids = loaded.tokenizer(context, return_tensors="pt").input_ids
    layers = sorted({h.layer for h in heads})
    # heads of one channel (or a group): their hidden attention
    if not isinstance(adapter, MambaAdapter):
        maps = attention_maps(loaded, ids, layers)
        return {h: maps[h.layer][0, h.head].numpy() for h in heads}
    seen = {}
    with hooked(adapter, {(MIXER, l): partial(seen.__setitem__, l) for l in layers}):
        model(input_ids=ids.to(next(model.parameters()).device))
    out = {}
    for l in layers:
        mine = [h for h in heads if h.layer == l]
        alpha = adapter.hidden_attention(l, seen[l], [h.head for h in mine]).float().cpu()
        out |= {h: alpha[0, k].numpy() for k, h in enumerate(mine)}
    return out


def measures(a: np.ndarray, seg: Segments) -> dict[str, float]:
    """`segments.head_measures`, and how much of what the final position puts on the segment
    ends goes to the answer's end (the Aggregate head's "mostly the answer's")."""
    ends = np.abs(a[-1][seg.ends])
    return {**head_measures(a, seg), ANSWER_END: float(ends[seg.target] / max(ends.sum(), 1e-12))}


def measure_roles(
    loaded, profile: str, benchmark: bm.Benchmark, heads: list[Head], n: int
) -> pd.DataFrame:
    """What `heads` do on the first `n` prompts of `benchmark` (`measure_behaviour`), averaged over
    the prompts (`averaged`): one row per head, indexed by Head. Through one results store for
    the book, since every chapter that names roles asks this of the same candidates on the same
    prompts."""
    if benchmark.spec is None:
        raise ConfigError(
            f"the roles are measured on a benchmark made by `helpers.benchmarks` (one with a `spec`, "
            f"so that its results-store cell names its items); {benchmark.name} has none"
        )
    store = stores.open_store("roles", profile, "behaviour", [loaded], measure_behaviour)
    loading.hold(loaded)  # the measurement, run here, finds this model by its name
    cell = dict(model=loaded.name, items=benchmark.spec, heads=[str(h) for h in heads], n=n)
    per_prompt = pd.DataFrame(
        sweep(store, [cell], measure_behaviour, desc="roles: what the candidates do")[0]["rows"]
    )
    return averaged(per_prompt.assign(head=per_prompt["head"].map(Head.parse)))


def measure_behaviour(cell: dict) -> dict:
    """Per head and prompt, `measures` of its attention (one pass a prompt) on the first `n`
    prompts of the cell's items (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    benchmark = bm.from_spec(cell["items"], loaded.tokenizer)
    heads = [Head.parse(h) for h in cell["heads"]]
    return {
        "rows": [
            dict(
                head=str(h),
                prompt=i,
                **{k: float(x) for k, x in measures(a, benchmark.segments(item)).items()},
            )
            for i, item in enumerate(benchmark.items[: cell["n"]])
            for h, a in head_maps(loaded, item.pairs[0][0], heads).items()
        ]
    }


def averaged(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Per-prompt measures (columns head, prompt, measures...) averaged over prompts, one row per
    head, with the 95% interval of each role measure over the prompts (columns "<measure> lo" /
    "hi"), so that a role's absence can be told from a measure too noisy to decide."""
    means = per_prompt.drop(columns="prompt").groupby("head", sort=False).mean()
    for m in ROLE_MEASURES:
        bounds = {
            h: mean_interval(g[m].to_numpy())[1:] for h, g in per_prompt.groupby("head", sort=False)
        }
        means[f"{m} lo"] = [bounds[h][0] for h in means.index]
        means[f"{m} hi"] = [bounds[h][1] for h in means.index]
    return means
