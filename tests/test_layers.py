"""The package reads top to bottom: each module imports only modules of the layers below it,
there is no import cycle, and no module reaches for another module's private names."""

import ast
from pathlib import Path

import grimp
from grimp import Layer

import helpers

# Top to bottom. Modules of one layer may not import each other unless the layer says so.
LAYERS = [
    Layer("book"),
    Layer("experiments"),
    Layer("page", "plots", "bookcheck", "minihub"),
    Layer("benchmarks", "screen", "lmeval", independent=False),
    Layer("models", "engine"),
    Layer("zoo"),
    Layer("synthetic"),
    Layer("segments"),
    Layer("evaluate", "interventions", "attention"),
    Layer("packing"),
    Layer("adapters", "llamba", "convllama"),
    Layer("ssm"),
    # The leaves: no torch, no transformers (paths, the registry, statistics, verdicts, tasks...).
    Layer("tasks", "reference", "provenance", "verdicts", "sweep", independent=False),
    # Ray workers for a sweep (Ray imported lazily, only when workers are asked for)
    Layer("runner"),
    Layer("heads", "stats", "registry", "progress", "paths", "errors", "kernels"),
]


def test_modules_import_only_the_layers_below_them():
    graph = grimp.build_graph("helpers")
    illegal = graph.find_illegal_dependencies_for_layers(LAYERS, containers={"helpers"})
    assert not illegal, [f"{d.importer} -> {d.imported}" for d in illegal]
    listed = {f"helpers.{tail}" for layer in LAYERS for tail in layer.module_tails}
    top_level = {m for m in graph.modules if m.count(".") == 1 and m != "helpers.data"}
    assert top_level == listed, f"put these in a layer: {sorted(top_level - listed)}"


def test_no_import_cycles():
    assert grimp.build_graph("helpers").nominate_cycle_breakers("helpers") == set()


def test_no_module_imports_a_private_name_of_another():
    root = Path(helpers.__file__).parent
    private = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("helpers")):
                private += [f"{path.relative_to(root)}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert not private, private


# Inside experiments/: the modules several chapters read (below), and the chapters (above). A
# chapter imports shared modules only, never another chapter, so that editing one chapter's code
# recomputes that chapter alone; the shared modules import no chapter (among themselves they
# import each other without a cycle, which the test above checks).
SHARED = ["base", "shared", "roles", "minimal", "head_screen", "distilled"]
CHAPTERS = ["attention_maps", "beyond_mmlu", "head_zeroing", "hybrid_models", "hybrid_swap", "kv_retrieval",
            "layer_pruning", "layer_removal", "masking", "robustness", "ssm_vs_attention", "toy_zoo"]


def test_no_chapter_imports_another_chapter():
    graph = grimp.build_graph("helpers")
    layers = [Layer(*CHAPTERS), Layer(*SHARED, independent=False)]
    illegal = graph.find_illegal_dependencies_for_layers(layers, containers={"helpers.experiments"})
    assert not illegal, [f"{d.importer} -> {d.imported}" for d in illegal]


def test_every_module_of_experiments_is_shared_or_a_chapter():
    graph = grimp.build_graph("helpers")
    inside = {m.rpartition(".")[2] for m in graph.find_children("helpers.experiments")}
    assert not set(SHARED) & set(CHAPTERS)
    assert inside == set(SHARED) | set(CHAPTERS), (f"put these in SHARED or CHAPTERS: {sorted(inside - set(SHARED) - set(CHAPTERS))}; "
                                                   f"listed but missing: {sorted(set(SHARED) | set(CHAPTERS) - inside)}")
