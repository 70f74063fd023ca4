"""The toy zoo: the CPU tier of the SSM and hybrid chapters.

The page shows the zoo's three tasks (one example each), its models, their training curves, and
re-measures every model's final accuracies from the shipped checkpoints through the book's one
scorer (`helpers.evaluate` on `synthetic.items`). Its claim is about the zoo itself: every
re-measured accuracy equals the one recorded right after training, within two examples in 500
(the tolerance of `tests/test_zoo.py`: another CPU's kernels may round a near-tie the other way;
a wrong checkpoint misses by far more). The zoo is the same on every profile, so is this page.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import evaluate, registry, synthetic, zoo
from .. import verdicts as v
from ..protocol import base, fields, loading, stores
from ..stats import Score
from ..sweep import sweep

TOLERANCE = 2  # examples per cell, out of the record's n (tests/test_zoo.py)
# Each toy model and the paper model whose part it plays (the released code loads these).
PLAYS = {toy: registry.cast("paper", part) for part, toy in registry.CAST["cpu"].items()}
PROBE_CHANCE = {
    "kv": 1 / zoo.PROBES["kv"],
    "mcq": 1 / zoo.PROBES["mcq"],
    "knowledge": 1 / synthetic.N_VALUES,
}


def recorded_n() -> int:
    """How many examples per cell the records were measured on (500)."""
    return min(zoo.record(name)["n_final"] for name in zoo.RECIPES)


@dataclass(frozen=True)
class Config(base.Config):
    n: int = fields.count()  # examples per re-measured accuracy
    seed: int = fields.seed()  # which example of each task the page shows

    chapter = "toy_zoo"
    smoke_sizes = dict(n=24)

    @classmethod
    def defaults(cls, profile):
        # The zoo is the CPU tier: the same models and sizes whatever the profile.
        return dict(n=recorded_n(), seed=0)


@dataclass(frozen=True)
class Result:
    cfg: Config
    models: pd.DataFrame  # one row per model: what it plays, its shape and its training
    records: dict[str, dict]  # each model's training record (data/zoo/<name>.json)
    # model -> cell ("kv@8") -> score on this run's examples
    remeasured: dict[str, dict[str, Score]]
    provenance: dict


def final_scores(model, seed: int, n: int) -> dict[str, Score]:
    """`zoo.final_accuracies` as Scores (per-example correctness): the same examples, drawn in
    the same order from the record's seed, scored by the same scorer."""
    rng = np.random.default_rng([seed, 2])
    return {
        task if size is None else f"{task}@{size}": evaluate.score(
            model, synthetic.tokenizer(), synthetic.items(synthetic.make(task, n, size, rng))
        )
        for task, sizes in zoo.FINAL.items()
        for size in sizes
    }


def describe(loaded, name: str) -> dict:
    """One row of the models table."""
    rec, a = zoo.record(name), loaded.adapter
    layer = a.head_layers()[0]
    heads = f"{a.n_heads(layer)} {a.head_kind}s" + (
        f" of {a.head_dim(layer)}" if a.head_kind != "head" else ""
    )
    training = (
        f"{rec['steps']} steps"
        if "steps" in rec
        else f"MOHAWK stages 1, 2: {' + '.join(map(str, rec['distill_steps']))} steps from {rec['teacher']}"
    )
    return {
        "model": name,
        "class": type(loaded.model).__name__,
        "layers": a.n_layers,
        "heads per layer": heads,
        "parameters": f"{sum(p.numel() for p in loaded.model.parameters()):,}",
        "training": training,
        "wall time (s, 1 thread)": f"{rec['wall_s']:.0f}",
    }


def run(cfg: Config) -> Result:
    timer = base.Timer()
    loaded = {name: loading.load(name) for name in zoo.RECIPES}
    records = {name: zoo.record(name) for name in zoo.RECIPES}
    store = stores.open_store(
        cfg.chapter, cfg.profile, "final", list(loaded.values()), measure_final
    )
    cells = [dict(model=name, seed=records[name]["seed"], n=cfg.n) for name in zoo.RECIPES]
    rows = sweep(store, cells, measure_final, desc="re-measuring the zoo")
    remeasured = {
        r["model"]: {k: Score.from_json(r[k]) for k in records[r["model"]]["final"]} for r in rows
    }
    models = pd.DataFrame([describe(loaded[name], name) for name in zoo.RECIPES])
    return Result(cfg, models, records, remeasured, base.record(cfg, list(loaded.values()), timer))


def measure_final(cell: dict) -> dict:
    """A toy's final scores on its tasks (`final_scores` at the cell's seed and n; a measurement,
    `runner`)."""
    with zoo.one_thread():  # as in training, so that equal inputs give bit-equal logits
        scores = final_scores(loading.model_for(cell["model"]).model, cell["seed"], cell["n"])
    return {k: s.to_json() for k, s in scores.items()}


# --- what the page shows ------------------------------------------------------------------------


def examples(seed: int = 0) -> pd.DataFrame:
    """One example of each task as the models read it, after the BOS token `<s>` that starts
    every prompt, with its answer and chance level."""
    rng = np.random.default_rng(seed)
    rows = []
    for task, size, label in [
        ("kv", 3, "KV retrieval (3 keys)"),
        ("mcq", 3, "letter MCQ (3 options)"),
        ("knowledge", None, "knowledge"),
    ]:
        item = synthetic.items(synthetic.make(task, 1, size, rng))[0]
        prompt = item.pairs[0][0].removeprefix(synthetic.name(synthetic.BOS) + " ")
        rows.append(
            {
                "task": label,
                "prompt": prompt,
                "answer": item.pairs[item.gold][1].strip(),
                "chance": 1 / len(item.pairs),
            }
        )
    return pd.DataFrame(rows)


def gaps(result: Result) -> pd.DataFrame:
    """One row per model and cell: recorded and re-measured accuracy, and their difference in
    examples of the record's n."""
    rows = []
    for name, rec in result.records.items():
        for cell, recorded in rec["final"].items():
            now = result.remeasured[name][cell]
            rows.append(
                dict(
                    model=name,
                    cell=cell,
                    recorded=recorded,
                    remeasured=now.acc,
                    n=now.n,
                    examples=round(abs(now.acc - recorded) * rec["n_final"]),
                )
            )
    return pd.DataFrame(rows)


def accuracy_table(result: Result) -> pd.DataFrame:
    """Re-measured (recorded) accuracy in percent, one row per task and size, one column per model."""
    g = gaps(result)
    g["text"] = [f"{100 * a:.1f} ({100 * b:.1f})" for a, b in zip(g.remeasured, g.recorded)]
    table = g.pivot(index="cell", columns="model", values="text").reindex(
        index=list(dict.fromkeys(g.cell)), columns=list(result.records)
    )
    return table.rename_axis(index="task@size", columns=None).reset_index()


def verdicts(result: Result) -> list[v.Verdict]:
    """One check of the book's own machinery (the shipped checkpoints still score as recorded),
    not one of the paper's claims: the intro's summary lists it as a check."""
    claim = f"Every re-measured accuracy equals its record within {TOLERANCE} examples in {recorded_n()}"
    source = "data/zoo records; tests/test_zoo.py"
    if result.cfg.n != recorded_n():
        return [
            v.Verdict(
                claim,
                source,
                v.NOT_TESTABLE,
                f"n={result.cfg.n} draws other examples than the records' {recorded_n()}; "
                f"run with n={recorded_n()} (the default) to compare",
                v.CHECK,
            )
        ]
    g = gaps(result)
    worst = g.loc[g.examples.idxmax()]
    outcome = v.REPRODUCED if worst.examples <= TOLERANCE else v.NOT_REPRODUCED
    if worst.examples == 0:
        return [
            v.Verdict(
                claim,
                source,
                outcome,
                f"all {len(g)} cells ({len(result.records)} models) equal their "
                f"records exactly, n={recorded_n()} each",
                v.CHECK,
            )
        ]
    return [
        v.Verdict(
            claim,
            source,
            outcome,
            f"{(g.examples == 0).sum()} of {len(g)} cells equal exactly; the largest gap is "
            f"{worst.examples} example(s) of {recorded_n()}: {worst.model} {worst.cell}, "
            f"{worst.remeasured:.1%} re-measured against {worst.recorded:.1%} recorded"
            + (
                ""
                if outcome == v.REPRODUCED
                else "; checkpoints and records are out of step: rebuild with `make zoo`"
            ),
            v.CHECK,
        )
    ]


def comparison(result: Result) -> pd.DataFrame:
    """Each toy model beside the paper model whose part it plays, with its re-measured KV
    accuracy at the size the SSM chapters probe (8 keys)."""

    def kv(name):
        s = result.remeasured[name]["kv@8"]
        return f"KV, 8 keys: {s.brief}, n={s.n}"

    def plays(name):  # the follow-up's hybrids (retrieval_aware) stand for no released model
        return registry.spec(PLAYS[name]).hub_id if name in PLAYS else "-"

    return base.comparison_table(
        [(name, zoo.RECIPES[name].role, plays(name), kv(name)) for name in result.records]
    )


def subject(result: Result) -> str:
    return f"the toy zoo's {len(result.records)} shipped checkpoints (the CPU tier; the same on every profile)"


def figure(result: Result):
    """The training curves of the models that play the paper's: the answer loss, and the
    held-out probes' accuracy (KV with 8 keys, MCQ with 4 options, knowledge), chance dotted;
    the student's steps are distillation steps."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from .. import plots

    plots.style()
    curves = pd.concat(
        [
            pd.DataFrame(rec["curve"]).assign(model=name)
            for name, rec in result.records.items()
            if name in PLAYS
        ]
    )
    colour = dict(zip(PLAYS, sns.color_palette("deep")))
    fig, axes = plt.subplots(2, 2, figsize=(plots.WIDTH, 6.2), sharex=True)
    panels = [
        ("loss", "answer loss (log scale)"),
        ("kv", "held-out KV, 8 keys"),
        ("mcq", "held-out MCQ, 4 options"),
        ("knowledge", "held-out knowledge"),
    ]
    for ax, (column, title) in zip(axes.flat, panels):
        for name, part in curves.groupby("model", sort=False):
            if column == "loss" and "stage" in part and part["stage"].notna().any():
                continue  # the student's losses measure imitation of its teacher, not answers
            y = part[column] if column == "loss" else 100 * part[column]
            ax.plot(part.step, y, marker="o", ms=3, color=colour[name], label=name)
        if column == "loss":
            ax.set(yscale="log", ylabel="loss")
        else:
            ax.axhline(100 * PROBE_CHANCE[column], ls=":", lw=1.2, color="0.35")
            ax.annotate(
                f"chance {PROBE_CHANCE[column]:.1%}",
                (1, PROBE_CHANCE[column] * 100),
                xycoords=("axes fraction", "data"),
                xytext=(-2, 3),
                textcoords="offset points",
                ha="right",
                fontsize=plots.MIN_FONT,
                color="0.35",
            )
            ax.set(ylim=(0, 102), ylabel="accuracy (%)")
        ax.set_title(title)
    for ax in axes[1]:
        ax.set_xlabel("training step")
    handles, labels = axes.flat[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=3, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig
