"""The book as a reader gets it: sources in sync with their Colab notebooks and with the one
repository address in _config.yml; every chapter executes at smoke size on the CPU profile (the
paper profile's rehearsal: test_book_rehearsal.py, so that the two builds run in parallel lanes),
and the rendered pages pass the reader's check at laptop and phone width; a chapter's Colab
notebook sets itself up the way Colab runs it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

from helpers import book

CHAPTERS = book.chapters()
PAGES = [str(md.relative_to(book.ROOT).with_suffix("")) for md in CHAPTERS]


def cells(nb):
    return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_colab_notebook_matches_source(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `make sync`"
    assert cells(jupytext.read(ipynb)) == cells(jupytext.read(md)), (
        f"{ipynb.name} drifted from {md.name}: run `make sync`"
    )


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_a_short_notebook_with_its_verdict_first(md):
    nb = jupytext.read(md)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.strip() == book.colab_cell(book.repository_url()), "run `make sync`"
    assert any("parameters" in c.metadata.get("tags", []) for c in code)
    assert "```{glue:} verdict" in md.read_text().split("**Claim")[0], (
        "the verdict box goes under the title"
    )

    def lines(cell):
        return len(
            [l for l in cell.source.splitlines() if l.strip() and not l.lstrip().startswith("#")]
        )

    # The parameters cell is a list of knobs, one per line; every other cell is a few calls.
    knobs = [lines(c) for c in code[1:] if "parameters" in c.metadata.get("tags", [])]
    calls = [lines(c) for c in code[1:] if "parameters" not in c.metadata.get("tags", [])]
    assert max(knobs) <= 17 and max(calls) <= 12 and sum(knobs + calls) <= 45, (
        f"code lines: parameters {knobs}, other cells {calls}"
    )


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_papermill_reads_every_knob_of_the_parameters_cell(md):
    # papermill skips a line with two '=' (a '>=' in its comment): the knob then vanishes from
    # `papermill --help-notebook` and from inspect_notebook, which readers use to find it.
    import papermill

    nb = jupytext.read(md)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    names = [
        l.split("=")[0].strip()
        for l in cell.source.splitlines()
        if l.strip() and not l.lstrip().startswith("#")
    ]
    path = md.with_suffix(".ipynb")
    assert sorted(papermill.inspect_notebook(str(path))) == sorted(names)


@pytest.fixture(scope="session")
def cpu_book(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    book.build("cpu", smoke=True, out=out)  # raises when a chapter fails or a page fails the check
    return out


def test_cpu_book_passes_the_readers_check_with_every_verdict(cpu_book):
    html = cpu_book / "html"
    for page in PAGES:
        for width in ("laptop", "phone"):
            assert (cpu_book / "screenshots" / f"{page.replace('/', '-')}-{width}.png").exists()
    records = book.records(
        {
            md: cpu_book / "executed" / md.relative_to(book.ROOT).with_suffix(".ipynb")
            for md in CHAPTERS
        }
    )
    assert sorted(records) == sorted(PAGES)
    intro = (html / "book" / "intro.html").read_text()
    assert (
        all(rec["overall"] in intro for rec in records.values())
        and "<!-- verdicts -->" not in intro
    )
    runs = (html / "book" / "runs.html").read_text()
    assert all(rec["provenance"]["code"] in runs for rec in records.values())
    launch = (html / f"{PAGES[0]}.html").read_text()
    assert "colab.research.google.com/github/" in launch and f"{PAGES[0]}.ipynb" in launch


def test_a_smoke_build_runs_small_batches_unless_the_reader_sets_them(monkeypatch):
    from helpers import packing

    monkeypatch.delenv("GA_BATCH_TOKENS", raising=False)
    with book.smoke_batches():
        assert packing.batch_tokens_set() == book.SMOKE_BATCH_TOKENS
    assert packing.batch_tokens_set() is None
    monkeypatch.setenv("GA_BATCH_TOKENS", "64")
    with book.smoke_batches():
        assert packing.batch_tokens_set() == 64


COLAB = """
import importlib.machinery, sys, types
colab = types.ModuleType("google.colab")  # what Colab's runtime has imported
colab.__spec__ = importlib.machinery.ModuleSpec("google.colab", None)
sys.modules["google.colab"] = colab
for source in {cells!r}:
    exec(source)
import helpers
print(helpers.__file__)
print(__import__("helpers.paths").paths.data())
"""


def test_the_colab_notebook_installs_from_the_repository_and_runs_its_first_cells(tmp_path):
    """The committed Colab notebook's setup cell, run as Colab runs it (google.colab imported),
    clones the repository (here: a clone of this checkout's HEAD), installs it into a fresh
    environment and makes its package and data importable; then the notebook's parameters and
    first chapter cell run at smoke size. The environment sees this venv's packages but not its
    install of the companion."""
    origin = tmp_path / "origin"
    subprocess.run(["git", "clone", "-q", "--no-local", str(book.ROOT), str(origin)], check=True)
    env_dir = tmp_path / "colab-env"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    site = next((env_dir / "lib").glob("python*/site-packages"))
    ours = next(
        p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "torch").exists()
    )
    # a path line: its own .pth files are not run
    (site / "venv-packages.pth").write_text(str(ours) + "\n")
    nb = jupytext.read(book.ROOT / "book" / "layer_pruning.ipynb")
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    setup = code[0].replace(book.repository_url(), origin.as_uri())
    # SmolLM2 (1 GB, 20 s to load) rather than the chapter's letter model: this tests the install.
    sources = [setup, code[1] + "\nsmoke = True\nmodel = 'smollm2-135m-instruct'", code[2]]
    work = tmp_path / "content"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GA_DATA")}
    done = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", COLAB.format(cells=sources)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    package, data = done.stdout.split()[-2:]
    assert package == str(work / "ga-companion" / "src" / "helpers" / "__init__.py")
    assert data == str(work / "ga-companion" / "data")


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({"profile": "gpu"}, "unknown profile 'gpu': use one of cpu, paper, paper-3b"),
        ({"n_kv": -5}, "n_kv must be at least 1, got -5"),
        (
            {"n_mapz": 3, "sed": 5},
            "layer_pruning has no parameter n_mapz, sed \\(passed to papermill\\); did you mean "
            "sed -> seed\\?; its parameters: "
            "profile, smoke, model, n_mmlu, k_shot, n_knowledge, n_kv, kv_pairs, kv_query, seed",
        ),
    ],
)
def test_a_chapter_with_bad_parameters_stops_in_its_first_cells(tmp_path, parameters, message):
    """Before any model loads, and with no figure or table drawn; the error is its message alone,
    and a mistyped name is refused before torch is imported, in under a second."""
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match=message):
        book.execute(book.ROOT / "book" / "layer_pruning.md", tmp_path / "out.ipynb", parameters)
    nb = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    outputs = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") != "error"]
    assert not outputs, outputs
    failed = next(
        c for c in nb.cells if any(o.get("output_type") == "error" for o in c.get("outputs", []))
    )
    assert [o["traceback"] for o in failed.outputs] == [
        [f"ConfigError: {message}".replace("\\", "")]
    ]
    if "sed" in parameters:
        assert failed.metadata.papermill.duration < 1.0
    assert not (tmp_path / "out.record.json").exists()


def test_cpu_book_offers_downloads_and_a_dark_screenshot_pair(cpu_book):
    # every page checked and screenshotted in the dark scheme too; tables with CSV, figures
    # with SVG, the Runs page's records as CSV and JSON, the link to the paper-profile book
    html = cpu_book / "html"
    for page in PAGES:
        for width in ("laptop", "phone"):
            assert (
                cpu_book / "screenshots" / f"{page.replace('/', '-')}-{width}-dark.png"
            ).exists()
    pages = {page: (html / f"{page}.html").read_text() for page in PAGES}
    assert all('download="' in text and "data:text/csv" in text for text in pages.values())
    # every chapter's stores zipped and linked; no two tables of a page download to one file name
    assert [p for p in PAGES if f"{Path(p).name}-results.zip" not in pages[p]] == []
    for page, text in pages.items():
        names = re.findall(r'download="([^"]+\.csv)"', text)
        assert len(names) == len(set(names)), (page, names)
    assert any("-figure-1.svg" in text for text in pages.values())
    runs = (html / "book" / "runs.html").read_text()
    assert "runs.csv" in runs and "runs.json" in runs and 'href="../paper/index.html"' in runs
    assert "@inproceedings" in (html / "book" / "cite.html").read_text()


def test_two_chapter_kernels_started_at_once_get_sockets_of_their_own(tmp_path, monkeypatch):
    """Two builds in one repository (the suite's two lanes) once chose the same IPC sockets, the
    first free names in the working directory, and a kernel answered the other build's client."""
    monkeypatch.chdir(tmp_path)
    managers = [book.kernel_manager()(kernel_name="python3") for _ in range(2)]
    sockets = []
    for km in managers:
        km.write_connection_file()  # the names are chosen here, before either kernel binds them
        sockets.append({f"{km.ip}-{port}" for port in km.ports})
    try:
        assert all(len(s) == 5 for s in sockets)
        assert not sockets[0] & sockets[1]
        assert not list(tmp_path.iterdir())  # nothing in the working directory
    finally:
        for km in managers:
            km.cleanup_connection_file()
