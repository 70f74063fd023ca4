"""Progressive layer pruning (the paper's Fig. 2; Figs. 8-9 on other models).

Cut the model's layers from the top and score every benchmark at every depth. Pruning from the
top leaves the layers below the cut unchanged, so one walk up the residual stream gives every
depth: the stream after layer d, through the final norm and the unembedding, *is* the model
pruned to d layers (`SweepEngine.score_by_depth`, tested against `prune_top`).

The paper's claim is a dissociation: letter selection (MMLU) is kept down to a minimal depth
while knowledge falls, then collapses when a critical layer goes. On the CPU profile the model
is Qwen2.5-Coder-1.5B-Instruct (`shared.LETTER_MODEL`), which picks letters: MMLU is the book's
letter set and knowledge the same facts as cloze questions (`tasks.load_letters`), the same
seeded subset of both where `n_mmlu` equals `n_knowledge`, so that the two curves are measured on
the same facts. Where the model cannot pick letters (SmolLM2-135M sits at chance on MMLU), KV
retrieval stands in as the retrieval probe.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .. import benchmarks as bm
from .. import verdicts as v
from ..engine import SweepEngine
from ..evaluate import mean_over_tasks
from ..reference import paper
from ..stats import Score, TaskMean, brief
from ..sweep import sweep
from . import base, shared

PAPER_MODEL = {"paper": "llama-3.1-8b-instruct", "paper-3b": "llama-3.2-3b-instruct"}


@dataclass(frozen=True)
class Config(base.BenchmarkConfig):
    model: str = base.model("attention", "ssm")

    chapter = "layer_pruning"
    smoke_sizes = dict(n_mmlu=8, n_knowledge=4, n_kv=4)

    def __post_init__(self):
        super().__post_init__()
        base.refuse_toy(self.chapter, "model", self.model)
        base.check_kv_sizes(self.model, "kv_pairs", [self.kv_pairs])

    @classmethod
    def defaults(cls, profile):
        if profile == "cpu":
            # The letter model; letters and cloze on the same 150 facts, one walk up the stream each.
            return dict(model=shared.LETTER_MODEL, n_mmlu=150, k_shot=0, n_knowledge=150, n_kv=60, kv_pairs=8,
                        kv_query="repeat", seed=0)
        return dict(model=PAPER_MODEL[profile], n_mmlu=None, k_shot=paper("released_settings", "num_fewshot").integer,
                    n_knowledge=None, n_kv=500, kv_pairs=8, kv_query="paper", seed=0)


@dataclass(frozen=True)
class Result(base.ByRole):
    cfg: Config
    n_layers: int
    scores: dict[str, dict[int, Score]]  # benchmark -> layers kept -> score
    roles: dict[str, str]  # benchmark -> bm.RETRIEVAL or bm.KNOWLEDGE
    chance: dict[str, float]
    provenance: dict

    @property
    def mmlu(self) -> str:
        return next(b for b in self.scores if b.startswith("MMLU"))

    @property
    def kv(self) -> str:
        return next(b for b in self.scores if b.startswith("KV"))

    def knowledge(self, depth: int) -> TaskMean:
        """Knowledge at one depth as the release scores it: the unweighted mean over the
        knowledge tasks (paired across depths task by task: `stats.mean_difference`)."""
        return TaskMean.of([self.scores[t][depth] for t in self.knowledge_tasks],
                           [self.chance[t] for t in self.knowledge_tasks])


def run(cfg: Config) -> Result:
    timer = base.Timer()
    loaded = base.load(cfg.model)
    sets = [bm.letter_mcq(cfg.model, loaded.tokenizer, cfg.profile, cfg.n_mmlu, cfg.seed, cfg.k_shot),
            *bm.knowledge(cfg.model, cfg.profile, cfg.n_knowledge, cfg.seed),
            bm.kv(cfg.model, loaded.tokenizer, cfg.kv_pairs, cfg.n_kv, cfg.seed, cfg.kv_query)]
    depths = list(range(1, loaded.adapter.n_layers + 1))
    store = base.open_store(cfg.chapter, cfg.profile, "depths", [loaded])
    by_name = {b.name: b for b in sets}

    def compute(cell):
        scores = SweepEngine(loaded, loaded.tokenizer, by_name[cell["benchmark"]].items).score_by_depth(depths)
        return {str(d): s.to_json() for d, s in scores.items()}

    cells = [dict(model=cfg.model, benchmark=b.name, n=len(b), seed=cfg.seed, kv_query=cfg.kv_query) for b in sets]
    rows = sweep(store, cells, compute, desc="benchmarks x depths")
    scores = {r["benchmark"]: {d: Score.from_json(r[str(d)]) for d in depths} for r in rows}
    return Result(cfg, len(depths), scores, {b.name: b.role for b in sets}, {b.name: b.chance for b in sets},
                  base.record(cfg, [loaded], timer))


def curves(result: Result) -> pd.DataFrame:
    """One row per benchmark and depth (acc, lo, hi, n), with the released code's knowledge
    score (the unweighted mean of the knowledge tasks) as its own benchmark."""
    rows = pd.DataFrame([dict(benchmark=b, layers=d, acc=s.acc, lo=s.lo, hi=s.hi, n=s.n)
                         for b, by_depth in result.scores.items() for d, s in by_depth.items()])
    knowledge = mean_over_tasks(rows[rows.benchmark.isin(result.knowledge_tasks)], by="layers")
    return pd.concat([rows[~rows.benchmark.isin(result.knowledge_tasks)], knowledge], ignore_index=True)


def minimal_depth(by_depth: dict[int, Score], margin: float = 0.05) -> int:
    """The shallowest depth from which every deeper cut keeps the full model's accuracy within
    `margin` (the point estimate): the paper's "minimal model". This picks the model to study, it
    is no claim: the claims about it are tested with their intervals. Requiring a sure "kept"
    here let one cut's 2-point dip on 100 questions stop the walk at the top (Qwen's letters at
    seed 1: 28 of 28 layers, where seed 0 found 24)."""
    top = max(by_depth)
    depth = top
    for d in sorted(by_depth, reverse=True)[1:]:
        if by_depth[top].acc - by_depth[d].acc > margin:
            break
        depth = d
    return depth


def probe(result: Result) -> str:
    """The retrieval probe the verdicts use: MMLU where the model picks letters above chance,
    else KV retrieval (the book's stand-in, said so on the page)."""
    full = result.scores[result.mmlu][result.n_layers]
    return result.mmlu if full.above(result.chance[result.mmlu]) else result.kv


def verdicts(result: Result) -> list[v.Verdict]:
    top = result.n_layers
    out = []
    mmlu = result.scores[result.mmlu][top]
    if not mmlu.above(result.chance[result.mmlu]):
        out.append(v.Verdict("MMLU survives pruning down to a minimal model", "Fig. 2", v.NOT_TESTABLE,
                             f"the full model picks MMLU letters at chance ({mmlu}, chance "
                             f"{result.chance[result.mmlu]:.0%}): nothing to keep or lose; KV retrieval stands in below"))
    name = probe(result)
    by_depth, chance = result.scores[name], result.chance[name]
    label = "MMLU" if name == result.mmlu else "KV retrieval (in place of MMLU)"
    if not by_depth[top].above(chance):
        out.append(v.Verdict(f"{label} is kept down to a minimal model while knowledge falls", "Fig. 2", v.NOT_TESTABLE,
                             f"the full model's {name} {by_depth[top]} does not clear chance {chance:.0%}"))
        return out
    d = minimal_depth(by_depth)
    if d == top:  # the walk down stopped at once: a loss beyond the margin one layer down
        outcome, evidence = v.kept(by_depth[top], by_depth[top - 1], chance)
        out.append(v.Verdict(f"{label} is kept when the top layer is pruned", "Fig. 2", outcome, evidence))
        return out
    # X = the probe, Y = knowledge (the mean over its tasks); each paired on its own items
    outcome, evidence = v.kept_while_falls(by_depth[top], by_depth[d], result.knowledge(top), result.knowledge(d), chance)
    out.append(v.Verdict(f"At the minimal model ({d} of {top} layers) {label} is kept while knowledge falls",
                         "Fig. 2", outcome, f"X = {label}, Y = knowledge (mean of {len(result.knowledge_tasks)} tasks): "
                         + evidence))
    outcome, evidence = v.collapses(by_depth[top], by_depth[d - 1], chance) if d > 1 else (v.NOT_TESTABLE, "")
    out.append(v.Verdict(f"One layer fewer ({d - 1}) and {label} collapses towards chance", "Fig. 2", outcome, evidence))
    return out


def comparison(result: Result) -> pd.DataFrame:
    top, name = result.n_layers, probe(result)
    d = minimal_depth(result.scores[name])
    know = curves(result).set_index(["benchmark", "layers"])
    fmt = lambda r: brief(r.acc, r.lo, r.hi)
    return base.comparison_table([
        ("model", "Llama-3.1-8B-Instruct", "same, lm-eval 0.4.7", f"{result.cfg.model} ({result.cfg.profile} profile)"),
        ("weights", "as published", "as published", base.weights(result.provenance)),
        ("MMLU, full model", "not stated in the sources read (Fig. 2 not read)", f"{result.cfg.k_shot}-shot",
         f"{result.scores[result.mmlu][top]} ({result.cfg.k_shot}-shot, chance {result.chance[result.mmlu]:.0%})"),
        ("knowledge, full model", "falls as layers go (Fig. 2)", "mean acc of 6 tasks",
         f"{fmt(know.loc[('knowledge (mean)', top)])} (mean of {', '.join(result.knowledge_tasks)})"),
        ("minimal model", f"layers 0-{paper('layer_pruning', 'minimal_model_last_layer').value} (Fig. 3)", "layers 0-17",
         f"layers 0-{d - 1}: the shallowest cut that keeps {name}"),
        ("retrieval at the minimal model", f"MMLU {paper('layer_pruning', 'mmlu_minimal_model')}; "
                                            f"{paper('head_zeroing', 'mmlu_minimal_summary')}", "-",
         f"{name}: {result.scores[name][d]}"),
        ("knowledge at the minimal model", "lower than the full model (Fig. 2)", "-",
         fmt(know.loc[("knowledge (mean)", d)])),
    ])


def subject(result: Result) -> str:
    return f"on the {result.cfg.profile} profile, {result.cfg.model}"


def figure(result: Result):
    """Fig. 2's panel for this run: every benchmark against the layers kept, the knowledge mean
    as the release computes it, chance levels, and the minimal model marked."""
    from .. import plots

    name = probe(result)
    d = minimal_depth(result.scores[name])
    chance = {b: result.chance[b] for b in (result.mmlu, result.kv)}
    ax = plots.accuracy_curves(curves(result), "layers", "benchmark", chance=chance,
                               title=f"{result.cfg.model}: pruning layers from the top",
                               xlabel="layers kept (from the bottom)")
    ax.axvline(d, color="0.3", lw=1, ls="--")
    ax.annotate(f"minimal model\n({d} layers, by {name.split(' (')[0]})", (d, 4), xytext=(4, 0),
                textcoords="offset points", fontsize=plots.MIN_FONT + 1)
    return ax.figure
