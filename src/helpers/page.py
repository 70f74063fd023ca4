"""What a chapter shows its reader: the verdict box, tables, and how the page was made.

Everything is HTML that the rendered book, Jupyter and Colab all display the same way (a
markdown table printed from a cell would reach the book as raw pipe text). The verdict box is
computed after the run but shown at the top of the page through myst-nb's `glue` (the page's
markdown holds ```{glue:} verdict```); outside a book build (Colab, Jupyter) it is displayed
where it is computed. When the book builder asks (`GA_PAGE_RECORD`), the page's verdicts and
provenance are also written to a file, for the book's summary and Runs pages.

Every table carries a link to its rows as CSV (the file inside the link, so it works in Colab and
Jupyter as in the book), and figures are drawn as PNG and SVG both: the book shows the PNG and
links the SVG (`helpers.book.staged_notebook`).
"""

from __future__ import annotations

import ast
import difflib
import html
import json
import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Iterable
from urllib.parse import quote

from IPython.display import HTML, Markdown, display

from . import stats
from .errors import ConfigError, InterventionError, StaleResults, StoreError
from .verdicts import CHECK, Verdict, overall, tested_note

if TYPE_CHECKING:  # pandas loads in 0.4 s: not before a chapter's parameters are checked
    import pandas as pd


# transformers says once per process, on stderr, that an SSM runs its reference kernels (no
# mamba-ssm / causal-conv1d; always on a CPU): on a page that is a red box in the middle of a
# section. Every chapter imports this module first (`page.start`), so this is the one place that
# says so; whether the fused kernels ran is in each page's provenance (`helpers.kernels`).
logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)


# What papermill injects itself (--inject-paths, --inject-input-path, --inject-output-path).
PAPERMILL_NAMES = ("PAPERMILL_INPUT_PATH", "PAPERMILL_OUTPUT_PATH")

# A user's mistakes, whose messages name the fix: in a notebook, shown as that one line.
USER_ERRORS = (ConfigError, InterventionError, StoreError, StaleResults)


def start(chapter: str) -> None:
    """A chapter's first call, before anything heavy is imported. In a notebook kernel: show a
    user's mistake (`USER_ERRORS`) as its one-line message rather than a traceback, and, when
    papermill ran the notebook, stop if it was passed a parameter that the parameters cell does
    not set (papermill itself only logs "Passed unknown parameter" and runs the chapter on its
    defaults). papermill runs its injected cell, which starts with "# Parameters", right after the
    parameters cell; the kernel's input history holds both, and the names each assigns are
    compared. In a kernel, figures are drawn as PNG and SVG. Outside a kernel, nothing."""
    ipython = sys.modules.get("IPython")  # not imported: not in a kernel
    shell = (
        ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    )
    if hasattr(shell, "set_custom_exc"):
        shell.set_custom_exc(USER_ERRORS, _one_line)
    history = getattr(shell, "user_ns", {}).get("In", [])
    for i in range(len(history) - 1, 1, -1):
        if history[i].lstrip().startswith("# Parameters"):
            injected, declared = _assigned(history[i]), _assigned(history[i - 1])
            if unknown := [n for n in injected if n not in declared and n not in PAPERMILL_NAMES]:
                hints = [
                    f"{n} -> {close[0]}"
                    for n in unknown
                    if (close := difflib.get_close_matches(n, declared, n=1))
                ]
                raise ConfigError(
                    f"{chapter} has no parameter {', '.join(unknown)} (passed to papermill)"
                    f"{'; did you mean ' + ', '.join(hints) + '?' if hints else ''}"
                    f"; its parameters: {', '.join(declared)}"
                )
            break
    if type(shell).__name__ == "ZMQInteractiveShell":  # a kernel (papermill's, Jupyter's, Colab's)
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("png", "svg")  # the book shows the PNG and links the SVG


def _one_line(shell, etype, value, tb, tb_offset=None):
    """IPython's handler for USER_ERRORS: the structured traceback is the message alone."""
    stb = [f"{etype.__name__}: {value}"]
    shell._showtraceback(etype, value, stb)
    return stb


def _assigned(source: str) -> list[str]:
    """The names a cell assigns at its top level, in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [
        t.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    ]


def _badge(outcome: str) -> str:
    return f'<span class="ga-badge ga-{outcome.replace(" ", "-")}">{html.escape(outcome)}</span>'


def verdict_html(verdicts: list[Verdict], subject: str) -> str:
    """The box: the page's overall outcome, then each claim with its outcome and evidence."""
    items = "".join(
        f"<li>{_badge(v.outcome)} <strong>{'check: ' if v.kind == CHECK else 'headline: ' if v.headline else ''}"
        f"{html.escape(v.claim)}</strong> "
        f"<span class='ga-source'>({html.escape(v.source)})</span><br>"
        f"<span class='ga-evidence'>{html.escape(v.evidence)}</span></li>"
        for v in verdicts
    )
    head = (
        f"{_badge(overall(verdicts))} <span>{html.escape(subject)}</span> "
        f"<span class='ga-source'>({html.escape(tested_note(verdicts))})</span>"
    )
    return f'<div class="ga-verdict"><p class="ga-verdict-head">{head}</p><ul>{items}</ul></div>'


def _glue(name: str, obj) -> None:
    try:
        from myst_nb import glue
    except ImportError:  # Colab, plain Jupyter: show it here
        display(obj)
        return
    glue(name, obj, display=False)


def verdict(verdicts: list[Verdict], subject: str, provenance: dict, chapter: str) -> None:
    """Publish the page's verdicts: glued as `verdict` for the box at the top of the page, and
    recorded for the book builder when it asks (`GA_PAGE_RECORD`)."""
    _glue("verdict", HTML(verdict_html(verdicts, subject)))
    target = os.environ.get("GA_PAGE_RECORD")
    if target:
        with open(target, "w") as f:
            json.dump(
                {
                    "chapter": chapter,
                    "subject": subject,
                    "overall": overall(verdicts),
                    "tested": tested_note(verdicts),
                    "verdicts": [v.__dict__ for v in verdicts],
                    "provenance": provenance,
                },
                f,
                indent=1,
            )


def publish(chapter, result) -> None:
    """`verdict` for a chapter module's run: its verdicts, subject and provenance."""
    verdict(
        chapter.verdicts(result), chapter.subject(result), result.provenance, result.cfg.chapter
    )


def csv_link(frame: pd.DataFrame, name: str) -> str:
    """A link that downloads the frame's rows as `<name>.csv`, the file inside the link; a cell
    holding an estimate gives its numbers (`numeric`)."""
    data = quote(numeric(frame).to_csv(index=False))
    return (
        f'<a class="ga-download" download="{html.escape(name)}.csv" '
        f'href="data:text/csv;charset=utf-8,{data}">CSV</a>'
    )


def numeric(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows as a tool reads them: each column holding estimates (Score, TaskMean, Difference,
    Estimate) becomes its values, unrounded, beside `<column> lo`, `<column> hi` and, where the
    estimates count items, `<column> n`; a cell without one keeps its text there."""
    import pandas as pd

    out = {}
    for column in frame.columns:
        parts = [stats.numbers(v) for v in frame[column]]
        if not any(parts):
            out[column] = frame[column]
            continue
        out[column] = [p[0] if p else v for p, v in zip(parts, frame[column])]
        out[f"{column} lo"] = [p[1] if p else None for p in parts]
        out[f"{column} hi"] = [p[2] if p else None for p in parts]
        if any(p and p[3] is not None for p in parts):
            out[f"{column} n"] = [p[3] if p else None for p in parts]
    return pd.DataFrame(out)


def _shown(cell) -> str:
    """An estimate as its table cell: an accuracy "68.0% [58.3, 76.3]", a difference
    "-9.4 points [-12.1, -6.7], McNemar p=...", an Estimate as it formats."""
    return cell.brief if isinstance(cell, stats.Accuracy) else str(cell)


_NAMED: set[str] = set()  # the CSV names this page (this kernel) has given


def _unique(name: str) -> str:
    """`name`, or `name-2`, `name-3`... when a table of this page already downloads as `name`."""
    unique, i = name, 1
    while unique in _NAMED:
        i += 1
        unique = f"{name}-{i}"
    _NAMED.add(unique)
    return unique


def _file_name(frame: pd.DataFrame) -> str:
    words = re.sub(r"[^a-z0-9]+", "-", " ".join(map(str, frame.columns[:3])).lower()).strip("-")
    return words[:60] or "table"


def table(
    frame: pd.DataFrame,
    percent: Iterable[str] = (),
    integer: Iterable[str] = ("n",),
    index: bool = False,
    name: str | None = None,
    rows: pd.DataFrame | None = None,
) -> None:
    """A DataFrame as an HTML table that fits a phone (it scrolls inside its own box): columns
    in `percent` as percentages, `integer` ones as whole numbers, estimates (a Score, a
    Difference, an Estimate) as their value and interval, text as it is; under it a link to its
    rows as CSV (`name`.csv, by default named after its first columns), with the estimates'
    numbers unrounded in columns of their own. A table that shows a view of other rows (a pivot
    with two numbers in a cell, a range) downloads those `rows` instead."""
    formats = {c: "{:.1%}" for c in percent if c in frame.columns}
    formats |= {c: "{:.0f}" for c in integer if c in frame.columns}
    formats |= {
        c: lambda v: _shown(v) if stats.numbers(v) else v
        for c in frame.columns
        if c not in formats and frame[c].map(stats.numbers).notna().any()
    }
    styler = frame.style.format(formats, na_rep="-")
    if not index:
        styler = styler.hide(axis="index")
    if rows is None:
        rows = frame.reset_index() if index else frame
    link = csv_link(rows, _unique(name or _file_name(frame)))
    display(
        HTML(
            f'<div class="ga-table">{styler.to_html()}</div><p class="ga-downloads">Download: {link}</p>'
        )
    )


def scores(frame: pd.DataFrame, label_columns: Iterable[str]) -> pd.DataFrame:
    """Rows of acc, lo, hi as one "accuracy [95% interval]" column of estimates ("68.0% [58.3,
    76.3]" on the page, the numbers in the CSV), beside their labels and n."""
    out = frame[list(label_columns)].copy()
    out["accuracy [95% interval]"] = [
        stats.Estimate(a, lo, hi, percent=True) for a, lo, hi in zip(frame.acc, frame.lo, frame.hi)
    ]
    out["n"] = frame.n.astype(int)
    return out


def verdict_box(verdicts: list[Verdict], subject: str) -> None:
    """A second subject's verdicts where they are run, in the box of the page's first (which the
    top of the page holds and the builder records)."""
    display(HTML(verdict_html(verdicts, subject)))


def note(text: str) -> None:
    """A sentence computed by the run, shown as a paragraph of the page (nothing when empty)."""
    if text:
        display(Markdown(text))


def near_ties(scores: dict[str, stats.Score], record: dict) -> None:
    """Where the run computed in bfloat16 (the page's provenance `record` says): how many items of
    each named score are right or wrong by less than bfloat16's rounding (`stats.near_ties`), so
    that a float32 rerun could score them otherwise. Scores that kept no margins are left out."""
    counted = {name: (stats.near_ties(s), s.n) for name, s in scores.items()}
    counted = {name: (k, n) for name, (k, n) in counted.items() if k is not None}
    if record.get("dtype") != "bfloat16" or not counted:
        return
    bound = stats.BFLOAT16_MARGIN
    listed = "; ".join(f"{name}: {k} of {n} ({k / n:.0%})" for name, (k, n) in counted.items())
    note(
        f"**Near ties.** This run computes in bfloat16, which moves the difference between two choices' "
        f"log-likelihoods by less than {bound} nats on 95% of items (measured against float32 on SmolLM2's KV "
        f"prompts; letter questions move less). Items whose "
        f"right answer is within {bound} nats of the best other choice, so that this rounding could make them "
        f"right or wrong: {listed}. `GA_DTYPE=float32` reruns the chapter in float32."
    )


def provenance(record: dict) -> None:
    """The collapsed "how this page was made" block."""
    commit = record.get("commit", "not a git checkout")
    if record.get("dirty"):
        commit += " (with uncommitted changes)"
    models = record.get("models", {})
    quantized = record.get("quantization", {})
    rows = [
        ("date (UTC)", record.get("date", "")),
        ("commit", commit),
        ("code version", record.get("code", "")),
        ("profile", record.get("profile", "")),
        ("models (revision)", "; ".join(f"{k} ({v})" for k, v in models.items())),
        (
            "weights",
            "; ".join(f"{k}: {v}" for k, v in quantized.items()) or "as published (not quantized)",
        ),
        (
            "datasets (revision, fingerprint)",
            "; ".join(f"{k}: {v}" for k, v in record.get("datasets", {}).items()),
        ),
        ("device", record.get("device", "")),
        (
            "CUDA, driver",
            f"{record.get('cuda', '')}, {record.get('driver', '')}" if "cuda" in record else "",
        ),
        ("dtype", record.get("dtype", "")),
        ("kernels", ", ".join(f"{k} {v}" for k, v in record.get("kernels", {}).items())),
        ("packages", ", ".join(f"{k} {v}" for k, v in record.get("versions", {}).items())),
        ("parameters", ", ".join(f"{k}={v}" for k, v in record.get("parameters", {}).items())),
        (
            "run time",
            f"{record.get('wall_s', 0):.0f} s (results already in the store are not recomputed)",
        ),
    ]
    cells = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    display(
        HTML(
            f'<details class="ga-provenance"><summary>How this page was made</summary>'
            f'<div class="ga-table"><table>{cells}</table></div></details>'
        )
    )
