"""The book: sources in sync with the Colab notebooks, every chapter executes under papermill at
smoke size, and the rendered HTML shows each chapter's figures and no errors in a real browser."""

import re
import shutil

import jupytext
import pytest
import yaml

from helpers import book

CHAPTERS = book.chapters()
_executed = {}


def cells(nb):
    return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_colab_notebook_matches_source(md):
    ipynb = md.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} is missing: run `make sync`"
    assert cells(jupytext.read(ipynb)) == cells(jupytext.read(md)), f"{ipynb.name} drifted from {md.name}: run `make sync`"


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_installs_from_the_books_repository(md):
    url = yaml.safe_load((book.ROOT / "_config.yml").read_text())["repository"]["url"]
    clones = re.findall(r"git clone .*?(https://\S+)", md.read_text())
    assert clones == [url]


def test_every_chapter_has_a_parameters_cell():
    for md in CHAPTERS:
        tags = [c.metadata.get("tags", []) for c in jupytext.read(md).cells]
        assert ["parameters"] in tags, md.name


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("book")


@pytest.mark.parametrize("md", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_executes_at_smoke_size(md, out_dir):
    target = out_dir / "executed" / md.relative_to(book.ROOT).with_suffix(".ipynb")
    _executed[md] = book.execute(md, target, {"smoke": True})
    outputs = [o for c in jupytext.read(target).cells for o in c.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in outputs), "the chapter drew no figure"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed (make browser)")
def test_rendered_book_shows_figures_and_no_errors(out_dir):
    missing = [md for md in CHAPTERS if md not in _executed]
    for md in missing:
        _executed[md] = book.execute(md, out_dir / "executed" / md.relative_to(book.ROOT).with_suffix(".ipynb"),
                                     {"smoke": True})
    html = book.render(book.stage(_executed, out_dir / "stage"), out_dir)
    pages = [str(md.relative_to(book.ROOT).with_suffix("")) for md in CHAPTERS]
    assert book.check_html(html, pages) == []
    assert (html / "book" / "intro.html").exists()
    launch = (html / f"{pages[0]}.html").read_text()
    assert f"colab.research.google.com/github/" in launch and f"{pages[0]}.ipynb" in launch
