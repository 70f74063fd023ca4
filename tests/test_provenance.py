"""Results keyed by what computed them: `provenance.measurement_version` hashes the code and
data a module's measurements read, so that editing a figure, a page or the paper's reference
numbers recomputes nothing, and editing the scorer or a chapter recomputes what reads it."""

import shutil
from pathlib import Path

import pytest

from helpers import paths, provenance, zoo
from helpers.experiments import toy_zoo
from helpers.protocol import base
from helpers.sweep import Store

CHAPTERS = sorted(
    p.stem for p in (provenance.PACKAGE / "experiments").glob("*.py") if p.stem != "__init__"
)
# what chapters share
SHARED = sorted(
    p.stem for p in (provenance.PACKAGE / "protocol").glob("*.py") if p.stem != "__init__"
)


def edited(tmp_path: Path, name: str, *files: str) -> Path:
    """A copy of the package (as `tmp_path/name`) with a line added to each of `files`."""
    copy = tmp_path / name
    shutil.copytree(provenance.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for rel in files:
        with open(copy / rel, "a") as f:
            f.write("\n# an edit\n")
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
            tmp_path / f"edit-{len(list(tmp_path.iterdir()))}", {rel: "# edited\n"} if rel else None
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


def test_a_module_that_is_no_measurement_is_refused_with_what_is_known():
    with pytest.raises(ValueError, match=r"unknown module 'nope': .*one of .*layer_pruning"):
        provenance.measurement_version("nope")
    with pytest.raises(
        ValueError, match=r"helpers\.plots is presentation .*computes no stored number"
    ):
        provenance.measurement_version("helpers.plots")


# --- the rule on the package itself ---------------------------------------------------------------


def test_no_chapter_reads_a_presentation_module_or_the_reference_numbers():
    presentation = {f"{m}.py" for m in provenance.PRESENTATION}
    for chapter in CHAPTERS:
        files = provenance.measurement_files(chapter)
        assert f"experiments/{chapter}.py" in files and not presentation & set(files), chapter
    assert provenance.measurement_version("layer_pruning") == provenance.measurement_version(
        "helpers.experiments.layer_pruning"
    )


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
    # The minimal model's walk is read by the chapters that work in the minimal model, and by the
    # head screen that two of them share.
    after = versions(edited(tmp_path, "again", "protocol/minimal.py"))
    assert {c for c in after if after[c] != before[c]} == {
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
    monkeypatch.setattr(base, "_opened", {})
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
        f"-{provenance.measurement_version('toy_zoo')}.jsonl"
    )
    size = store.stat().st_size

    figures = run(edited(tmp_path, "figures", "plots.py", "page.py", "verdicts.py"))
    assert (
        computed == [] and list(folder.glob("*.jsonl")) == [store] and store.stat().st_size == size
    )
    # what named the stores before: all recomputed
    assert figures.provenance["code"] != first.provenance["code"]
    assert numbers(figures) == numbers(first)

    scorer = run(edited(tmp_path, "scorer", "evaluate.py"))
    assert len(computed) == len(zoo.RECIPES) and len(list(folder.glob("*.jsonl"))) == 2
    # the edit was a comment: the same numbers, computed again
    assert numbers(scorer) == numbers(first)
    assert paths.results_dir("toy_zoo") == folder
