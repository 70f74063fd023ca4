"""Every chapter executes at smoke size in the paper profile's rehearsal (a mini-hub of
random-weight paper models on CPU, in the GPU's bfloat16 where the CPU computes it natively, else in
float32: `book.rehearsal_hub`), and the pages say it is a rehearsal.
Its own file, so that pytest-xdist runs it beside the CPU book (test_book.py)."""

import json

import nbformat
import pytest

from helpers import book, models, registry

CHAPTERS = book.chapters()
PAGES = [str(md.relative_to(book.ROOT).with_suffix("")) for md in CHAPTERS]


@pytest.fixture(scope="session")
def rehearsal(tmp_path_factory):
    out = tmp_path_factory.mktemp("rehearsal")
    book.build("paper", smoke=True, rehearsal=True, out=out)
    return out


def test_every_chapter_ran_the_paper_profile_on_paper_models_in_the_rehearsal(rehearsal):
    paper_models = {n for n, s in registry.MODELS.items() if s.profile == "paper"}
    dtype = str(models.cpu_dtype()).removeprefix("torch.")
    for md in CHAPTERS:
        nb = nbformat.read(
            rehearsal / "executed" / md.relative_to(book.ROOT).with_suffix(".ipynb"), as_version=4
        )
        assert nb.metadata.papermill.parameters == {"profile": "paper", "smoke": True}, md.stem
        record = json.loads(
            (
                rehearsal / "executed" / md.relative_to(book.ROOT).with_suffix(".record.json")
            ).read_text()
        )
        used = set(record["provenance"]["models"])
        # The zoo's own pages run the zoo on every profile; every other chapter loads a paper model.
        assert used <= paper_models if md.stem not in ("toy_zoo", "retrieval_aware") else used, (
            md.stem,
            used,
        )
        # the GPU's dtype where native, so that its paths fail here first
        if md.stem not in ("toy_zoo", "retrieval_aware"):
            assert record["provenance"]["dtype"] == dtype, md.stem
            # and the revisions the stores' sidecars keep say so: a float32 store is not read as bfloat16's
            assert all(r.endswith(f" {dtype}") for r in record["provenance"]["models"].values()), (
                record["provenance"]
            )
    page = (rehearsal / "html" / f"{PAGES[0]}.html").read_text()
    assert f"Rehearsal: the paper profile on random weights, executed on CPU in {dtype}" in page
