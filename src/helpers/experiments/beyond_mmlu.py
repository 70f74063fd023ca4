"""Beyond MMLU (the paper's §6 and Table 2): the KV ranking's top heads zeroed on generative tasks,
scored by lm-eval itself.

The claim: the heads that bottleneck MMLU-style retrieval (the top of the KV-retrieval ranking,
Table 5) also bottleneck tasks that are not multiple-choice letters: GSM8K, BBH, ARC-Challenge in
chat format and SWDE (Table 2). The chapter scores every task three ways, on the same items:
clean, the ranking's `n_heads` top heads zeroed together, and `n_controls` random sets of as many
heads from the same layers (distinct sets, drawn with `seed`). Every task runs through
`helpers.lmeval.evaluate`: lm-eval's own task definition, prompt, stop sequences, filters and
metric (exact match; SWDE's own metric is `contains`), greedy decoding, batched generation; a
task named `*_chat` in the model's chat template (`chat`). lm-eval's per-item records
(`log_samples`) give each item's right or wrong, so conditions are compared item by item
(paired).

Which heads: on the paper profiles the book's shared KV ranking (`shared.kv_ranking`, the one the
head-zeroing, KV-retrieval, attention-map and masking chapters read). On the CPU profile
Qwen2.5-Coder-1.5B-Instruct would need hours for that ranking on 2 cores, so the chapter ranks
cheaply (`ranking="screen"`): the screen's estimate in one pass (`screen.attribution`, alpha 1)
on `n_rank` KV prompts of `kv_pairs` keys, then the `n_heads + CONFIRM_MORE` best estimates each
zeroed exactly on the same prompts; the most harmful of those are the top heads. (At the shared
ranking's 8 keys Qwen retrieved 92.5% of 40 prompts, and none of the screen's 6 best heads
zeroed moved that; at 16 keys 85.0%, its best two zeroed 82.5%.) Every claim of the page rests on
a premise measured on prompts the ranking did not see: that the heads, zeroed together, lower KV
retrieval there (`TopHeads.carry_retrieval`); where they do not, they are not shown to be
retrieval heads, and what zeroing them does to other tasks is not testable.

A task can test the claim only if the clean model does it: for open answers chance is 0, so each
task has a stated floor (`FLOOR`, or its guessing rate for letter answers) that the clean score's
whole interval must clear (`verdicts.testable`). The book's own CPU tasks were tried on the CPU
model before their answers were fixed, and made harder until none sat at its ceiling
(`data/lm_eval_tasks/generate.py` says what each first gave).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import benchmarks as bm
from .. import heads as hd
from .. import registry
from .. import verdicts as v
from ..engine import SweepEngine
from ..errors import ConfigError
from ..heads import Head
from ..protocol import base, checks, fields, loading, shared, stores
from ..reference import paper
from ..screen import attribution, gradient_batch_tokens
from ..specs import Spec
from ..stats import Score
from ..sweep import sweep

PAPER_TASKS = ("gsm8k", "bbh", "arc_challenge_chat", "swde")  # lm-eval's names (Table 2's tasks)
CPU_TASKS = ("arithmetic_words", "page_field", "dialogue_fact", "choice_chat")  # data/lm_eval_tasks
# What each of the book's own tasks stands in for on the CPU profile.
ANALOGUE = {
    "arithmetic_words": "GSM8K",
    "page_field": "SWDE",
    "dialogue_fact": "dialogue comprehension (abstract)",
    "choice_chat": "arc_challenge_chat",
}
FLOOR = (
    0.05  # open answers: chance is 0, so a task tests the claim only if clean's interval clears 5%
)
# Tasks answered by one of a few letters or words: a guess scores this often. BBH mixes two-way
# questions (boolean expressions, navigate, web of lies) with 3- to 7-way ones and free answers:
# its floor is the highest of its subtasks' guessing rates.
GUESS = {"arc_challenge_chat": 0.25, "choice_chat": 0.25, "bbh": 0.5}
CLEAN, TOP = "clean", "top heads zeroed"
CONFIRM_MORE = 2  # the cheap ranking zeroes exactly this many candidates beyond n_heads


def control(i: int) -> str:
    return f"random heads #{i + 1}"


def chat(task: str) -> bool:
    """Whether `task` is scored in the model's chat template: lm-eval names a task meant for one
    `<task>_chat` (arc_challenge_chat, as Llama's instruct models are evaluated; the book's
    choice_chat after it). Other tasks get their plain prompt, as lm-eval runs them by default."""
    return task.endswith("_chat")


def floor(task: str) -> float:
    """The clean score's interval must clear this for `task` to test the claim."""
    return GUESS.get("bbh" if task.startswith("bbh") else task, FLOOR)


# --- the config --------------------------------------------------------------------------------


def tasks_field():
    """lm-eval task names or the book's own tasks (checked against lm-eval's index when the run
    starts, by `helpers.lmeval.resolve_tasks`; here: a non-empty list of distinct names)."""

    def check(name, value):
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(
                f"{name} must be a list of lm-eval task names, got {value!r} (with papermill, pass a "
                f"list as YAML: -y '{name}: [gsm8k, bbh]')"
            )
        values = tuple(value)
        if not values or not all(isinstance(t, str) and t.strip() for t in values):
            raise ConfigError(
                f"{name} must list lm-eval task names, e.g. ['gsm8k', 'bbh'], got {list(values)}"
            )
        if twice := sorted({t for t in values if values.count(t) > 1}):
            raise ConfigError(
                f"{name} lists {', '.join(twice)} more than once: list each task once"
            )
        return values

    return dataclasses.field(metadata={"check": check})  # read by base.Config.__post_init__


@dataclass(frozen=True)
class Config(base.Config):
    model: str = fields.model("attention", "ssm", "hybrid")
    tasks: tuple[str, ...] = tasks_field()
    # items per task (lm-eval's limit; per subtask of a group); None: all
    n: int | None = fields.count(optional=True)
    bbh_subtasks: int | None = fields.count(
        optional=True
    )  # BBH: its first k subtasks (None: all 27)
    n_heads: int = fields.count()  # the ranking's top heads, zeroed together
    ranking: str = fields.one_of("shared", "screen")
    n_rank: int = fields.count()  # KV prompts of the cheap ranking ("screen")
    # keys per prompt ("screen")
    kv_pairs: int | None = fields.count(optional=True, none_means="the shared ranking's")
    n_controls: int = fields.count()
    max_gen_toks: int | None = fields.count(optional=True)  # None: each task's own
    batch_size: int = fields.count()
    seed: int = fields.seed()

    chapter = "beyond_mmlu"
    smoke_sizes = dict(
        n=1,
        bbh_subtasks=2,
        n_heads=2,
        n_rank=shared.SMOKE["n"],
        kv_pairs=None,
        n_controls=1,
        max_gen_toks=8,
    )

    @classmethod
    def defaults(cls, profile):
        common = dict(n_heads=4, seed=0, bbh_subtasks=None)
        if profile == "cpu":
            # Qwen-1.5B in bfloat16 reads about 350 prompt tokens a second on 2 cores (measured alone), and the
            # four tasks' prompts hold some 60,000 tokens at 100 items each: about 3.5 minutes per condition.
            # So 100 items (a loss of about 7 points is then detected at these clean scores, `power_table`),
            # clean, the top heads and one random set; the ranking on 40 KV prompts.
            return dict(
                model=registry.cast(profile, "letters"),
                tasks=CPU_TASKS,
                n=100,
                ranking="screen",
                n_rank=40,
                kv_pairs=16,
                n_controls=1,
                max_gen_toks=None,
                batch_size=32,
                **common,
            )
        return dict(
            model=registry.cast(profile, "letters"),
            tasks=PAPER_TASKS,
            n=None,
            ranking="shared",
            n_rank=200,
            kv_pairs=None,
            n_controls=3,
            max_gen_toks=None,
            batch_size=16,
            **common,
        )

    def __post_init__(self):
        super().__post_init__()
        from ..lmeval import check_model

        # a model lm-eval's HFLM can drive (not the toy zoo, not our Llamba)
        check_model(self.model)
        if self.kv_pairs is not None:
            if self.ranking == "shared":
                raise ConfigError(
                    f"kv_pairs sets the cheap ranking's prompts (ranking='screen'); the shared ranking's "
                    f"are the book's, shared with other chapters: leave kv_pairs None, not {self.kv_pairs}"
                )
            checks.check_kv_sizes(self.model, "kv_pairs", [self.kv_pairs])


# --- the heads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopHeads:
    heads: tuple[Head, ...]  # most harmful first
    table: pd.DataFrame  # `heads.ranking_table`: the measured heads first
    clean: Score  # KV accuracy with no head zeroed, on the ranking's prompts
    chance: float  # of the ranking's KV prompts
    how: str  # which ranking, in words
    held_clean: Score  # KV accuracy on HELD_OUT prompts the ranking did not see, no head zeroed
    held_zeroed: Score  # the same prompts with `heads` zeroed together

    def carry_retrieval(self) -> tuple[str, str]:
        """The premise of every claim of the page: do the heads zeroed carry retrieval? Zeroed
        together, they lower KV accuracy on prompts the ranking did not see (`verdicts.falls`,
        paired): heads picked on one set of prompts are tested on another."""
        outcome, evidence = v.falls(self.held_clean, self.held_zeroed, self.chance)
        return (
            outcome,
            f"KV retrieval on {self.held_clean.n} held-out prompts, the top heads zeroed: {evidence}",
        )


HELD_OUT = 100  # KV prompts after the ranking's, for its premise (`TopHeads.carry_retrieval`)


def top_heads(cfg: Config, loaded) -> TopHeads:
    """The ranking's `n_heads` most harmful heads, exactly measured: the shared KV ranking, or the
    cheap one (see the module's docstring); and what zeroing them together does to KV retrieval
    on HELD_OUT prompts after the ranking's, through this chapter's store."""
    s = shared.ranking_settings(cfg.profile, cfg.smoke)
    kv = dict(
        pairs=cfg.kv_pairs or s["pairs"],
        query=s["query"],
        form=s["form"],
        seed=s["seed"],
        n=cfg.n_rank if cfg.ranking == "screen" else s["n"],
    )
    store = stores.open_store(
        cfg.chapter, cfg.profile, "ranking", [loaded], (measure_ranking, measure_held_out)
    )
    if cfg.ranking == "shared":
        r = shared.kv_ranking(loaded, cfg.profile, cfg.smoke)
        table, clean = r.table, r.clean
        how = (
            f"the book's shared KV ranking ({kv['pairs']} keys, {kv['n']} prompts; the screen, then the layers of "
            f"its top {s['top']} heads swept exactly)"
        )
    else:
        row = sweep(
            store,
            [dict(model=cfg.model, **kv, confirm=cfg.n_heads + CONFIRM_MORE)],
            measure_ranking,
            desc="KV ranking (screen)",
        )[0]
        estimate = {Head(l, h): e for l, h, e in row["estimate"]}
        table = hd.ranking_table(
            estimate, {Head.parse(k): Score.from_json(x) for k, x in row["exact"].items()}
        )
        clean = Score.from_json(row["clean"])
        how = (
            f"the screen's estimate on {cfg.n_rank} KV prompts ({kv['pairs']} keys; one pass, alpha 1), its "
            f"{cfg.n_heads + CONFIRM_MORE} best candidates then zeroed one at a time on the same prompts"
        )
    heads = tuple(hd.measured(table)[: cfg.n_heads])
    if len(heads) < cfg.n_heads:
        raise ConfigError(
            f"n_heads={cfg.n_heads}, but the ranking measured only {len(heads)} heads exactly: "
            f"set n_heads to at most {len(heads)}"
        )
    held = dict(
        model=cfg.model,
        **{**kv, "n": HELD_OUT if not cfg.smoke else shared.SMOKE["n"]},
        skip=kv["n"],
        spec=str(Spec(zero=heads)),
    )
    row = sweep(store, [held], measure_held_out, desc="KV on held-out prompts")[0]
    return TopHeads(
        heads,
        table,
        clean,
        1 / kv["pairs"],
        how,
        Score.from_json(row["clean"]),
        Score.from_json(row["zeroed"]),
    )


def measure_ranking(cell: dict) -> dict:
    """The cheap ranking (a measurement, `runner`): the screen's estimate of every head in one
    pass (alpha 1) on the cell's KV prompts, then its `confirm` best candidates zeroed one at a
    time on the same prompts."""
    loaded = loading.model_for(cell["model"])
    items = bm.kv_of(cell, loaded.tokenizer).items
    engine = SweepEngine(
        loaded, loaded.tokenizer, items, batch_tokens=gradient_batch_tokens(loaded.model)
    )
    estimate = attribution(engine, alpha=1.0)
    confirm = sorted(estimate, key=estimate.get)[: cell["confirm"]]
    exact = engine.score_each({str(h): Spec(zero=(h,)) for h in confirm})
    return {
        "clean": engine.score().to_json(),
        "estimate": [[h.layer, h.head, e] for h, e in estimate.items()],
        "exact": {k: s.to_json() for k, s in exact.items()},
    }


def measure_held_out(cell: dict) -> dict:
    """KV accuracy on the cell's `n` prompts after the ranking's `skip` (the same seed's stream:
    prompts the ranking did not see), clean and under the cell's spec (its heads zeroed together; a
    measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    kv = shared.held_out_kv(
        loaded.name,
        loaded.tokenizer,
        cell["n"],
        cell["skip"],
        cell["pairs"],
        cell["seed"],
        cell["query"],
        cell["form"],
    )
    engine = SweepEngine(loaded, loaded.tokenizer, kv.items)
    zeroed = Spec.parse(cell["spec"])
    return {"clean": engine.score().to_json(), "zeroed": engine.score(zeroed).to_json()}


def controls(
    top: TopHeads, n_heads: dict[int, int], n_controls: int, seed: int
) -> list[tuple[Head, ...]]:
    """`n_controls` distinct random sets of as many heads as `top` holds, from the top heads'
    layers (all layers where those hold too few for so many distinct sets), never one of the ranking's most harmful heads
    (its top twice as many: a control must not hold the next bottleneck)."""
    taken = set(hd.measured(top.table)[: 2 * len(top.heads)]) | set(top.heads)
    size = len(top.heads)
    for layers in (sorted({h.layer for h in top.heads}), sorted(n_heads)):
        pool = [Head(l, h) for l in layers for h in range(n_heads[l]) if Head(l, h) not in taken]
        if math.comb(len(pool), size) >= n_controls:  # room for n_controls distinct sets
            break
    rng = np.random.default_rng(seed)
    drawn: list[tuple[Head, ...]] = []
    for _ in range(100 * n_controls):
        if len(drawn) == n_controls:
            break
        pick = tuple(sorted(pool[i] for i in rng.choice(len(pool), size, replace=False)))
        if pick not in drawn:
            drawn.append(pick)
    return drawn


# --- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskScore:
    score: Score  # per item, in (subtask, doc_id) order: the same items under every condition
    metric: (
        str  # lm-eval's metric and filter, as its results name them ("exact_match,strict-match")
    )
    lm_eval: float  # lm-eval's own aggregate of that metric
    n_shot: int | None


@dataclass(frozen=True)
class Result:
    cfg: Config
    top: TopHeads
    controls: list[tuple[Head, ...]]
    scores: dict[str, dict[str, TaskScore]]  # task -> condition -> score
    subtasks: dict[str, list[str]]  # a group task -> the subtasks it ran
    provenance: dict

    @property
    def conditions(self) -> list[str]:
        return [CLEAN, TOP] + [control(i) for i in range(len(self.controls))]

    def score(self, task: str, condition: str) -> Score:
        return self.scores[task][condition].score

    def control_scores(self, task: str) -> list[Score]:
        return [self.score(task, control(i)) for i in range(len(self.controls))]


def expand(task: str, bbh_subtasks: int | None, task_manager) -> list[str]:
    """What lm-eval runs for one of the chapter's tasks: the task itself, or BBH's first
    `bbh_subtasks` subtasks (lm-eval's order) where the group is cut short."""
    if task != "bbh" or bbh_subtasks is None:
        return [task]
    names = list(task_manager.task_index["bbh"].cfg["task"])  # lm-eval's own order (alphabetical)
    if bbh_subtasks > len(names):
        raise ConfigError(
            f"bbh_subtasks must be at most the {len(names)} subtasks of bbh, got {bbh_subtasks}"
        )
    return names[:bbh_subtasks]


def members(name: str, task_manager) -> list[str]:
    """The tasks whose per-item records lm-eval keeps for `name`: a group's subtasks, else itself."""
    entry = task_manager.task_index.get(name)
    return list(entry.cfg["task"]) if entry is not None and "group" in entry.cfg else [name]


def per_item(results: dict, names: list[str], aggregate: str | None = None) -> TaskScore:
    """Each item's right or wrong from lm-eval's per-item records of the tasks `names`, for the
    first metric under the first filter (lm-eval's order: gsm8k's strict-match), the items of
    every subtask in (subtask, doc_id) order; and lm-eval's own aggregate of that metric (of the
    task or group `aggregate`; where lm-eval computed none, a group cut short, the pooled mean)."""
    correct, key = [], None
    for name in sorted(names):
        samples = results["samples"][name]
        filters = list(dict.fromkeys(s["filter"] for s in samples))
        chosen = [s for s in samples if s["filter"] == filters[0]]
        metric = chosen[0]["metrics"][0]
        key = key or f"{metric},{filters[0]}"
        correct += [float(s[metric]) >= 0.5 for s in sorted(chosen, key=lambda s: s["doc_id"])]
    score = Score.of(correct)
    own = results["results"].get(aggregate, {}).get(key) if aggregate else None
    shots = results.get("n-shot", {}).get(sorted(names)[0])
    return TaskScore(
        score, key, score.acc if own is None else float(own), None if shots is None else int(shots)
    )


def run(cfg: Config) -> Result:
    from .. import lmeval

    timer = base.Timer()
    task_manager = lmeval.task_manager_for(cfg.tasks)
    runs = {task: expand(task, cfg.bbh_subtasks, task_manager) for task in cfg.tasks}
    for task, names in runs.items():  # every name checked before the model loads
        lmeval.resolve_tasks(names, task_manager)
    loaded = loading.load(cfg.model)
    if (chats := [t for t in cfg.tasks if chat(t)]) and not getattr(
        loaded.tokenizer, "chat_template", None
    ):
        raise ConfigError(
            f"{', '.join(chats)} run in the model's chat template, but {cfg.model}'s tokenizer has none: "
            f"leave them out of tasks, or run a model with one (an instruct model)"
        )
    top = top_heads(cfg, loaded)
    drawn = controls(
        top,
        {l: loaded.adapter.n_heads(l) for l in loaded.adapter.head_layers()},
        cfg.n_controls,
        cfg.seed,
    )
    zeroed = {CLEAN: (), TOP: top.heads, **{control(i): c for i, c in enumerate(drawn)}}
    store = stores.open_store(cfg.chapter, cfg.profile, "tasks", [loaded], run)
    cells = [
        dict(
            model=cfg.model,
            task=task,
            runs=runs[task],
            condition=name,
            spec=str(Spec(zero=heads)),
            n=cfg.n,
            max_gen_toks=cfg.max_gen_toks,
            batch_size=cfg.batch_size,
            chat=chat(task),
        )
        for name, heads in zeroed.items()
        for task in cfg.tasks
    ]
    done: dict[tuple[str, str], dict] = {}

    def compute(cell):
        """One lm-eval run per condition and prompt format for every task of it not yet stored
        (lm-eval's set-up once, the generations of those tasks batched together); each cell is
        then stored on its own."""
        if (cell["condition"], cell["task"]) not in done:
            from ..progress import quiet

            todo = [
                c["task"]
                for c in cells
                if c["condition"] == cell["condition"]
                and c["chat"] == cell["chat"]
                and c not in store
            ]
            gen = (
                {}
                if cfg.max_gen_toks is None
                else {"gen_kwargs": f"max_gen_toks={cfg.max_gen_toks}"}
            )
            with quiet(), lm_eval_quiet():
                results = lmeval.evaluate(
                    loaded,
                    [n for t in todo for n in runs[t]],
                    cell["spec"],
                    limit=cfg.n,
                    batch_size=cfg.batch_size,
                    log_samples=True,
                    task_manager=task_manager,
                    apply_chat_template=cell["chat"],
                    **gen,
                )
            for t in todo:
                names = [m for n in runs[t] for m in members(n, task_manager)]
                s = per_item(results, names, runs[t][0] if len(runs[t]) == 1 else None)
                done[cell["condition"], t] = {
                    "correct": s.score.to_json()["correct"],
                    "metric": s.metric,
                    "lm_eval": s.lm_eval,
                    "n_shot": s.n_shot,
                }
        return done.pop((cell["condition"], cell["task"]))

    rows = sweep(store, cells, compute, desc="tasks x conditions (lm-eval)")
    scores: dict[str, dict[str, TaskScore]] = {}
    for row in rows:
        scores.setdefault(row["task"], {})[row["condition"]] = TaskScore(
            Score.from_json({"correct": row["correct"]}),
            row["metric"],
            row["lm_eval"],
            row["n_shot"],
        )
    subtasks = {t: names for t, names in runs.items() if names != [t]}
    return Result(cfg, top, drawn, scores, subtasks, base.record(cfg, [loaded], timer))


class lm_eval_quiet:
    """lm-eval's own log lines (its logger writes to the terminal it started on) are kept off the
    page for the block; the book's build log still gets the progress bars (`progress.quiet`)."""

    def __enter__(self):
        import logging

        self.logger = logging.getLogger("lm-eval")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc):
        self.logger.setLevel(self.level)


# --- verdicts ----------------------------------------------------------------------------------

GATE = "the top heads do not lower KV retrieval on held-out prompts, so they are not shown to be retrieval heads"


def falls(result: Result, task: str) -> tuple[str, str]:
    """Does zeroing the top heads lower the task (`verdicts.falls`, paired on its items)? Judged
    only where those heads carry retrieval (`TopHeads.carry_retrieval`); not testable where the
    clean score does not clear the task's floor."""
    return v.gated(
        result.top.carry_retrieval(),
        GATE,
        lambda: v.falls(result.score(task, CLEAN), result.score(task, TOP), floor(task)),
    )


def beyond_controls(result: Result, task: str) -> tuple[str, str]:
    """Does it lower the task more than every random set of as many heads
    (`verdicts.falls_beyond_controls`)? Gated as `falls`."""
    return v.gated(
        result.top.carry_retrieval(),
        GATE,
        lambda: v.falls_beyond_controls(
            result.score(task, CLEAN),
            result.score(task, TOP),
            result.control_scores(task),
            floor(task),
        ),
    )


def verdicts(result: Result) -> list[v.Verdict]:
    k = len(result.top.heads)
    out = [
        v.Verdict(
            f"The KV ranking's top {k} heads carry retrieval: zeroed together they lower KV accuracy on "
            "prompts the ranking did not see",
            "App. A.5, Table 5",
            *result.top.carry_retrieval(),
            v.CHECK,
        )
    ]
    for task in result.cfg.tasks:
        out.append(
            v.Verdict(
                f"Zeroing the KV ranking's top {k} heads lowers {task}",
                "§6, Table 2",
                *falls(result, task),
                headline=True,
            )
        )
        out.append(
            v.Verdict(
                f"They lower {task} more than {k} random heads of the same layers do",
                "§6, Table 2",
                *beyond_controls(result, task),
            )
        )
    return out


# --- tables and figures ------------------------------------------------------------------------


def describe(result: Result, condition: str) -> str:
    if condition == CLEAN:
        return "no head zeroed"
    drawn = [control(i) for i in range(len(result.controls))]
    heads = result.top.heads if condition == TOP else result.controls[drawn.index(condition)]
    return f"{condition}: {', '.join(map(str, heads))}"


def scores_table(result: Result) -> pd.DataFrame:
    """One row per task and condition: lm-eval's metric, acc, lo, hi, n, and the paired
    difference from clean with its interval."""
    from ..stats import paired

    rows = []
    for task in result.cfg.tasks:
        clean = result.score(task, CLEAN)
        for c in result.conditions:
            s, ts = result.score(task, c), result.scores[task][c]
            d = paired(clean, s)
            rows.append(
                dict(
                    task=task,
                    zeroed=describe(result, c),
                    metric=ts.metric,
                    acc=s.acc,
                    lo=s.lo,
                    hi=s.hi,
                    n=s.n,
                    **{"vs clean [95%]": "-" if c == CLEAN else f"{d}"},
                )
            )
    return pd.DataFrame(rows)


def premise_note(result: Result) -> str:
    """The premise (`TopHeads.carry_retrieval`) in a sentence, for the page."""
    outcome, evidence = result.top.carry_retrieval()
    said = (
        "they carry retrieval"
        if outcome == v.REPRODUCED
        else f"{outcome}: not shown to carry retrieval"
    )
    return f"**Premise** ({said}): {', '.join(map(str, result.top.heads))}; {evidence}."


def power_table(result: Result) -> pd.DataFrame:
    """Per task: its items, the clean score, and the smallest loss (points; items only turning
    wrong) that the "lowers" rule (`verdicts.below`, paired) detects with 80% power on those
    items at that clean score (`stats.detectable_loss`; "-" where not even a fall to the floor is)."""
    from ..stats import detectable_loss

    rows = []
    for task in result.cfg.tasks:
        clean = result.score(task, CLEAN)
        loss = detectable_loss(
            lambda a, b: v.below(a, b), v.REPRODUCED, clean.n, clean.acc, floor(task)
        )
        rows.append(
            {
                "task": task,
                "n": clean.n,
                "clean": clean.acc,
                "smallest loss detected (points)": "-" if loss is None else f"{100 * loss:.1f}",
            }
        )
    return pd.DataFrame(rows)


def ranking_table(result: Result) -> pd.DataFrame:
    """The ranking's exactly measured heads, most harmful first, with the screen's estimate."""
    rows = result.top.table.dropna(subset=["acc"])
    return pd.DataFrame(
        [
            dict(
                head=str(Head(int(r.layer), int(r.head))),
                chosen=Head(int(r.layer), int(r.head)) in result.top.heads,
                **{
                    "KV accuracy zeroed": r.acc,
                    "lo": r.lo,
                    "hi": r.hi,
                    "screen estimate": r.estimate,
                },
            )
            for r in rows.itertuples()
        ]
    )


def _paper(task: str, quantity: str, model: str):
    """Table 2's cell (data/reference), None where there is no row: a task of the book's own."""
    try:
        return paper("beyond_mmlu", f"{task}_{quantity}", model)
    except KeyError:
        return None


def comparison(result: Result) -> pd.DataFrame:
    """Table 2 as the paper, the released code and this run have it, one pair of rows per task."""
    cfg = result.cfg
    released = "no Sec. 6 code in the release (data/reference/README.md)"
    rows = [
        (
            "model",
            "Llama-3.1-8B-Instruct, Llamba-8B, Falcon-Mamba-7B (which ones Table 2 lists is not verified)",
            "-",
            f"{cfg.model} ({cfg.profile} profile)",
        ),
        (
            "heads zeroed",
            "the KV ranking's top heads (Table 5); how many is not verified",
            "-",
            f"{', '.join(map(str, result.top.heads))} ({result.top.how})",
        ),
        (
            "harness",
            f"lm-eval {paper('released_settings', 'lm_eval_version').value} (the release's)",
            released,
            "lm-eval's own tasks, prompts, stop sequences, filters and metrics (helpers.lmeval); the model's chat "
            f"template for {', '.join(t for t in cfg.tasks if chat(t)) or 'no task'} (the tasks named *_chat)",
        ),
    ]
    model = registry.cast("paper", "llama") if cfg.profile == "cpu" else cfg.model
    refs = [
        r
        for t in cfg.tasks
        for q in ("clean", "top_heads_ablated")
        if (r := _paper(t, q, model)) is not None
    ]
    unread = [r for r in refs if not r.read]
    if unread:  # the reason once, not in every cell
        rows.append(
            ("Table 2's numbers", f"- : {unread[0].note.split('; the model')[0]}", "-", "-")
        )
    cell = lambda t, q: "-" if (r := _paper(t, q, model)) is None or not r.read else str(r)
    for task in cfg.tasks:
        clean, top = result.score(task, CLEAN), result.score(task, TOP)
        lo = min(c.acc for c in result.control_scores(task)) if result.controls else None
        hi = max(c.acc for c in result.control_scores(task)) if result.controls else None
        ran = (
            f" ({len(result.subtasks[task])} of its subtasks)"
            if task in result.subtasks
            else f" (as {ANALOGUE[task]})"
            if task in ANALOGUE
            else ""
        )
        rows.append((f"{task}{ran}, clean", cell(task, "clean"), "-", f"{clean}"))
        rows.append(
            (
                f"{task}{ran}, top heads zeroed",
                cell(task, "top_heads_ablated"),
                "-",
                f"{top}; random heads: {lo:.1%} to {hi:.1%}" if lo is not None else f"{top}",
            )
        )
    return base.comparison_table(rows)


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, {result.cfg.model}, {len(result.cfg.tasks)} generative tasks"


def figure(result: Result):
    """Each task's score under each condition with 95% intervals; the task's floor dotted."""
    import matplotlib.pyplot as plt

    from .. import plots

    plots.style()
    tasks, conds = list(result.cfg.tasks), result.conditions
    fig, axes = plt.subplots(
        1, len(tasks), figsize=(plots.WIDTH, 1.4 + 0.3 * len(conds)), sharey=True, squeeze=False
    )
    labels = ["no head zeroed", f"top {len(result.top.heads)} zeroed"] + [
        f"random #{i + 1}" for i in range(len(result.controls))
    ]
    for ax, task in zip(axes[0], tasks):
        s = [result.score(task, c) for c in conds]
        y = np.arange(len(conds))[::-1]
        acc = np.array([x.acc for x in s]) * 100
        err = [acc - np.array([x.lo for x in s]) * 100, np.array([x.hi for x in s]) * 100 - acc]
        ax.barh(
            y,
            acc,
            xerr=err,
            capsize=2,
            height=0.6,
            color=["tab:blue", "tab:red"] + ["0.55"] * len(result.controls),
        )
        ax.axvline(100 * floor(task), ls=":", color="0.2", lw=1.5)
        ax.set_yticks(y, labels)
        ax.set(xlim=(0, 102), title=task, xlabel="score (%)")
    return fig
