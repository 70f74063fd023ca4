"""Results keyed by what computed them: `provenance.measurement_version` hashes the code and
data a store's measurements read, so that editing a figure, a page, a comment or the paper's
reference numbers recomputes nothing, and editing the scorer or a measurement recomputes what
reads it."""

import ast
import importlib
import pkgutil
import shutil
from pathlib import Path

import pytest

from helpers import paths, provenance, runner, zoo
from helpers.experiments import toy_zoo
from helpers.protocol import stores
from helpers.sweep import Store

# a chapter is a module or a package of experiments/
CHAPTERS = sorted(m.name for m in pkgutil.iter_modules([str(provenance.PACKAGE / "experiments")]))
# what chapters share
SHARED = sorted(
    p.stem for p in (provenance.PACKAGE / "protocol").glob("*.py") if p.stem != "__init__"
)


def edited(tmp_path: Path, name: str, *files: str, function: str = "") -> Path:
    """A copy of the package (as `tmp_path/name`) with a statement added to each of `files`: at
    the end, or first in the body of the top-level `function` there."""
    copy = tmp_path / name
    shutil.copytree(provenance.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in files:
        lines = (copy / rel).read_text().splitlines(keepends=True)
        at, indent = len(lines), ""
        if function:
            (node,) = [
                n for n in ast.parse("".join(lines)).body if getattr(n, "name", None) == function
            ]
            at, indent = node.body[0].lineno - 1, " " * node.body[0].col_offset
        lines.insert(at, f"{indent}_edited = 1\n")
        (copy / rel).write_text("".join(lines))
    return copy


def versions(package: Path | None = None) -> dict[str, str]:
    return {
        **{c: provenance.measurement_version(c, package) for c in CHAPTERS},
        **{m: provenance.measurement_version(f"helpers.protocol.{m}", package) for m in SHARED},
    }


# --- the rule, on a package made up for the test ------------------------------------------------


def made_up(root: Path, extra: dict[str, str] | None = None) -> tuple[Path, Path]:
    """A package and a data folder: the chapter `a` imports `stats` at the top, `scorer` inside a
    function and the chapter `b`, which draws with `plots` (presentation); `plots` imports
    `secret`, which nothing else does; `unrelated` is imported by no one."""
    files = {
        "__init__.py": "",
        "experiments/__init__.py": "",
        "experiments/a.py": "from .. import stats\nfrom . import b\n\ndef run():\n    from ..scorer import score\n",
        "experiments/b.py": "from ..plots import figure\n",
        "plots.py": "from . import secret\n",
        "secret.py": "",
        "scorer.py": "",
        "stats.py": "",
        "unrelated.py": "",
        **(extra or {}),
    }
    package, data = root / "helpers", root / "data"
    for rel, text in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    for rel in ("fixtures/items.jsonl", "reference/paper.csv"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text("1\n")
    return package, data


def test_a_module_reads_what_it_imports_anywhere_but_not_through_presentation_modules(tmp_path):
    package, data = made_up(tmp_path / "original")
    assert provenance.measurement_files("a", package) == [
        "__init__.py",
        "experiments/__init__.py",
        "experiments/a.py",
        "experiments/b.py",
        "scorer.py",
        "stats.py",
    ]
    assert provenance.measurement_files("b", package) == [
        "__init__.py",
        "experiments/__init__.py",
        "experiments/b.py",
    ]
    before = {m: provenance.measurement_version(m, package, data) for m in ("a", "b")}

    def after(rel: str = "", data_file: str = "") -> dict[str, str]:
        p, d = made_up(
            tmp_path / f"edit-{len(list(tmp_path.iterdir()))}",
            {rel: "EDITED = 1\n"} if rel else None,
        )
        if data_file:
            (d / data_file).write_text("2\n")
        return {m: provenance.measurement_version(m, p, d) for m in ("a", "b")}

    assert after("plots.py") == after("secret.py") == after("unrelated.py") == before
    assert after(data_file="reference/paper.csv") == before  # the paper's numbers: presentation
    # imported inside a function
    assert after("scorer.py") == {"a": after("scorer.py")["a"], "b": before["b"]} != before
    assert after("experiments/b.py")["a"] != before["a"]  # a chapter it imports
    assert all(v != before[m] for m, v in after(data_file="fixtures/items.jsonl").items())


PACKAGE_CHAPTER = {
    # a chapter that is a package: its figure in __init__.py, its measurement beside it
    "experiments/c/__init__.py": "from .m import measure\n\ndef figure():\n    return 1\n",
    "experiments/c/m.py": (
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from . import figure\n"
        "    from ... import unrelated\n\ndef measure():\n    return 1\n"
    ),
}


def test_a_package_chapters_figure_is_not_read_by_the_measurement_beside_it(tmp_path):
    def version(extra: dict[str, str]) -> tuple[str, list[str]]:
        package, data = made_up(tmp_path / str(len(list(tmp_path.iterdir()))), extra)
        module = "helpers.experiments.c.m"
        return (
            provenance.measurement_version(module, package, data, reads=("measure",)),
            provenance.measurement_files(module, package),
        )

    before, files = version(PACKAGE_CHAPTER)
    # imports under TYPE_CHECKING never run: the package is read as a package, unrelated not at all
    assert "experiments/c/__init__.py" in files and "unrelated.py" not in files
    init, m = PACKAGE_CHAPTER["experiments/c/__init__.py"], PACKAGE_CHAPTER["experiments/c/m.py"]
    figure_edited = {**PACKAGE_CHAPTER, "experiments/c/__init__.py": init.replace("1", "2")}
    assert version(figure_edited)[0] == before
    # what the package runs on import, besides defining and importing, counts
    runs = {**PACKAGE_CHAPTER, "experiments/c/__init__.py": init + "print('set up')\n"}
    assert version(runs)[0] != before
    measure_edited = {**PACKAGE_CHAPTER, "experiments/c/m.py": m.replace("return 1", "return 2")}
    assert version(measure_edited)[0] != before
    imported = {**PACKAGE_CHAPTER, "experiments/c/m.py": m + "from ... import unrelated\n"}
    assert "unrelated.py" in version(imported)[1]


def test_a_module_that_is_no_measurement_is_refused_with_what_is_known():
    with pytest.raises(ValueError, match=r"unknown module 'nope': .*one of .*layer_pruning"):
        provenance.measurement_version("nope")
    with pytest.raises(
        ValueError, match=r"helpers\.plots is presentation .*computes no stored number"
    ):
        provenance.measurement_version("helpers.plots")


CHAPTER = """\"\"\"A chapter.\"\"\"
from .. import stats

STEP = 2
UNUSED = 3


def helper(x):
    return x * STEP


class Result:
    def show(self):
        return figure(self)


def measure(cell):
    \"\"\"One cell.\"\"\"
    return {"y": helper(cell["x"])}


def run():
    def compute(cell):
        return measure(cell)

    return Result()


def figure(result):
    return "drawn"
"""


def test_a_store_reads_its_module_as_far_as_its_measurements_reach(tmp_path):
    package, data = made_up(tmp_path / "original", {"experiments/c.py": CHAPTER})
    assert provenance.reached("c", ("measure",), package) == ["STEP", "helper", "measure"]
    # a closure's measurement is read through the function it is defined in
    assert provenance.reached("c", ("run",), package) == [
        "STEP",
        "helper",
        "Result",
        "measure",
        "run",
        "figure",
    ]
    with pytest.raises(ValueError, match=r"defines no top-level nope: name the functions"):
        provenance.measurement_version("c", package, data, reads=("nope",))

    def version(text: str, reads=("measure",)) -> str:
        p, d = made_up(
            tmp_path / f"edit-{len(list(tmp_path.iterdir()))}", {"experiments/c.py": text}
        )
        return provenance.measurement_version("c", p, d, reads)

    before = version(CHAPTER)
    assert before == provenance.measurement_version("c", package, data, ("measure",))
    unchanged = {
        "the figure": CHAPTER.replace('"drawn"', '"redrawn"'),
        "a class it does not reach": CHAPTER.replace("return figure(self)", "return None"),
        "a constant it does not read": CHAPTER.replace("UNUSED = 3", "UNUSED = 4"),
        "a docstring": CHAPTER.replace("One cell.", "One cell, measured."),
        "a comment and the layout": CHAPTER.replace(
            'return {"y": helper(cell["x"])}',
            '# why\n    return {\n        "y": helper(cell["x"]),\n    }',
        ),
    }
    for what, text in unchanged.items():
        assert version(text) == before, what
    changed = {
        "the measurement": CHAPTER.replace('{"y": ', '{"z": '),
        "a function it calls": CHAPTER.replace("x * STEP", "x + STEP"),
        "a constant it reads": CHAPTER.replace("STEP = 2", "STEP = 5"),
        "an import": CHAPTER.replace("from .. import stats", "from .. import stats, scorer"),
    }
    for what, text in changed.items():
        assert version(text) != before, what
    # the whole module without reads, as a caller outside the package's measurements has it
    assert version(unchanged["the figure"], ()) != version(CHAPTER, ())


# --- the rule on the package itself ---------------------------------------------------------------


def test_no_chapter_reads_a_presentation_module_or_the_reference_numbers():
    presentation = {f"{m}.py" for m in provenance.PRESENTATION}
    for chapter in CHAPTERS:
        files = provenance.measurement_files(chapter)
        own = {f"experiments/{chapter}.py", f"experiments/{chapter}/__init__.py"}
        assert own & set(files) and not presentation & set(files), chapter
    assert provenance.measurement_version("layer_pruning") == provenance.measurement_version(
        "helpers.experiments.layer_pruning"
    )


def stores_opened() -> list[tuple[str, int, tuple[str, ...]]]:
    """Every `open_store` call of the package: its module, line and the functions it names."""
    found = []
    for path in sorted(provenance.PACKAGE.rglob("*.py")):
        parts = path.relative_to(provenance.PACKAGE).with_suffix("").parts
        module = ".".join(("helpers", *parts[: -1 if parts[-1] == "__init__" else None]))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "open_store":
                (reads,) = node.args[4:] or [k.value for k in node.keywords if k.arg == "reads"]
                names = reads.elts if isinstance(reads, ast.Tuple) else [reads]
                found.append((module, node.lineno, tuple(n.id for n in names)))
    return found


def test_every_store_names_its_measurements_and_none_reaches_a_figure_or_a_verdict():
    opened = stores_opened()
    assert len(opened) >= 20
    for module, line, reads in opened:
        # as open_store finds them: each function's own module (a chapter may open a store for a
        # measurement of `protocol`)
        owners = {runner.owner(getattr(importlib.import_module(module), r)) for r in reads}
        (where,) = {o.partition(":")[0] for o in owners}
        reached = set(provenance.reached(where, tuple(o.partition(":")[2] for o in owners)))
        assert not reached & {"figure", "verdicts", "comparison"}, (module, line)


def test_editing_presentation_modules_leaves_every_chapters_version(tmp_path):
    before = versions()
    copy = edited(tmp_path, "helpers", *(f"{m}.py" for m in provenance.PRESENTATION))
    assert versions(copy) == before
    # a copy is the same code
    assert provenance.measurement_version("toy_zoo", edited(tmp_path, "again")) == before["toy_zoo"]


def test_editing_the_scorer_changes_every_chapters_version(tmp_path):
    before, after = versions(), versions(edited(tmp_path, "helpers", "evaluate.py"))
    assert all(after[c] != before[c] for c in CHAPTERS)


def test_editing_a_chapter_changes_its_version_only_and_a_shared_module_its_importers(tmp_path):
    # No chapter imports another (tests/test_layers.py): a chapter's edit recomputes that chapter alone.
    before, after = (
        versions(),
        versions(edited(tmp_path, "helpers", "experiments/layer_pruning.py")),
    )
    assert {c for c in CHAPTERS if after[c] != before[c]} == {"layer_pruning"}
    # The minimal model's walk is read by the chapters that work in the minimal model, by the
    # head screen that two of them share, and by the atlas, which runs that screen on every model.
    after = versions(edited(tmp_path, "again", "protocol/minimal.py"))
    assert {c for c in after if after[c] != before[c]} == {
        "atlas",
        "minimal",
        "head_screen",
        "layer_pruning",
        "layer_removal",
        "head_zeroing",
        "masking",
    }
    assert after["ssm_vs_attention"] == before["ssm_vs_attention"]


# --- end to end: a chapter's run ------------------------------------------------------------------


def numbers(result) -> dict:
    return {
        m: {k: s.to_json() for k, s in scores.items()} for m, scores in result.remeasured.items()
    }


def test_a_presentation_edit_recomputes_no_cell_and_a_scorer_edit_recomputes_every_one(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("GA_RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(stores, "_opened", {})
    computed = []
    put = Store.put
    monkeypatch.setattr(
        Store, "put", lambda self, cell, result: (computed.append(cell), put(self, cell, result))[1]
    )
    cfg = toy_zoo.Config.for_profile("cpu", smoke=True, n=4)
    folder = tmp_path / "results" / "toy_zoo"

    def run(package: Path):
        computed.clear()
        monkeypatch.setattr(provenance, "PACKAGE", package)
        return toy_zoo.run(cfg)

    first = run(provenance.PACKAGE)
    assert len(computed) == len(zoo.RECIPES)
    (store,) = folder.glob("*.jsonl")
    assert first.provenance["stores"] == [store.name] and store.name.endswith(
        f"-{provenance.measurement_version('toy_zoo', reads=('measure_final',))}.jsonl"
    )
    content = store.read_bytes()

    figures = run(edited(tmp_path, "figures", "plots.py", "page.py", "verdicts.py"))
    assert (
        computed == [] and list(folder.glob("*.jsonl")) == [store] and store.read_bytes() == content
    )
    # the chapter's own figure, drawn from the result: nothing recomputed either
    chapter = run(edited(tmp_path, "chapter", "experiments/toy_zoo.py", function="figure"))
    assert (
        computed == [] and list(folder.glob("*.jsonl")) == [store] and store.read_bytes() == content
    )
    # what named the stores before: all recomputed
    assert figures.provenance["code"] != first.provenance["code"]
    assert numbers(figures) == numbers(chapter) == numbers(first)

    measurement = run(
        edited(tmp_path, "measurement", "experiments/toy_zoo.py", function="measure_final")
    )
    assert len(computed) == len(zoo.RECIPES) and len(list(folder.glob("*.jsonl"))) == 2
    assert numbers(measurement) == numbers(first)
    for stale in set(folder.glob("*.jsonl")) - {store}:
        stale.unlink()

    scorer = run(edited(tmp_path, "scorer", "evaluate.py"))
    assert len(computed) == len(zoo.RECIPES) and len(list(folder.glob("*.jsonl"))) == 2
    # the edit changes no number: the same numbers, computed again
    assert numbers(scorer) == numbers(first)
    assert paths.results_dir("toy_zoo") == folder
