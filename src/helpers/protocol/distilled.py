"""The distilled SSM and its Transformer teacher on each profile, and which teacher layer holds
the teacher's aggregation: what the hybrid-swap chapter swaps one layer of, and the hybrid-models
chapter builds its swapped hybrid from, so that both chapters swap the same layer.

Which teacher layer aggregates is decided before any swap is scored, by one of three rules
(`LAYER_RULES`): the released code's Aggregate head (`reference`), the layer whose attention heads
the teacher cannot do without on the retrieval tasks (`layer ablation`), or the Aggregate head
found by behaviour among the top heads of the shared KV ranking (`KV ranking`, `roles.find_roles`:
the assignment every chapter names).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import benchmarks as bm
from .. import registry
from ..engine import SweepEngine
from ..heads import Head
from ..reference import paper, table
from ..specs import Spec
from ..stats import Score
from ..sweep import sweep
from . import loading, roles, shared, stores

LAYER_RULES = ("reference", "layer ablation", "KV ranking")


@dataclass(frozen=True)
class Pair:
    student: str  # the distilled SSM
    teacher: str  # the Transformer it was distilled from, layer by layer
    teacher_layer_by: str  # the rule (`LAYER_RULES`) that names the teacher's aggregating layer


def pair(profile: str) -> Pair:
    """The profile's student, teacher and layer rule (the hybrid-swap chapter's defaults)."""
    # Zeroing a whole layer also finds the layers that only feed the aggregation (in the zoo's
    # Transformer, its first layer, which has no convolution): where the release names no
    # Aggregate head, the KV ranking's, found by behaviour.
    rule = "reference" if profile == "paper" else "KV ranking"
    return Pair(registry.cast(profile, "llamba-unaligned"), registry.cast(profile, "llama"), rule)


def reference_teachers() -> list[str]:
    """Attention models whose Aggregate head the released code names (data/reference)."""
    rows = table()
    rows = rows[(rows.experiment == "head_zeroing") & (rows.quantity == "aggregate_head")]
    return [m for m in rows.model if m in registry.names("attention")]


@dataclass(frozen=True)
class TeacherLayer:
    layer: int
    how: str  # how it was found, with the numbers that decided it
    clean: dict[str, Score]  # benchmark -> the teacher as is (layer ablation only)
    # benchmark -> layer -> attention heads of that layer zeroed
    ablated: dict[str, dict[int, Score]]


def cell_of(b: bm.Benchmark) -> dict:
    """What identifies a benchmark's items in a results store cell: its name (for the rows) and
    its spec (what makes the items again: `benchmarks.from_spec`)."""
    return dict(benchmark=b.name, items=b.spec)


def find_teacher_layer(
    teacher, retrieval: list[bm.Benchmark], rule: str, profile: str, smoke: bool
) -> TeacherLayer:
    """The teacher layer that holds its aggregation, by `rule` (see the module's docstring)."""
    if rule == "reference":
        head = paper("head_zeroing", "aggregate_head", teacher.name).heads[0]
        return TeacherLayer(head.layer, f"the released code's Aggregate head {head}", {}, {})
    if rule == "KV ranking":
        # By behaviour even where the paper names the teacher's heads (measured beside them): `found`.
        found = (roles.find_roles(teacher, profile, smoke).found or {}).get("A")
        if found is not None:
            return TeacherLayer(
                found.layer,
                f"the Aggregate head of the KV ranking, {found} "
                f"(assigned by behaviour among its top heads)",
                {},
                {},
            )
        ranking = shared.kv_ranking(teacher, profile, smoke)
        top = Head(int(ranking.table.layer[0]), int(ranking.table["head"][0]))
        return TeacherLayer(
            top.layer,
            f"no top head of the KV ranking reads the segments' ends as an Aggregate "
            f"head does; the layer of its most harmful head, {top}",
            {},
            {},
        )
    # Zero every attention head of one teacher layer at a time, on each retrieval task.
    store = stores.open_store(
        "hybrid_swap", profile, "teacher-layers", [teacher], measure_teacher_layer
    )
    layers = teacher.adapter.head_layers()
    cells = [
        dict(teacher=teacher.name, layer=l, **cell_of(b))
        for b in retrieval
        for l in [None, *layers]
    ]
    rows = sweep(store, cells, measure_teacher_layer, desc="teacher layers zeroed")
    clean = {r["benchmark"]: Score.from_json(r) for r in rows if r["layer"] is None}
    ablated = {
        b.name: {
            r["layer"]: Score.from_json(r)
            for r in rows
            if r["benchmark"] == b.name and r["layer"] is not None
        }
        for b in retrieval
    }
    # The layer whose loss hurts the retrieval tasks most, their items pooled.
    pooled = {l: Score.pooled(ablated[b.name][l] for b in retrieval) for l in layers}
    layer = min(layers, key=lambda l: pooled[l].acc)
    return TeacherLayer(
        layer,
        f"the layer whose attention heads, zeroed, leave the teacher's retrieval lowest: "
        f"{pooled[layer]} (pooled over {', '.join(b.name for b in retrieval)})",
        clean,
        ablated,
    )


def measure_teacher_layer(cell: dict) -> dict:
    """The teacher on one benchmark (the cell's items) with every attention head of `layer`
    zeroed (None: none), its score (a measurement, `runner`)."""
    teacher = loading.model_for(cell["teacher"])
    engine = SweepEngine(
        teacher, teacher.tokenizer, bm.from_spec(cell["items"], teacher.tokenizer).items
    )
    layer = cell["layer"]
    heads = [] if layer is None else [Head(layer, h) for h in range(teacher.adapter.n_heads(layer))]
    return engine.score(Spec(zero=heads)).to_json()
