"""The book is citable: CITATION.cff is valid Citation File Format 1.2.0 (its published JSON
schema, kept in tests/data, checked with jsonschema) with the paper as the preferred citation,
the Cite page's BibTeX is well formed and names the same paper, and the repository's address
is the same everywhere it is written (`make sync REPOSITORY=...` writes it) -- on GitHub, the
address of the repository the tests run in."""

import json
import os
import re
import shutil

import jsonschema
import pytest
import yaml

from helpers import book

ROOT = book.ROOT
SCHEMA = json.loads((ROOT / "tests" / "data" / "cff-schema-1.2.0.json").read_text())


def citation() -> dict:
    # CFF is YAML 1.2; safe_load reads dates as dates, which the schema wants as strings
    return json.loads(json.dumps(yaml.safe_load((ROOT / "CITATION.cff").read_text()), default=str))


def test_citation_cff_is_valid():
    jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(
        citation()
    )


def test_the_schema_catches_a_broken_citation():
    broken = {k: v for k, v in citation().items() if k != "authors"}
    with pytest.raises(jsonschema.ValidationError, match="'authors' is a required property"):
        jsonschema.validate(broken, SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**citation(), "preferred-citation": {"type": "paper"}}, SCHEMA)


def test_the_paper_is_the_preferred_citation():
    paper = citation()["preferred-citation"]
    assert paper["type"] == "conference-paper" and paper["year"] == 2025
    assert [a["family-names"] for a in paper["authors"]] == ["Bick", "Xing", "Gu"]
    assert (
        "Gather-and-Aggregate" in paper["title"]
        and paper["url"] == "https://arxiv.org/abs/2504.18574"
    )


def bibtex_entries(text: str) -> dict[str, str]:
    """key -> body of every @type{key, ...} entry inside the page's bibtex blocks, checking that
    each block's braces balance."""
    entries = {}
    for block in re.findall(r"```bibtex\n(.*?)```", text, re.S):
        assert block.count("{") == block.count("}"), block[:80]
        for m in re.finditer(r"@(\w+)\{([\w:-]+),(.*?)\n\}", block, re.S):
            assert m.group(2) not in entries, f"duplicate key {m.group(2)}"
            entries[m.group(2)] = m.group(3)
    return entries


def test_cite_page_has_bibtex_for_the_paper_models_and_benchmarks():
    page = (ROOT / "book" / "cite.md").read_text()
    entries = bibtex_entries(page)
    assert "2504.18574" in entries["bick2025skillgap"]
    for key in (
        "allal2025smollm2",
        "grattafiori2024llama3",
        "bick2025llamba",
        "zuo2024falconmamba",
        "glorioso2024zamba2",
        "hendrycks2021mmlu",
        "clark2018arc",
        "bisk2020piqa",
        "mihaylov2018openbookqa",
        "zellers2019hellaswag",
        "sakaguchi2020winogrande",
    ):
        assert key in entries and re.search(r"title\s*=", entries[key]), key
    assert "book/cite" in book.toc_pages()


def test_bibtex_check_finds_unbalanced_braces():
    with pytest.raises(AssertionError):
        bibtex_entries("```bibtex\n@article{a,\n  title = {x\n}\n```")


def test_the_repository_address_is_the_same_everywhere():
    url = book.repository_url()
    assert book.url_copies() == {name: url for name in book.URL_COPIES}, "run `make sync`"
    assert citation()["repository-code"] == url
    assert f"url    = {{{url}}}" in (ROOT / "book" / "cite.md").read_text()


@pytest.mark.skipif(
    "GITHUB_REPOSITORY" not in os.environ, reason="on GitHub Actions only (GITHUB_REPOSITORY)"
)
def test_on_github_the_address_is_this_repository():
    # The Colab button and every chapter's first cell clone this address.
    want = f"{os.environ.get('GITHUB_SERVER_URL', 'https://github.com')}/{os.environ['GITHUB_REPOSITORY']}"
    assert book.repository_url() == want, (
        f"_config.yml's repository url is {book.repository_url()}, this repository is {want}: "
        f"run `make sync REPOSITORY={want}` and commit"
    )


def test_sync_repository_writes_the_address_everywhere(tmp_path, monkeypatch):
    # A copy of the files sync writes, so that the checkout is left as it is.
    for name in ("_config.yml", "_toc.yml", *book.URL_COPIES):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    monkeypatch.setattr(book, "ROOT", tmp_path)
    monkeypatch.setattr(book, "chapters", lambda: [])
    config_before = (tmp_path / "_config.yml").read_text()
    written = book.sync("https://github.com/someone/ga-fork")
    assert book.repository_url() == "https://github.com/someone/ga-fork"
    assert {p.name for p in written} == {"_config.yml", "CITATION.cff", "cite.md"}
    assert book.url_copies() == {
        name: "https://github.com/someone/ga-fork" for name in book.URL_COPIES
    }
    # only the address changed in _config.yml: its comments and order are kept
    after = (tmp_path / "_config.yml").read_text()
    assert after == config_before.replace(
        re.search(r"url: (\S+)", config_before).group(1), "https://github.com/someone/ga-fork", 1
    )
    # another GitHub address in a copy (the authors' code, say) is not the repository's: kept
    cite = tmp_path / "book" / "cite.md"
    cite.write_text(
        cite.read_text()
        + "\nThe authors' code: https://github.com/goombalab/Gather-and-Aggregate\n"
    )
    book.sync("https://github.com/someone/other")
    assert "https://github.com/goombalab/Gather-and-Aggregate" in cite.read_text()
    assert book.url_copies() == {
        name: "https://github.com/someone/other" for name in book.URL_COPIES
    }
    with pytest.raises(SystemExit, match="OWNER/NAME"):
        book.sync("git@github.com:someone/ga-fork.git")
