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
from .. import verdicts as v
from .. import zoo
from ..errors import ConfigError
from ..evaluate import score
from ..protocol import base, checks, loading, stores
from ..reference import paper
from ..stats import Score, difference
from ..sweep import sweep

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
        return dict(
            n_mmlu=500, k_shot=0, n_knowledge=500, n_kv=500, kv_pairs=8, kv_query="repeat", seed=0
        )

    def __post_init__(self):
        super().__post_init__()
        if self.k_shot:
            raise ConfigError(
                f"k_shot: the zoo's letter MCQ has no solved examples; use k_shot=0, not {self.k_shot}"
            )
        checks.check_kv_sizes(teacher(), "kv_pairs", [self.kv_pairs])


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
    # benchmark -> model (TEACHER, STUDENT or a hybrid) -> score
    scores: dict[str, dict[str, Score]]
    roles: dict[str, str]
    chance: dict[str, float]
    provenance: dict
    seeds: dict[str, int]  # hybrid -> the seed it was trained from (`zoo.Recipe.seed`)

    def of(self, rule: str, seed: int | None = None) -> list[str]:
        """The hybrids whose head `rule` chose (trained from `seed`; None: from any)."""
        return [h for h, r in self.rules.items() if r == rule and seed in (None, self.seeds[h])]

    @property
    def trained_from(self) -> list[int]:
        return sorted(set(self.seeds.values()))


def run(cfg: Config) -> Result:
    timer = base.Timer()
    names = {
        TEACHER: teacher(),
        STUDENT: student(),
        **{h: h for h in zoo.RECIPES if zoo.recipe(h).keep},
    }
    loaded = {name: loading.load(name) for name in names.values()}
    tok = loaded[names[STUDENT]].tokenizer
    benchmarks = [
        bm.letter_mcq(names[STUDENT], tok, cfg.profile, cfg.n_mmlu, cfg.seed, cfg.k_shot),
        bm.kv(names[STUDENT], tok, cfg.kv_pairs, cfg.n_kv, cfg.seed, cfg.kv_query),
        *bm.knowledge(names[STUDENT], cfg.profile, cfg.n_knowledge, cfg.seed),
    ]
    store = stores.open_store(cfg.chapter, cfg.profile, "scores", list(loaded.values()), measure)
    cells = [
        dict(model=name, label=label, benchmark=b.name, items=b.spec)
        for label, name in names.items()
        for b in benchmarks
    ]
    scores: dict[str, dict[str, Score]] = {}
    for r in sweep(store, cells, measure, desc="models x benchmarks"):
        scores.setdefault(r["benchmark"], {})[r["label"]] = Score.from_json(r)
    kept = {
        h: ", ".join(
            f"L{l}H{x}" for l, hs in zoo.record(h)["kept_attention"]["from"].items() for x in hs
        )
        for h in names
        if h not in (TEACHER, STUDENT)
    }
    rules = {h: zoo.recipe(h).keep_by for h in kept}
    a = loaded[names[TEACHER]].adapter
    heads = sum(a.n_heads(l) for l in a.head_layers())
    return Result(
        cfg,
        heads,
        kept,
        rules,
        scores,
        {b.name: b.role for b in benchmarks},
        {b.name: b.chance for b in benchmarks},
        base.record(cfg, list(loaded.values()), timer),
        {h: zoo.recipe(h).seed for h in kept},
    )


def measure(cell: dict) -> dict:
    """One zoo model's score on one benchmark's items (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
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
        evidence.append(
            f"{other} ({result.kept[other]}): {scores[other]}, {difference(scores[other], scores[mine])}"
        )
    return v.every(parts), f"{mine} ({result.kept[mine]}): {scores[mine]}; " + "; ".join(evidence)


def share(result: Result, hybrid: str) -> str:
    n = zoo.recipe(hybrid).keep
    return f"{n} head{'s' if n > 1 else ''} of {result.heads} ({n / result.heads:.0%})"


def over_seeds(result: Result, judge) -> tuple[str, str]:
    """A claim judged on the hybrids of each training seed (`judge(seed)` -> outcome, evidence),
    then combined (`verdicts.combine`: partly reproduced where the seeds disagree): a result of
    one distillation run is not a result of the recipe."""
    judged = [(seed, *judge(seed)) for seed in result.trained_from]
    evidence = " | ".join(
        f"seed {seed}: {outcome}: {e}" if len(judged) > 1 else e for seed, outcome, e in judged
    )
    return v.combine(o for _, o, _ in judged), evidence


def verdicts(result: Result) -> list[v.Verdict]:
    ga = lambda seed: result.of("G&A ranking", seed)[0]
    other = lambda seed: result.of("retrieval score", seed)[0]
    source = "follow-up, arXiv 2602.11374"
    seeds = (
        f" (each of {len(result.trained_from)} training seeds)"
        if len(result.trained_from) > 1
        else ""
    )
    out = []
    for b in result.retrieval:
        claim = f"{b}: keeping the G&A head recovers more than keeping a random head{seeds}"
        why = gap(result, b)
        out.append(
            v.Verdict(claim, source, v.NOT_TESTABLE, why)
            if why
            else v.Verdict(
                claim,
                source,
                *over_seeds(result, lambda s: beats(result, b, ga(s), result.of("random", s))),
            )
        )
    share_of = share(result, ga(result.trained_from[0]))
    for b in result.retrieval:
        claim = f"{b}: keeping {share_of} as attention recovers over {RECOVERED:.0%} of the teacher{seeds}"
        why = gap(result, b)
        if why:
            out.append(v.Verdict(claim, source, v.NOT_TESTABLE, why))
            continue
        t = result.scores[b][TEACHER]

        def recovers(seed):
            outcome, evidence = v.kept(
                t, result.scores[b][ga(seed)], result.chance[b], margin=(1 - RECOVERED) * t.acc
            )
            return outcome, f"{ga(seed)} ({result.kept[ga(seed)]}): {evidence}"

        out.append(v.Verdict(claim, source, *over_seeds(result, recovers)))

    def better_rule(seed):
        parts, evidence = [], []
        for b in result.retrieval:
            why = gap(result, b) or (
                f"both rules keep {result.kept[ga(seed)]}"
                if result.kept[ga(seed)] == result.kept[other(seed)]
                else ""
            )
            if why:
                parts.append(v.NOT_TESTABLE)
                evidence.append(f"{b}: not testable: {why}")
                continue
            outcome, e = beats(result, b, ga(seed), [other(seed)])
            parts.append(outcome)
            evidence.append(f"{b}: {outcome}: {e}")
        return v.combine(parts), "; ".join(evidence)

    out.append(
        v.Verdict(
            f"The G&A ranking chooses a better head to keep than the retrieval score does{seeds}",
            "control (this book)",
            *over_seeds(result, better_rule),
        )
    )
    k = base.knowledge_name(result)
    t = result.scores[k][TEACHER]

    def knowledge_kept(seed):
        outcome, evidence = v.kept(
            t, result.scores[k][ga(seed)], result.chance[k], margin=(1 - RECOVERED) * t.acc
        )
        return outcome, f"{k}: {evidence}"

    out.append(
        v.Verdict(
            f"Knowledge (the control) is kept by the G&A hybrid{seeds}",
            "control (this book)",
            *over_seeds(result, knowledge_kept),
        )
    )
    return out


# --- tables and figures --------------------------------------------------------------------------


def order(result: Result) -> list[str]:
    """Teacher, student, then the hybrids by rule (G&A, retrieval score, random draws), each
    recipe's seeds together."""
    return [
        TEACHER,
        STUDENT,
        *(h for recipe in recipes(result) for h in hybrids_of(result, recipe)),
    ]


def recipes(result: Result) -> list[str]:
    """The hybrids' recipes by rule and draw (`rule_of`: "G&A ranking", ..., "random draw 2")."""
    ranked = sorted(
        result.rules, key=lambda h: (zoo.KEEP_BY.index(result.rules[h]), zoo.recipe(h).draw)
    )
    return list(dict.fromkeys(rule_of(h) for h in ranked))


def hybrids_of(result: Result, recipe: str) -> list[str]:
    """A recipe's hybrids, one per training seed, in seed order."""
    return sorted((h for h in result.rules if rule_of(h) == recipe), key=result.seeds.get)


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
        rows.append(
            {
                "model": who,
                "head kept": result.kept.get(
                    who, f"all {result.heads}" if who == TEACHER else "none"
                ),
                "chosen by": result.rules.get(who, "-"),
                "seed": result.seeds.get(who, "-"),
                **{b: result.scores[b][who] for b in result.scores},
                "retrieval recovered": float(np.mean([recovery(result, b, who) for b in tasks]))
                if tasks
                else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def spread_table(result: Result) -> pd.DataFrame:
    """Each recipe over its training seeds: per task the mean accuracy and the lowest and highest
    seed's, and the retrieval recovered likewise: how much of a difference between rules one
    distillation run's luck could make."""
    tasks = testable(result)
    rows = []
    for recipe in recipes(result):
        hybrids = hybrids_of(result, recipe)
        row = {
            "kept by": recipe,
            "seeds": len(hybrids),
            "heads kept": ", ".join(result.kept[h] for h in hybrids),
        }
        for b in result.scores:
            accs = [result.scores[b][h].acc for h in hybrids]
            row[b] = f"{np.mean(accs):.1%} ({min(accs):.1%} to {max(accs):.1%})"
        if tasks:
            rec = [float(np.mean([recovery(result, b, h) for b in tasks])) for h in hybrids]
            row["retrieval recovered"] = f"{np.mean(rec):.0%} ({min(rec):.0%} to {max(rec):.0%})"
        rows.append(row)
    return pd.DataFrame(rows)


def spread_rows(result: Result) -> pd.DataFrame:
    """What `spread_table` summarises, as numbers: each recipe's hybrids, one per training seed,
    with each task's accuracy and the retrieval recovered (its download)."""
    tasks = testable(result)
    return pd.DataFrame(
        [
            {
                "kept by": recipe,
                "hybrid": h,
                "seed": result.seeds[h],
                "head kept": result.kept[h],
                **{b: result.scores[b][h].acc for b in result.scores},
                **(
                    {"retrieval recovered": float(np.mean([recovery(result, b, h) for b in tasks]))}
                    if tasks
                    else {}
                ),
            }
            for recipe in recipes(result)
            for h in hybrids_of(result, recipe)
        ]
    )


def percent(x: float) -> str:
    return "-" if np.isnan(x) else f"{x:.0%}"


def comparison(result: Result) -> pd.DataFrame:
    tasks = testable(result)
    ga = hybrids_of(result, "G&A ranking")

    def recovered(recipe: str) -> str:
        """Per retrieval task, the recipe's recovery: the mean over its seeds, and their range."""
        hybrids = hybrids_of(result, recipe)
        if len(hybrids) == 1:
            return "; ".join(
                f"{b}: {percent(recovery(result, b, hybrids[0])) if b in tasks else 'not testable'}"
                for b in result.retrieval
            )
        said = []
        for b in result.retrieval:
            rec = [recovery(result, b, h) for h in hybrids]
            said.append(
                f"{b}: {percent(float(np.mean(rec)))} ({percent(min(rec))} to {percent(max(rec))} over "
                f"{len(rec)} seeds)"
                if b in tasks
                else f"{b}: not testable"
            )
        return "; ".join(said)

    heads = lambda recipe: ", ".join(
        dict.fromkeys(result.kept[h] for h in hybrids_of(result, recipe))
    )
    return base.comparison_table(
        [
            (
                "models",
                "Llama-3 / Qwen teachers distilled into hybrids (follow-up)",
                "not released here",
                f"{teacher()} distilled into {student()}'s mixers, one head kept ({result.cfg.profile} profile: the zoo), "
                f"each hybrid from {len(result.trained_from)} training seed(s)",
            ),
            (
                "attention kept",
                str(paper("retrieval_aware", "kept_attention_fraction")),
                "-",
                f"{share(result, ga[0])}: the G&A ranking keeps {heads('G&A ranking')}",
            ),
            (
                f"retrieval recovered, keeping {heads('G&A ranking')} (G&A)",
                str(paper("retrieval_aware", "retrieval_recovery")),
                "-",
                recovered("G&A ranking"),
            ),
            *(
                (f"... keeping {heads(r)} ({r}) instead", "-", "-", recovered(r))
                for r in recipes(result)[1:]
            ),
            (
                "earlier hybrids' attention",
                str(paper("retrieval_aware", "earlier_hybrids_attention_fraction")),
                "-",
                "not run",
            ),
        ]
    )


def rule_of(hybrid: str) -> str:
    """ "retrieval score", "random draw 0"."""
    r = zoo.recipe(hybrid)
    return f"random draw {r.draw}" if r.keep_by == "random" else r.keep_by


def subject(result: Result) -> str:
    return (
        f"on the zoo ({result.cfg.profile} profile): {teacher()}, its student and the hybrids that keep "
        f"one of its heads"
    )


def figure(result: Result):
    """Accuracy of each model on each task: the teacher and the student as bars with 95%
    intervals; each hybrid recipe as a bar at its seeds' mean with one dot per seed; chance
    dotted."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    groups = [[TEACHER], [STUDENT], *(hybrids_of(result, r) for r in recipes(result))]
    tasks = list(result.scores)
    rule_colour = {"G&A ranking": "tab:red", "retrieval score": "tab:purple", "random": "tab:blue"}
    colour = lambda who: (
        {TEACHER: "0.3", STUDENT: "0.65"}.get(who) or rule_colour[result.rules[who]]
    )
    fig, axes = plt.subplots(
        len(tasks), 1, figsize=(plots.WIDTH, 2.3 * len(tasks) + 0.9), squeeze=False, sharex=True
    )
    for ax, b in zip(axes[:, 0], tasks):
        for x, group in enumerate(groups):
            s = [result.scores[b][w] for w in group]
            acc = 100 * np.array([score.acc for score in s])
            if len(group) == 1 and group[0] in (TEACHER, STUDENT):
                ax.bar(
                    x,
                    acc[0],
                    yerr=[[acc[0] - 100 * s[0].lo], [100 * s[0].hi - acc[0]]],
                    capsize=2,
                    color=colour(group[0]),
                )
            else:
                ax.bar(x, acc.mean(), color=colour(group[0]), alpha=0.55)
                ax.scatter(
                    x + np.linspace(-0.2, 0.2, len(acc)),
                    acc,
                    s=14,
                    color=colour(group[0]),
                    zorder=3,
                )
        ax.axhline(100 * result.chance[b], ls=":", lw=1.2, color="0.35", label="chance")
        ax.set(title=b, ylabel="accuracy (%)", ylim=(0, 105))
    labels = [
        "teacher",
        "student",
        *(
            r.replace("random draw ", "random ")
            .replace("G&A ranking", "G&A")
            .replace("retrieval score", "retrieval")
            for r in recipes(result)
        ),
    ]
    axes[-1, 0].set_xticks(range(len(groups)), labels, fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in rule_colour.values()]
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.legend(
        handles + axes[0, 0].get_legend_handles_labels()[0],
        ["G&A head kept", "retrieval-score head kept", "random head kept", "chance"],
        loc="lower center",
        ncols=2,
        frameon=False,
    )
    return fig
