"""Retrieval-aware distillation at toy scale: which heads should a distilled hybrid keep?

The authors' follow-up (Bick, Xing, Gu, arXiv 2602.11374) distils a Transformer into a hybrid
that keeps about 2% of its attention heads, the ones the G&A KV probe ranks highest, and turns
the rest into recurrent mixers; it reports over 95% of the teacher on retrieval-heavy tasks,
where earlier hybrids keep 25% or more of their attention. The zoo has the experiment in small
(`helpers.zoo`: the `toy-rad-*` recipes): from the zoo's Transformer, the MOHAWK student with
one of the teacher's 16 heads (6%) kept as attention, chosen by the G&A ranking (zeroing the head
raises the KV answer's loss most), by another ranking, the retrieval score of Wu et al. (arXiv
2404.15574: the head whose attention from the answer's position rests most on the value it
copies), and at random (three draws). Every hybrid has the same mixers, the same
distillation and the same data; only the kept head differs. The heads were chosen on KV prompts
that no score here draws from.

This chapter scores the teacher, the plain student (no head kept) and every hybrid on the same
items of retrieval (KV, the letter MCQ) and knowledge, paired. The zoo is the same on every
profile (no follow-up checkpoint is in the registry), so is this page.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import zoo
from .. import verdicts as v
from ..errors import ConfigError
from ..evaluate import score
from ..reference import paper
from ..stats import Score, difference
from ..sweep import sweep
from ..protocol import base

TEACHER, STUDENT = "teacher", "student (no head kept)"
RECOVERED = 0.95  # the follow-up's "over 95% of the teacher" (data/reference: retrieval_aware)


def hybrids_by(rule: str) -> list[str]:
    return [name for name, r in zoo.RECIPES.items() if r.keep and r.keep_by == rule]


@dataclass(frozen=True)
class Config(base.BenchmarkConfig):
    chapter = "retrieval_aware"
    smoke_sizes = dict(n_mmlu=8, n_knowledge=8, n_kv=8)

    @classmethod
    def defaults(cls, profile):
        # The zoo is the CPU tier: the same models and sizes whatever the profile.
        return dict(n_mmlu=500, k_shot=0, n_knowledge=500, n_kv=500, kv_pairs=8, kv_query="repeat", seed=0)

    def __post_init__(self):
        super().__post_init__()
        if self.k_shot:
            raise ConfigError(f"k_shot: the zoo's letter MCQ has no solved examples; use k_shot=0, not {self.k_shot}")
        base.check_kv_sizes(teacher(), "kv_pairs", [self.kv_pairs])


def teacher() -> str:
    return zoo.recipe(hybrids_by("G&A ranking")[0]).teacher


def student() -> str:
    return next(n for n, r in zoo.RECIPES.items() if r.teacher == teacher() and not r.keep)


@dataclass(frozen=True)
class Result(base.ByRole):
    cfg: Config
    heads: int  # the teacher's attention heads
    kept: dict[str, str]  # hybrid -> the teacher head it keeps ("L1H2"), and the rule that chose it
    rules: dict[str, str]  # hybrid -> "G&A ranking", "retrieval score" or "random"
    scores: dict[str, dict[str, Score]]  # benchmark -> model (TEACHER, STUDENT or a hybrid) -> score
    roles: dict[str, str]
    chance: dict[str, float]
    provenance: dict

    def of(self, rule: str) -> list[str]:
        return [h for h, r in self.rules.items() if r == rule]


def run(cfg: Config) -> Result:
    timer = base.Timer()
    names = {TEACHER: teacher(), STUDENT: student(), **{h: h for h in zoo.RECIPES if zoo.recipe(h).keep}}
    loaded = {name: base.load(name) for name in names.values()}
    tok = loaded[names[STUDENT]].tokenizer
    benchmarks = [bm.letter_mcq(names[STUDENT], tok, cfg.profile, cfg.n_mmlu, cfg.seed, cfg.k_shot),
                  bm.kv(names[STUDENT], tok, cfg.kv_pairs, cfg.n_kv, cfg.seed, cfg.kv_query),
                  *bm.knowledge(names[STUDENT], cfg.profile, cfg.n_knowledge, cfg.seed)]
    store = base.open_store(cfg.chapter, cfg.profile, "scores", list(loaded.values()))
    cells = [dict(model=name, label=label, benchmark=b.name, items=b.spec) for label, name in names.items() for b in benchmarks]
    scores: dict[str, dict[str, Score]] = {}
    for r in sweep(store, cells, measure, desc="models x benchmarks"):
        scores.setdefault(r["benchmark"], {})[r["label"]] = Score.from_json(r)
    kept = {h: ", ".join(f"L{l}H{x}" for l, hs in zoo.record(h)["kept_attention"]["from"].items() for x in hs)
            for h in names if h not in (TEACHER, STUDENT)}
    rules = {h: zoo.recipe(h).keep_by for h in kept}
    a = loaded[names[TEACHER]].adapter
    heads = sum(a.n_heads(l) for l in a.head_layers())
    return Result(cfg, heads, kept, rules, scores, {b.name: b.role for b in benchmarks}, {b.name: b.chance for b in benchmarks},
                  base.record(cfg, list(loaded.values()), timer))


def measure(cell: dict) -> dict:
    """One zoo model's score on one benchmark's items (a measurement, `runner`)."""
    loaded = base.model_for(cell["model"])
    items = bm.from_spec(cell["items"], loaded.tokenizer).items
    with zoo.one_thread():  # as in training, so that equal inputs give bit-equal logits
        return score(loaded.model, loaded.tokenizer, items).to_json()


# --- verdicts ---------------------------------------------------------------------------------------

def gap(result: Result, b: str) -> str:
    """Why `b` cannot test a recovery claim ("" when it can): the teacher must clear chance, and
    the plain student must trail it by more than the follow-up's 5% (paired)."""
    t, s, chance = result.scores[b][TEACHER], result.scores[b][STUDENT], result.chance[b]
    if not t.above(chance):
        return f"the teacher cannot do it: {t}, chance {chance:.0%}"
    outcome, evidence = v.kept(t, s, chance, margin=(1 - RECOVERED) * t.acc)
    if outcome == v.REPRODUCED:
        return f"nothing to recover: the plain student already keeps the teacher's {b} ({evidence})"
    if outcome == v.INCONCLUSIVE:
        return f"the plain student's loss cannot be told from the {1 - RECOVERED:.0%} margin ({evidence})"
    return ""


def beats(result: Result, b: str, mine: str, others: list[str]) -> tuple[str, str]:
    """Is `mine` above each of `others` on `b` (paired)? Reproduced when above all, not
    reproduced when any lies above it, inconclusive otherwise."""
    scores = result.scores[b]
    parts, evidence = [], []
    for other in others:
        if result.kept[other] == result.kept[mine]:  # a draw that keeps the same head is no rival
            evidence.append(f"{other} keeps the same head, not compared")
            continue
        outcome, _ = v.lower(scores[mine], scores[other])  # reproduced: `other` is below `mine`
        parts.append(outcome)
        evidence.append(f"{other} ({result.kept[other]}): {scores[other]}, {difference(scores[other], scores[mine])}")
    return v.every(parts), f"{mine} ({result.kept[mine]}): {scores[mine]}; " + "; ".join(evidence)


def share(result: Result, hybrid: str) -> str:
    n = zoo.recipe(hybrid).keep
    return f"{n} head{'s' if n > 1 else ''} of {result.heads} ({n / result.heads:.0%})"


def verdicts(result: Result) -> list[v.Verdict]:
    ga, other, randoms = result.of("G&A ranking")[0], result.of("retrieval score")[0], result.of("random")
    out = []
    for b in result.retrieval:
        why = gap(result, b)
        claim = f"{b}: keeping the G&A head recovers more than keeping a random head"
        if why:
            out.append(v.Verdict(claim, "follow-up, arXiv 2602.11374", v.NOT_TESTABLE, why))
        else:
            out.append(v.Verdict(claim, "follow-up, arXiv 2602.11374", *beats(result, b, ga, randoms)))
    for b in result.retrieval:
        why = gap(result, b)
        claim = f"{b}: keeping {share(result, ga)} as attention recovers over {RECOVERED:.0%} of the teacher"
        if why:
            out.append(v.Verdict(claim, "follow-up, arXiv 2602.11374", v.NOT_TESTABLE, why))
            continue
        t = result.scores[b][TEACHER]
        outcome, evidence = v.kept(t, result.scores[b][ga], result.chance[b], margin=(1 - RECOVERED) * t.acc)
        out.append(v.Verdict(claim, "follow-up, arXiv 2602.11374", outcome, f"{ga} ({result.kept[ga]}): {evidence}"))
    parts, evidence = [], []
    for b in result.retrieval:
        why = gap(result, b) or (f"both rules keep {result.kept[ga]}" if result.kept[ga] == result.kept[other] else "")
        if why:
            parts.append(v.NOT_TESTABLE)
            evidence.append(f"{b}: not testable: {why}")
            continue
        outcome, e = beats(result, b, ga, [other])
        parts.append(outcome)
        evidence.append(f"{b}: {outcome}: {e}")
    out.append(v.Verdict("The G&A ranking chooses a better head to keep than the retrieval score does", "control (this book)",
                         v.combine(parts), " | ".join(evidence)))
    k = base.knowledge_name(result)
    t = result.scores[k][TEACHER]
    outcome, evidence = v.kept(t, result.scores[k][ga], result.chance[k], margin=(1 - RECOVERED) * t.acc)
    out.append(v.Verdict("Knowledge (the control) is kept by the G&A hybrid", "control (this book)", outcome,
                         f"{k}: {evidence}"))
    return out


# --- tables and figures --------------------------------------------------------------------------

def order(result: Result) -> list[str]:
    """Teacher, student, then the hybrids by rule (G&A, retrieval score, random draws)."""
    return [TEACHER, STUDENT, *(h for rule in zoo.KEEP_BY for h in result.of(rule))]


def recovery(result: Result, b: str, who: str) -> float:
    """(accuracy - chance) / (teacher - chance): 0 at chance, 1 at the teacher."""
    chance, t = result.chance[b], result.scores[b][TEACHER].acc
    return (result.scores[b][who].acc - chance) / (t - chance) if t > chance else float("nan")


def testable(result: Result) -> list[str]:
    """The retrieval tasks that can test a recovery claim (`gap`)."""
    return [b for b in result.retrieval if not gap(result, b)]


def scores_table(result: Result) -> pd.DataFrame:
    """Every model's accuracy on each task, with the head it keeps and the rule that chose it,
    and its retrieval recovered (the mean of `recovery` over the tasks that can test it)."""
    tasks = testable(result)
    rows = []
    for who in order(result):
        rows.append({"model": who, "head kept": result.kept.get(who, f"all {result.heads}" if who == TEACHER else "none"),
                     "chosen by": result.rules.get(who, "-"),
                     **{b: result.scores[b][who].brief for b in result.scores},
                     "retrieval recovered": float(np.mean([recovery(result, b, who) for b in tasks])) if tasks else float("nan")})
    return pd.DataFrame(rows)


def percent(x: float) -> str:
    return "-" if np.isnan(x) else f"{x:.0%}"


def comparison(result: Result) -> pd.DataFrame:
    ga, tasks = result.of("G&A ranking")[0], testable(result)

    def recovered(who: str) -> str:
        return "; ".join(f"{b}: {percent(recovery(result, b, who)) if b in tasks else 'not testable'}"
                         for b in result.retrieval)

    return base.comparison_table([
        ("models", "Llama-3 / Qwen teachers distilled into hybrids (follow-up)", "not released here",
         f"{teacher()} distilled into {student()}'s mixers, one head kept ({result.cfg.profile} profile: the zoo)"),
        ("attention kept", str(paper("retrieval_aware", "kept_attention_fraction")), "-",
         f"{share(result, ga)}: {ga} keeps {result.kept[ga]}"),
        (f"retrieval recovered, keeping {result.kept[ga]} (G&A)", str(paper("retrieval_aware", "retrieval_recovery")), "-",
         recovered(ga)),
        *((f"... keeping {result.kept[h]} ({rule_of(h)}) instead", "-", "-", recovered(h)) for h in order(result)[3:]),
        ("earlier hybrids' attention", str(paper("retrieval_aware", "earlier_hybrids_attention_fraction")), "-",
         "not run"),
    ])


def rule_of(hybrid: str) -> str:
    """"retrieval score", "random draw 0"."""
    r = zoo.recipe(hybrid)
    return f"random draw {r.draw}" if r.keep_by == "random" else r.keep_by


def subject(result: Result) -> str:
    return (f"on the zoo ({result.cfg.profile} profile): {teacher()}, its student and the hybrids that keep "
            f"one of its heads")


def figure(result: Result):
    """Accuracy of each model on each task (bars, 95% intervals), chance dotted."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    who = order(result)
    tasks = list(result.scores)
    colours = {TEACHER: "0.3", STUDENT: "0.65", **{h: {"G&A ranking": "tab:red", "retrieval score": "tab:purple",
                                                        "random": "tab:blue"}[r] for h, r in result.rules.items()}}
    fig, axes = plt.subplots(len(tasks), 1, figsize=(plots.WIDTH, 2.3 * len(tasks) + 0.9), squeeze=False, sharex=True)
    for ax, b in zip(axes[:, 0], tasks):
        s = [result.scores[b][w] for w in who]
        acc = np.array([x.acc for x in s])
        err = [100 * (acc - [x.lo for x in s]), 100 * (np.array([x.hi for x in s]) - acc)]
        ax.bar(range(len(who)), 100 * acc, yerr=err, capsize=2, color=[colours[w] for w in who])
        ax.axhline(100 * result.chance[b], ls=":", lw=1.2, color="0.35", label="chance")
        ax.set(title=b, ylabel="accuracy (%)", ylim=(0, 105))
    labels = ["teacher", "student", *(f"{w.removeprefix('toy-rad-')}\n{result.kept[w]}" for w in who[2:])]
    axes[-1, 0].set_xticks(range(len(who)), labels, fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:red", "tab:purple", "tab:blue")]
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.legend(handles + axes[0, 0].get_legend_handles_labels()[0],
               ["G&A head kept", "retrieval-score head kept", "random head kept", "chance"], loc="lower center", ncols=2,
               frameon=False)
    return fig
