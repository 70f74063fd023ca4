"""Which heads play the Gather and the Aggregate role: one assignment for every chapter.

A role's heads are the reader's where set, else the paper's for the model (data/reference),
else found by behaviour (`heads.assign_roles`) among the candidates of a ranking (the shared KV
ranking's, or the one a chapter's screen hands in), measured on that ranking's prompts. Where no
candidate behaves as a role the role stays empty: the chapters that zero a role's heads say
"another mechanism". The chapters that must draw or mask a head for every role (attention maps,
masking) then take the candidate that comes closest (`with_closest`), and say so.

Every chapter that names roles comes here (head zeroing, KV retrieval, attention maps, masking,
the hybrid swap's "KV ranking" rule), so no two pages name different roles for the same heads.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import heads as hd
from .. import verdicts as v
from ..reference import paper_heads
from ..errors import ConfigError
from ..heads import ROLE_MEASURES, Head
from ..segments import Segments, head_measures
from ..stats import Score, mean_interval
from ..sweep import sweep
from . import base, shared

ROLE_NAMES = {"G": "Gather", "A": "Aggregate"}
ANSWER_END = "final position: answer end's share of the segment ends"


def check_pair(gather, aggregate) -> None:
    """Both roles set, or neither (a half-named pair would mix the paper's heads with ours)."""
    if (gather is None) != (aggregate is None):
        raise ConfigError("set gather and aggregate together (lists of heads like ['L16H22']), or neither "
                          "(None: the paper's heads of the model, or heads found by behaviour)")


def check_roles_of(model: str, gather, aggregate, below: int | None = None) -> None:
    """The heads set as `gather` and `aggregate`, or where they are unset the paper's heads of
    `model`, are heads of `model` (in its first `below` layers): checked from its config, before
    any work, naming the parameters that fix it."""
    named = paper_heads(model) if gather is None else {"G": gather, "A": aggregate}
    for role, field in (("G", "gather"), ("A", "aggregate")):
        base.check_heads_of(model, field, (named or {}).get(role), paper=gather is None, below=below)


# --- the roles ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Roles:
    """The heads of each role ("G", "A"; empty where no candidate behaves as the role), and how
    they were named: "paper" (data/reference), "set" (the reader's parameters) or "behaviour"."""

    heads: dict[str, tuple[Head, ...]]
    source: str
    measures: pd.DataFrame | None = dataclasses.field(default=None, repr=False)  # the candidates', where measured
    found: dict[str, Head | None] | None = None  # by behaviour among the candidates, where measured
    closest: tuple[str, ...] = ()  # roles no candidate plays, given to the closest one (`with_closest`)
    ranking: str = "the KV ranking"  # whose top heads the candidates are

    @property
    def filled(self) -> dict[str, bool]:
        """Per role: whether its heads play it (not a closest stand-in)."""
        return {r: r not in self.closest for r in ROLE_NAMES}

    def label(self, role: str) -> str:
        return ", ".join(map(str, self.heads[role])) or "none"

    def describe(self, role: str) -> str:
        """The role's heads and how they were named."""
        how = {"paper": "the paper's", "set": "as set"}.get(self.source)
        if how is None:
            nobody = f"no top head of {self.ranking} behaves as the {ROLE_NAMES[role]} head"
            how = (f"{nobody}: the closest" if role in self.closest else
                   f"by behaviour among {self.ranking}'s top heads" if self.heads[role] else nobody)
        return f"{self.label(role)} ({how})"

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
        return bool((top.astype(float) <= 0.5).all())

    def missing(self, role: str) -> str:
        """Why a role has no head: the best candidate's measure (and its interval) against the line."""
        column = hd.GATHER_MEASURE if role == "G" else hd.AGGREGATE_MEASURE
        if self.measures is None or self.measures.empty:
            return f"no {ROLE_NAMES[role]} head: no candidate could be measured"
        eligible, local = self._eligible(role)
        best = eligible[column].astype(float)
        interval = ""
        if len(best) and f"{column} hi" in eligible:
            top = Head(*best.idxmax())
            interval = f" [{eligible.loc[[top], f'{column} lo'].iloc[0]:.2f}, {eligible.loc[[top], f'{column} hi'].iloc[0]:.2f}]"
        why = (f"the highest '{column}' among {', '.join(str(Head(*h)) for h in best.index)} is {best.max():.2f}"
               f"{interval} ({Head(*best.idxmax())}), at most 0.5 is not the behaviour" if len(best) else "")
        if len(local):
            why = "; ".join(filter(None, [f"{', '.join(str(Head(*h)) for h in local)} read{'s' if len(local) == 1 else ''} "
                                          f"the previous token (local share above {hd.LOCAL})", why]))
        return f"no candidate behaves as a{'n' if role == 'A' else ''} {ROLE_NAMES[role]} head: {why}"


def missing_role(roles: Roles, role: str, clean: Score, chance: float) -> tuple[str, str]:
    """A role no candidate plays: not reproduced (`verdicts.another_mechanism`) where the model can
    do the task (`clean` clears `chance`) and the candidates were measured; not testable where it
    cannot or they were not (every chapter that zeroes or masks a role's heads says this)."""
    if not v.testable(clean, chance):
        return v.NOT_TESTABLE, f"clean {clean} does not clear chance {chance:.0%}"
    measured = roles.measures is not None and not roles.measures.empty
    return v.another_mechanism(ROLE_NAMES[role], roles.missing(role), measured, measured and roles.surely_missing(role))


def closest_roles(measures: pd.DataFrame) -> tuple[dict[str, tuple[Head, ...]], dict[str, bool]]:
    """`heads.assign_roles` on the candidates' measures (one row per head, indexed by Head),
    every role filled: where no candidate shows a role's behaviour, the one that comes closest
    takes it (for G, a non-local one where there is one), and `filled` says so."""
    found = hd.assign_roles(measures)
    filled = {r: found[r] is not None for r in ROLE_NAMES}
    if not filled["G"]:
        rest = measures.drop(index=[found["A"]] if found["A"] else [])
        not_local = rest[rest[hd.LOCAL_MEASURE] <= hd.LOCAL]
        found["G"] = Head(*(not_local if not not_local.empty else rest)[hd.GATHER_MEASURE].astype(float).idxmax())
    if not filled["A"]:
        found["A"] = Head(*measures.drop(index=[found["G"]])[hd.AGGREGATE_MEASURE].astype(float).idxmax())
    return {r: (found[r],) for r in ROLE_NAMES}, filled


def with_closest(roles: Roles) -> Roles:
    """`roles` with every role that no candidate plays given to the candidate that comes closest
    (`closest_roles`), named in `closest`: for the chapters that must draw or mask a head of each
    role. The roles that are played keep their heads."""
    missing = tuple(r for r in ROLE_NAMES if not roles.heads[r])
    if not missing or roles.measures is None or len(roles.measures) < 2:
        return roles
    closest, _ = closest_roles(roles.measures)
    return dataclasses.replace(roles, heads={r: roles.heads[r] or closest[r] for r in ROLE_NAMES}, closest=missing)


def find_roles(loaded, profile: str, smoke: bool, gather=None, aggregate=None, benchmark: bm.Benchmark | None = None,
               candidates: list[Head] | None = None, seed: int | None = None, measure: bool = True,
               ranking: str = "the KV ranking") -> Roles:
    """The heads of each role: as set; else the paper's for this model; else by behaviour
    (`heads.assign_roles`) among `candidates` measured on `benchmark` (default: the shared KV
    ranking's candidates, on its own prompts, as every chapter measures them; `seed` draws that
    ranking's dictionaries, None the shared one's; `ranking` names whose candidates they are).
    The paper's heads are measured beside the candidates too, so that a verdict can ask whether
    they behave; `measure=False` skips that (and the ranking) where the heads are named."""
    n = shared.ranking_settings(profile, smoke)["n"]
    if gather is not None:
        return Roles({"G": tuple(gather), "A": tuple(aggregate)}, "set", ranking=ranking)
    named = paper_heads(loaded.name)
    if named and not measure:
        return Roles(named, "paper", ranking=ranking)
    if benchmark is None:
        kv = shared.kv_ranking(loaded, profile, smoke, seed=seed)
        s = kv.settings
        benchmark = bm.kv(loaded.name, loaded.tokenizer, s["pairs"], max(n, s["n"]), s["seed"], s["query"])
        candidates = hd.candidates(kv.table)
    heads = list(dict.fromkeys(list(candidates or []) + [h for hs in (named or {}).values() for h in hs]))
    measures = measure_roles(loaded, profile, benchmark, heads, n) if heads else None
    found = hd.assign_roles(measures) if heads else None
    if named:
        return Roles(named, "paper", measures, found, ranking=ranking)
    found = found or {r: None for r in ROLE_NAMES}
    return Roles({r: (found[r],) if found[r] else () for r in ROLE_NAMES}, "behaviour", measures, found, ranking=ranking)


# --- measuring what heads do -------------------------------------------------------------------

def head_maps(loaded, context: str, heads: list[Head]) -> dict[Head, np.ndarray]:
    """Each head's [T, T] attention over `context` (hidden attention for SSM heads), one pass.
    Falcon-Mamba's layers have 8192 single-channel heads: only the channels asked for are
    materialised (attention.attention_maps would build all of them)."""
    from ..adapters import MambaAdapter, unwrap
    from ..attention import attention_maps, mixer_input

    model, adapter = unwrap(loaded)
    ids = loaded.tokenizer(context, return_tensors="pt").input_ids
    layers = sorted({h.layer for h in heads})
    if not isinstance(adapter, MambaAdapter):  # heads of one channel (or a group): their hidden attention
        maps = attention_maps(loaded, ids, layers)
        return {h: maps[h.layer][0, h.head].numpy() for h in heads}
    seen = {}
    with ExitStack() as stack:
        for l in layers:
            hook = lambda m, a, kw, l=l: seen.__setitem__(l, mixer_input(a, kw))
            stack.callback(adapter.mixer(l).register_forward_pre_hook(hook, with_kwargs=True).remove)
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


def measure_roles(loaded, profile: str, benchmark: bm.Benchmark, heads: list[Head], n: int) -> pd.DataFrame:
    """What `heads` do on the first `n` prompts of `benchmark` (`measure_behaviour`), averaged over
    the prompts (`averaged`): one row per head, indexed by Head. Through one results store for
    the book, since every chapter that names roles asks this of the same candidates on the same
    prompts."""
    if benchmark.spec is None:
        raise ConfigError(f"the roles are measured on a benchmark made by `helpers.benchmarks` (one with a `spec`, "
                          f"so that its results-store cell names its items); {benchmark.name} has none")
    store = base.open_store("roles", profile, "behaviour", [loaded])
    base.hold(loaded)  # the measurement, run here, finds this model by its name
    cell = dict(model=loaded.name, items=benchmark.spec, heads=[str(h) for h in heads], n=n)
    per_prompt = pd.DataFrame(sweep(store, [cell], measure_behaviour, desc="roles: what the candidates do")[0]["rows"])
    return averaged(per_prompt.assign(head=per_prompt["head"].map(Head.parse)))


def measure_behaviour(cell: dict) -> dict:
    """Per head and prompt, `measures` of its attention (one pass a prompt) on the first `n`
    prompts of the cell's items (a measurement, `runner`)."""
    loaded = base.model_for(cell["model"])
    benchmark = bm.from_spec(cell["items"], loaded.tokenizer)
    heads = [Head.parse(h) for h in cell["heads"]]
    return {"rows": [dict(head=str(h), prompt=i, **{k: float(x) for k, x in measures(a, benchmark.segments(item)).items()})
                     for i, item in enumerate(benchmark.items[:cell["n"]])
                     for h, a in head_maps(loaded, item.pairs[0][0], heads).items()]}


def averaged(per_prompt: pd.DataFrame) -> pd.DataFrame:
    """Per-prompt measures (columns head, prompt, measures...) averaged over prompts, one row per
    head, with the 95% interval of each role measure over the prompts (columns "<measure> lo" /
    "hi"), so that a role's absence can be told from a measure too noisy to decide."""
    means = per_prompt.drop(columns="prompt").groupby("head", sort=False).mean()
    for m in ROLE_MEASURES:
        bounds = {h: mean_interval(g[m].to_numpy())[1:] for h, g in per_prompt.groupby("head", sort=False)}
        means[f"{m} lo"] = [bounds[h][0] for h in means.index]
        means[f"{m} hi"] = [bounds[h][1] for h in means.index]
    return means
