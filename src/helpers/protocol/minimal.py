"""The minimal model: the shallowest cut of a model's layers above the sharpest fall in its
task (the paper's Llama-3.1-8B layers 0-17: without L17, MMLU falls to chance).

Pruning from the top leaves the layers below the cut unchanged, so one walk up the residual
stream scores every depth (`SweepEngine.score_by_depth`, tested against `prune_top`): the stream
after layer d, through the final norm and the unembedding, *is* the model pruned to d layers.
The walk over the layer-pruning chapter's benchmarks (`PruningConfig`, `prune`) is that chapter's
measurement, and layer removal reads the same walk through the same results store to find the
minimal model it removes layers from; head zeroing and masking read that walk's cell of their task
(`task_depths`), so every page names the same minimal model. Where one is published
(`published_minimal`), every chapter works in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from .. import benchmarks as bm
from .. import registry
from ..engine import SweepEngine
from ..reference import paper, paper_heads
from ..stats import Score, TaskMean
from ..sweep import sweep
from . import base, checks, fields, loading, stores


@dataclass(frozen=True)
class PruningConfig(base.BenchmarkConfig):
    """The layer-pruning chapter's settings: its model and benchmarks (its `Config`)."""

    model: str = fields.model("attention", "ssm")

    chapter = "layer_pruning"
    smoke_sizes = dict(n_mmlu=8, n_knowledge=4, n_kv=4)

    def __post_init__(self):
        super().__post_init__()
        checks.refuse_toy(self.chapter, "model", self.model)
        checks.check_kv_sizes(self.model, "kv_pairs", [self.kv_pairs])

    @classmethod
    def defaults(cls, profile):
        if profile == "cpu":
            # The letter model; letters and cloze on the same 150 facts, one walk up the stream each.
            return dict(
                model=registry.cast(profile, "letters"),
                n_mmlu=150,
                k_shot=0,
                n_knowledge=150,
                n_kv=60,
                kv_pairs=8,
                kv_query="repeat",
                seed=0,
            )
        return dict(
            model=registry.cast(profile, "letters"),
            n_mmlu=None,
            k_shot=paper("released_settings", "num_fewshot").integer,
            n_knowledge=None,
            n_kv=500,
            kv_pairs=8,
            kv_query="paper",
            seed=0,
        )


@dataclass(frozen=True)
class LetterCheck:
    """The full model on the letter questions as drawn and on the same questions with their
    options moved round (`tasks.permute_options`): a model that picks by content keeps its
    accuracy and follows each answer to its new letter; one that favours a letter does not."""

    original: Score
    moved: Score
    gold: tuple[int, ...]  # per question, the answer's letter as drawn (0 = A)
    gold_moved: tuple[int, ...]  # and with the options moved
    groups: tuple[str, ...]  # per question, its table (capitals, sums, ...)

    def by_letter(self) -> pd.DataFrame:
        """Accuracy by the answer's letter, as drawn and with the options moved."""
        rows = []
        for name, score, gold in (
            ("as drawn", self.original, self.gold),
            ("options moved", self.moved, self.gold_moved),
        ):
            for g in sorted(set(gold)):
                rows.append(
                    {
                        "options": name,
                        "answer's letter": "ABCD"[g],
                        **_brief(score.subset([k for k, x in enumerate(gold) if x == g])),
                    }
                )
        return pd.DataFrame(rows)

    def by_group(self) -> pd.DataFrame:
        """Accuracy by table, as drawn and with the options moved."""
        rows = []
        for group in sorted(set(self.groups)):
            at = [k for k, x in enumerate(self.groups) if x == group]
            rows.append(
                {
                    "table": group,
                    "n": len(at),
                    "as drawn": self.original.subset(at).acc,
                    "options moved": self.moved.subset(at).acc,
                }
            )
        return pd.DataFrame(rows)


def _brief(s: Score) -> dict:
    return {"acc": s.acc, "lo": s.lo, "hi": s.hi, "n": s.n}


@dataclass(frozen=True)
class Pruned(base.ByRole):
    """Every benchmark scored at every depth (the layer-pruning chapter's `Result`)."""

    cfg: PruningConfig
    n_layers: int
    scores: dict[str, dict[int, Score]]  # benchmark -> layers kept -> score
    roles: dict[str, str]  # benchmark -> bm.RETRIEVAL or bm.KNOWLEDGE
    chance: dict[str, float]
    provenance: dict
    # benchmark -> its kind (`benchmarks.Benchmark.kind`)
    kinds: dict[str, str] = field(default_factory=dict)
    letter_check: LetterCheck | None = (
        None  # the letters with their options moved (where the model picks letters)
    )

    @property
    def mmlu(self) -> str:
        return next(b for b, k in self.kinds.items() if k == bm.MCQ)

    @property
    def kv(self) -> str:
        return next(b for b, k in self.kinds.items() if k == bm.KV)

    def knowledge(self, depth: int) -> TaskMean:
        """Knowledge at one depth as the release scores it: the unweighted mean over the
        knowledge tasks (paired across depths task by task: `stats.mean_difference`)."""
        return TaskMean.of(
            [self.scores[t][depth] for t in self.knowledge_tasks],
            [self.chance[t] for t in self.knowledge_tasks],
        )

    def minimal(self) -> int:
        """The minimal model's layers, by the paper's rule (`minimal_depth`) on the probe."""
        name = probe(self)
        return minimal_depth(self.scores[name], self.chance[name])


def prune(cfg: PruningConfig) -> Pruned:
    """Every benchmark at every depth: one walk up the residual stream per benchmark."""
    timer = base.Timer()
    loaded = loading.load(cfg.model)
    sets = [
        bm.letter_mcq(cfg.model, loaded.tokenizer, cfg.profile, cfg.n_mmlu, cfg.seed, cfg.k_shot),
        *bm.knowledge(cfg.model, cfg.profile, cfg.n_knowledge, cfg.seed),
        bm.kv(cfg.model, loaded.tokenizer, cfg.kv_pairs, cfg.n_kv, cfg.seed, cfg.kv_query),
    ]
    scores = walk(cfg.profile, loaded, sets)
    letters, top = sets[0], loaded.adapter.n_layers
    check = None
    if (
        letters.kind == bm.MCQ
        and not registry.spec(cfg.model).toy
        and scores[letters.name][top].above(letters.chance)
    ):
        moved = bm.letter_mcq(
            cfg.model,
            loaded.tokenizer,
            cfg.profile,
            cfg.n_mmlu,
            cfg.seed,
            cfg.k_shot,
            permuted=True,
        )
        store = stores.open_store(
            PruningConfig.chapter, cfg.profile, "options-moved", [loaded], measure_whole
        )
        row = sweep(
            store,
            [dict(model=loaded.name, benchmark=moved.name, items=moved.spec)],
            measure_whole,
            desc="letters, options moved",
        )[0]
        check = LetterCheck(
            scores[letters.name][top],
            Score.from_json(row),
            tuple(it.gold for it in letters.items),
            tuple(it.gold for it in moved.items),
            tuple(it.group for it in letters.items),
        )
    return Pruned(
        cfg,
        top,
        scores,
        {b.name: b.role for b in sets},
        {b.name: b.chance for b in sets},
        base.record(cfg, [loaded], timer),
        {b.name: b.kind for b in sets},
        check,
    )


def measure_whole(cell: dict) -> dict:
    """One benchmark (the cell's items) scored by the whole model (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    return (
        SweepEngine(loaded, loaded.tokenizer, bm.from_spec(cell["items"], loaded.tokenizer).items)
        .score()
        .to_json()
    )


def walk(profile: str, loaded, sets: list[bm.Benchmark]) -> dict[str, dict[int, Score]]:
    """Each benchmark at every depth of `loaded` (benchmark -> layers kept -> score), through the
    layer-pruning chapter's results store: one cell per benchmark, so a chapter that walks one of
    that chapter's benchmarks reads the number its page shows."""
    depths = range(1, loaded.adapter.n_layers + 1)
    store = stores.open_store(PruningConfig.chapter, profile, "depths", [loaded], measure_depths)
    cells = [dict(model=loaded.name, benchmark=b.name, items=b.spec) for b in sets]
    rows = sweep(store, cells, measure_depths, desc="benchmarks x depths")
    return {r["benchmark"]: {d: Score.from_json(r[str(d)]) for d in depths} for r in rows}


def task_depths(
    loaded, profile: str, smoke: bool, seed: int, task: str, kv_pairs: int, kv_query: str
) -> tuple[dict[int, Score], float]:
    """`task` ("mmlu" or "kv") at every depth, and its chance, on the layer-pruning chapter's items for it (its
    sizes at `profile`/`smoke` and its prompt settings, drawn with `seed`): the walk its page shows,
    where head zeroing and masking find the minimal model (`minimal_depth`). A screen's own
    prompts named 23 layers at one seed and 24 at the next, so the heads swept moved with the seed.
    Toys, which that chapter does not run, are walked on its sizes all the same."""
    sizes = {**PruningConfig.defaults(profile), **(PruningConfig.smoke_sizes if smoke else {})}
    if task == "mmlu":
        b = bm.letter_mcq(
            loaded.name, loaded.tokenizer, profile, sizes["n_mmlu"], seed, sizes["k_shot"]
        )
    else:
        b = bm.kv(loaded.name, loaded.tokenizer, kv_pairs, sizes["n_kv"], seed, kv_query)
    return walk(profile, loaded, [b])[b.name], b.chance


def measure_depths(cell: dict) -> dict:
    """One benchmark (`benchmarks.from_spec` of the cell's items) scored at every depth of the
    model, {depth: score}: one walk up the residual stream (a measurement, `runner`)."""
    loaded = loading.model_for(cell["model"])
    items = bm.from_spec(cell["items"], loaded.tokenizer).items
    depths = range(1, loaded.adapter.n_layers + 1)
    return {
        str(d): s.to_json()
        for d, s in SweepEngine(loaded, loaded.tokenizer, items).score_by_depth(depths).items()
    }


def minimal_depth(by_depth: dict[int, Score], chance: float) -> int:
    """The paper's minimal model: the shallowest cut above the sharpest fall (Llama-3.1-8B keeps
    MMLU with layers 0-17 and falls to chance without L17). The fall at depth d is what the next
    cut loses, acc(d) - acc(d - 1); a fall *collapses* when it takes more than half of what d
    holds above chance. The pick is the depth of the largest collapsing fall (where no fall
    collapses, of the largest fall; the deeper on a tie). This picks the model to study, it is no
    claim: the claims about it ("kept while knowledge falls", "one layer fewer collapses") are
    tested with their intervals, and `pick_by_halves` shows whether the items decide it."""
    acc = {d: s.acc for d, s in by_depth.items()}
    depths = [d for d in sorted(acc) if d - 1 in acc]
    if not depths:
        return max(acc)
    fall = {d: acc[d] - acc[d - 1] for d in depths}
    collapsing = [
        d for d in depths if acc[d] > chance and acc[d - 1] - chance < (acc[d] - chance) / 2
    ]
    return max(collapsing or depths, key=lambda d: (fall[d], d))


def pick_by_halves(by_depth: dict[int, Score], chance: float) -> tuple[int, int]:
    """`minimal_depth` on each half of the items (every other item), to show whether the pick
    rests on a few of them: two equal picks say the walk's items do not decide it."""
    half = lambda k: {d: s.subset(slice(k, None, 2)) for d, s in by_depth.items()}
    return minimal_depth(half(0), chance), minimal_depth(half(1), chance)


def margin_minimal_depth(by_depth: dict[int, Score], margin: float = 0.05) -> int:
    """A variant, not the paper's rule: the shallowest depth from which every deeper cut keeps
    the full model's accuracy within `margin` (the point estimate). It stops above any cut that
    loses more than the margin, however far from a collapse (Qwen's letters: 24 layers, one above
    the paper rule's 23, where the screen's swept layers did nothing)."""
    top = max(by_depth)
    depth = top
    for d in sorted(by_depth, reverse=True)[1:]:
        if by_depth[top].acc - by_depth[d].acc > margin:
            break
        depth = d
    return depth


def probe(result: Pruned) -> str:
    """The retrieval probe the verdicts use: MMLU where the model picks letters above chance,
    else KV retrieval (the book's stand-in, said so on the page)."""
    full = result.scores[result.mmlu][result.n_layers]
    return result.mmlu if full.above(result.chance[result.mmlu]) else result.kv


def published_minimal(model: str) -> int | None:
    """Layers of `model`'s published minimal model: the paper's layers 0-17 for Llama-3.1-8B;
    for the release's other models its own rule (`get_minimal_model`: every layer up to the
    Aggregate heads' layer); None where nothing is published."""
    try:
        return paper("layer_pruning", "minimal_model_last_layer", model).integer + 1
    except KeyError:
        heads = paper_heads(model)
        return heads["A"][0].layer + 1 if heads else None
