"""Progressive layer pruning (the paper's Fig. 2; Figs. 8-9 on other models).

Cut the model's layers from the top and score every benchmark at every depth: one walk up the
residual stream (`minimal.prune`, the measurement this chapter shares with layer removal).

The paper's claim is a dissociation: letter selection (MMLU) is kept down to a minimal depth
while knowledge falls, then collapses when a critical layer goes. On the CPU profile the model
is Qwen2.5-Coder-1.5B-Instruct (`registry.cast(profile, "letters")`), which picks letters: MMLU is the book's
letter set and knowledge the same facts as cloze questions (`tasks.load_letters`), the same
seeded subset of both where `n_mmlu` equals `n_knowledge`, so that the two curves are measured on
the same facts. Where the model cannot pick letters (SmolLM2-135M sits at chance on MMLU), KV
retrieval stands in as the retrieval probe.
"""

from __future__ import annotations

import pandas as pd

from .. import verdicts as v
from ..evaluate import mean_over_tasks
from ..protocol import base
from ..protocol.minimal import Pruned as Result

# The measurement is the minimal model's walk, which layer removal reads too (one store for both):
# this chapter's Config, Result and run are that walk's; its verdicts, tables and figure are here.
from ..protocol.minimal import PruningConfig as Config  # noqa: F401 (the chapter's Config)
from ..protocol.minimal import margin_minimal_depth, pick_by_halves, probe
from ..protocol.minimal import prune as run  # noqa: F401 (the chapter's run)
from ..reference import paper
from ..stats import brief


def curves(result: Result) -> pd.DataFrame:
    """One row per benchmark and depth (acc, lo, hi, n), with the released code's knowledge
    score (the unweighted mean of the knowledge tasks) as its own benchmark."""
    rows = pd.DataFrame(
        [
            dict(benchmark=b, layers=d, acc=s.acc, lo=s.lo, hi=s.hi, n=s.n)
            for b, by_depth in result.scores.items()
            for d, s in by_depth.items()
        ]
    )
    knowledge = mean_over_tasks(rows[rows.benchmark.isin(result.knowledge_tasks)], by="layers")
    return pd.concat(
        [rows[~rows.benchmark.isin(result.knowledge_tasks)], knowledge], ignore_index=True
    )


def verdicts(result: Result) -> list[v.Verdict]:
    """Fig. 2's two headline claims about the minimal model (`minimal.minimal_depth`, the
    paper's rule): down to it the probe is kept while knowledge falls, and one layer fewer
    collapses it towards chance."""
    top = result.n_layers
    out = []
    mmlu = result.scores[result.mmlu][top]
    if not mmlu.above(result.chance[result.mmlu]):
        out.append(
            v.Verdict(
                "MMLU survives pruning down to a minimal model",
                "Fig. 2",
                v.NOT_TESTABLE,
                f"the full model picks MMLU letters at chance ({mmlu}, chance "
                f"{result.chance[result.mmlu]:.0%}): nothing to keep or lose; KV retrieval stands in below",
            )
        )
    name = probe(result)
    by_depth, chance = result.scores[name], result.chance[name]
    label = "MMLU" if name == result.mmlu else "KV retrieval (in place of MMLU)"
    if not by_depth[top].above(chance):
        out.append(
            v.Verdict(
                f"{label} is kept down to a minimal model while knowledge falls",
                "Fig. 2",
                v.NOT_TESTABLE,
                f"the full model's {name} {by_depth[top]} does not clear chance {chance:.0%}",
                headline=True,
            )
        )
        return out
    d = result.minimal()
    if d == top:  # the sharpest fall is the top layer's: nothing is pruned before it
        outcome, evidence = v.collapses(by_depth[top], by_depth[top - 1], chance)
        out.append(
            v.Verdict(
                f"The sharpest fall is cutting the top layer ({top - 1} layers): {label} collapses "
                "towards chance",
                "Fig. 2",
                outcome,
                evidence,
                headline=True,
            )
        )
        return out
    # X = the probe, Y = knowledge (the mean over its tasks); each paired on its own items
    outcome, evidence = v.kept_while_falls(
        by_depth[top], by_depth[d], result.knowledge(top), result.knowledge(d), chance
    )
    out.append(
        v.Verdict(
            f"At the minimal model ({d} of {top} layers) {label} is kept while knowledge falls",
            "Fig. 2",
            outcome,
            f"X = {label}, Y = knowledge (mean of {len(result.knowledge_tasks)} tasks): "
            + evidence,
            headline=True,
        )
    )
    outcome, evidence = (
        v.collapses(by_depth[top], by_depth[d - 1], chance) if d > 1 else (v.NOT_TESTABLE, "")
    )
    out.append(
        v.Verdict(
            f"One layer fewer ({d - 1}) and {label} collapses towards chance",
            "Fig. 2",
            outcome,
            evidence,
            headline=True,
        )
    )
    return out + letter_check(result)


def letter_check(result: Result) -> list[v.Verdict]:
    """The book's check of its letter probe: the full model keeps its accuracy when each
    question's options are moved round (paired on the questions, `verdicts.kept`), so that it
    picks by content, not by a favoured letter."""
    check = result.letter_check
    if check is None:
        return []
    outcome, evidence = v.kept(check.original, check.moved, result.chance[result.mmlu])
    return [
        v.Verdict(
            "The full model picks letters by their content: moving each question's options round keeps "
            "its accuracy",
            "this book's check of the MMLU probe",
            outcome,
            evidence,
            v.CHECK,
        )
    ]


def pick_note(result: Result) -> str:
    """How the minimal model was picked, and whether the items or the rule decide it."""
    name = probe(result)
    by_depth, chance, d = result.scores[name], result.chance[name], result.minimal()
    halves = pick_by_halves(by_depth, chance)
    variant = margin_minimal_depth(by_depth)
    fall = (
        f"{by_depth[d].acc:.1%} with {d} layers, {by_depth[d - 1].acc:.1%} with {d - 1}"
        if d > 1
        else ""
    )
    return (
        f"The minimal model is the shallowest cut above the sharpest fall in {name} ({fall}; the paper's rule, "
        f"`minimal.minimal_depth`). Each half of the {by_depth[d].n} items (every other one) picks "
        f"{halves[0]} and {halves[1]} layers{' too' if halves == (d, d) else ''}. A variant that stops at the "
        f"first cut losing more than 5 points of the full model's accuracy would pick {variant}."
    )


def comparison(result: Result) -> pd.DataFrame:
    top, name = result.n_layers, probe(result)
    d = result.minimal()
    know = curves(result).set_index(["benchmark", "layers"])
    fmt = lambda r: brief(r.acc, r.lo, r.hi)
    return base.comparison_table(
        [
            (
                "model",
                "Llama-3.1-8B-Instruct",
                "same, lm-eval 0.4.7",
                f"{result.cfg.model} ({result.cfg.profile} profile)",
            ),
            ("weights", "as published", "as published", base.weights(result.provenance)),
            (
                "MMLU, full model",
                "not stated in the sources read (Fig. 2 not read)",
                f"{result.cfg.k_shot}-shot",
                f"{result.scores[result.mmlu][top]} ({result.cfg.k_shot}-shot, chance {result.chance[result.mmlu]:.0%})",
            ),
            (
                "knowledge, full model",
                "falls as layers go (Fig. 2)",
                "mean acc of 6 tasks",
                f"{fmt(know.loc[('knowledge (mean)', top)])} (mean of {', '.join(result.knowledge_tasks)})",
            ),
            (
                "minimal model",
                f"layers 0-{paper('layer_pruning', 'minimal_model_last_layer').value} (Fig. 3)",
                "layers 0-17",
                f"layers 0-{d - 1}: the shallowest cut above the sharpest fall in {name} (the 5-point variant: "
                f"layers 0-{margin_minimal_depth(result.scores[name]) - 1})",
            ),
            (
                "retrieval at the minimal model",
                f"MMLU {paper('layer_pruning', 'mmlu_minimal_model')}; "
                f"{paper('head_zeroing', 'mmlu_minimal_summary')}",
                "-",
                f"{name}: {result.scores[name][d]}",
            ),
            (
                "knowledge at the minimal model",
                "lower than the full model (Fig. 2)",
                "-",
                fmt(know.loc[("knowledge (mean)", d)]),
            ),
        ]
    )


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, {result.cfg.model}"


def figure(result: Result):
    """Fig. 2's panel for this run: every benchmark against the layers kept, the knowledge mean
    as the release computes it, chance levels, and the minimal model marked."""
    from .. import plots

    name = probe(result)
    d = result.minimal()
    chance = {b: result.chance[b] for b in (result.mmlu, result.kv)}
    ax = plots.accuracy_curves(
        curves(result),
        "layers",
        "benchmark",
        chance=chance,
        title=f"{result.cfg.model}: pruning layers from the top",
        xlabel="layers kept (from the bottom)",
    )
    ax.axvline(d, color="0.3", lw=1, ls="--")
    ax.annotate(
        f"minimal model\n({d} layers, by {name.split(' (')[0]})",
        (d, 4),
        xytext=(4, 0),
        textcoords="offset points",
        fontsize=plots.MIN_FONT + 1,
    )
    # the sharpest fall, the cut that picks it: from d layers to d - 1, with both intervals
    if d > 1:
        above, below = result.scores[name][d], result.scores[name][d - 1]
        ax.annotate(
            "",
            xy=(d - 1, 100 * below.acc),
            xytext=(d, 100 * above.acc),
            arrowprops=dict(arrowstyle="->", color="0.15", lw=1.6),
        )
        ax.errorbar(
            [d - 1, d],
            [100 * below.acc, 100 * above.acc],
            fmt="none",
            ecolor="0.15",
            capsize=3,
            lw=1.2,
            yerr=[
                [100 * (below.acc - below.lo), 100 * (above.acc - above.lo)],
                [100 * (below.hi - below.acc), 100 * (above.hi - above.acc)],
            ],
        )
    return ax.figure
