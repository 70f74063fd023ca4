"""The package reads top to bottom: each module imports only modules of the layers below it,
there is no import cycle, and no module reaches for another module's private names."""

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import grimp
import pytest
from grimp import Layer

import helpers
from helpers import book

# Top to bottom. Modules of one layer may not import each other unless the layer says so.
LAYERS = [
    Layer("cli"),  # `ga-companion`: imports the command it is given
    Layer("book"),
    Layer("experiments"),
    # what the chapters share (a package of its own, so that experiments/ holds chapters only)
    Layer("protocol"),
    Layer("page", "plots", "bookcheck", "minihub", "cache"),
    Layer("benchmarks", "screen", "lmeval", independent=False),
    Layer("models", "engine"),
    Layer("zoo"),
    Layer("synthetic"),
    Layer("segments"),
    Layer("evaluate"),
    Layer("specs"),  # interventions as data: what the scorers, lm-eval and the cells take
    Layer("interventions", "attention"),
    Layer("packing"),
    Layer("hooks"),  # the one door into a forward pass: named sites, every hook installed here
    Layer("adapters", "llamba"),
    Layer("convllama"),  # the zoo's Transformer; a distilled hybrid keeps its convolution
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
            if isinstance(node, ast.ImportFrom) and (
                node.level or (node.module or "").startswith("helpers")
            ):
                private += [
                    f"{path.relative_to(root)}: {a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    assert not private, private


# experiments/ holds the chapters and nothing else, and no chapter imports another, so that editing
# one chapter's code recomputes that chapter alone: one level. What several chapters read is in
# protocol/, layered bottom to top: a config's fields, checks, models and stores, a chapter's shape, the book's KV ranking, the roles
# and the minimal model, and the two things built on those (head zeroing's screen, which masking
# reads too; the distilled student and its teacher).
CHAPTERS = [md.stem for md in book.chapters()]  # the book's chapters, from _toc.yml
PROTOCOL = [
    Layer("head_screen", "distilled"),
    Layer("roles", "minimal"),
    Layer("shared"),
    Layer("base"),
    Layer("fields", "checks", "loading", "stores"),
]


def test_experiments_holds_the_chapters_and_none_imports_another():
    graph = grimp.build_graph("helpers")
    inside = {m.rpartition(".")[2] for m in graph.find_children("helpers.experiments")}
    assert inside == set(CHAPTERS), (
        f"a chapter not listed: {sorted(inside - set(CHAPTERS))}; "
        f"listed but missing: {sorted(set(CHAPTERS) - inside)}"
    )
    illegal = graph.find_illegal_dependencies_for_layers(
        [Layer(*CHAPTERS)], containers={"helpers.experiments"}
    )
    assert not illegal, [f"{d.importer} -> {d.imported}" for d in illegal]


def test_the_shared_protocol_reads_top_to_bottom():
    graph = grimp.build_graph("helpers")
    inside = {m.rpartition(".")[2] for m in graph.find_children("helpers.protocol")}
    assert inside == {t for layer in PROTOCOL for t in layer.module_tails}, (
        "put each module of protocol/ in a layer"
    )
    illegal = graph.find_illegal_dependencies_for_layers(PROTOCOL, containers={"helpers.protocol"})
    assert not illegal, [f"{d.importer} -> {d.imported}" for d in illegal]


def test_no_f_string_leaves_an_expression_as_text():
    """A plain string joined to an f-string prints its braces as they are: head zeroing's page once
    read "swept head by head{' beside the layers of the paper' + chr(39) + ...}". Text parts of
    f-strings that hold a brace around code (a call, an attribute, an index) are such slips."""
    import re

    code = re.compile(r"\{[^{}]*[A-Za-z_]\w*(\.\w|\(|\[['\"\w])[^{}]*\}")
    slips = []
    for path in sorted(Path(helpers.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                slips += [
                    f"{path.name}:{node.lineno}: {part.value[:80]!r}"
                    for part in node.values
                    if isinstance(part, ast.Constant)
                    and isinstance(part.value, str)
                    and code.search(part.value)
                ]
    assert not slips, slips


# Each command a user types, refused for a bad argument (argparse's exit status 2).
REFUSALS = [
    ["helpers.book", "build", "--profile", "gpu"],
    ["helpers.lmeval", "--tasks"],
    ["helpers.cache", "--nope"],
    ["helpers.kernels", "--now"],
    ["helpers.cli", "lmevl"],
    ["helpers.cli", "book", "where", "--profile", "gpu"],
]


@pytest.mark.parametrize("command", REFUSALS, ids=lambda c: " ".join(c[:2]))
def test_a_command_refuses_a_bad_argument_in_under_a_second_without_torch(command, tmp_path):
    """`import helpers` and the commands' modules load no torch, transformers or pandas (seconds
    each, tens of seconds on a cold disk), so a mistake is answered at once. The time is the best
    of three fresh processes (a busy test lane may stall one)."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import helpers, {command[0]}, sys; "
            "print(*sorted({'torch', 'transformers', 'pandas'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert loaded == []
    # should it not refuse
    times, env = (
        [],
        {**os.environ, "GA_CACHE": str(tmp_path), "GA_RESULTS": str(tmp_path)},
    )
    for _ in range(3):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", *command], capture_output=True, text=True, env=env
        )
        times.append(time.perf_counter() - start)
        assert done.returncode == 2 and "error:" in done.stderr, done.stderr
    assert min(times) < 1.0, times


def test_the_console_script_runs_a_modules_command_line():
    """`ga-companion X ARGS` is `python -m helpers.X ARGS`, from the script pip installs."""
    script = Path(sys.executable).parent / "ga-companion"
    done = subprocess.run(
        [str(script), "book", "where", "--profile", "paper"], capture_output=True, text=True
    )
    alone = subprocess.run(
        [sys.executable, "-m", "helpers.book", "where", "--profile", "paper"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == alone.returncode == 0 and done.stdout == alone.stdout != ""
    listed = subprocess.run([str(script)], capture_output=True, text=True, check=True).stdout
    assert all(
        f"  {name} " in listed for name in ("book", "lmeval", "cache", "kernels", "zoo", "minihub")
    )


def test_the_files_the_lanes_start_with_exist():
    """conftest's LONGEST_FIRST: a renamed file would silently lose its place at the front."""
    from conftest import LONGEST_FIRST

    root = Path(__file__).resolve().parents[1]
    assert [f for f in LONGEST_FIRST if not (root / f).is_file()] == []
