"""What a chapter shows its reader: the verdict box, tables, and how the page was made.

Everything is HTML that the rendered book, Jupyter and Colab all display the same way (a
markdown table printed from a cell would reach the book as raw pipe text). The verdict box is
computed after the run but shown at the top of the page through myst-nb's `glue` (the page's
markdown holds ```{glue:} verdict```); outside a book build (Colab, Jupyter) it is displayed
where it is computed. When the book builder asks (`GA_PAGE_RECORD`), the page's verdicts and
provenance are also written to a file, for the book's summary and Runs pages.
"""

from __future__ import annotations

import html
import json
import os
from typing import Iterable

import pandas as pd
from IPython.display import HTML, display

from .stats import brief
from .verdicts import CHECK, Verdict, overall, tested_note

SCORE_COLUMNS = ("acc", "lo", "hi")


def _badge(outcome: str) -> str:
    return f'<span class="ga-badge ga-{outcome.replace(" ", "-")}">{html.escape(outcome)}</span>'


def verdict_html(verdicts: list[Verdict], subject: str) -> str:
    """The box: the page's overall outcome, then each claim with its outcome and evidence."""
    items = "".join(
        f"<li>{_badge(v.outcome)} <strong>{'check: ' if v.kind == CHECK else ''}{html.escape(v.claim)}</strong> "
        f"<span class='ga-source'>({html.escape(v.source)})</span><br>"
        f"<span class='ga-evidence'>{html.escape(v.evidence)}</span></li>" for v in verdicts)
    head = (f"{_badge(overall(verdicts))} <span>{html.escape(subject)}</span> "
            f"<span class='ga-source'>({html.escape(tested_note(verdicts))})</span>")
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
            json.dump({"chapter": chapter, "subject": subject, "overall": overall(verdicts),
                       "tested": tested_note(verdicts),
                       "verdicts": [v.__dict__ for v in verdicts], "provenance": provenance}, f, indent=1)


def publish(chapter, result) -> None:
    """`verdict` for a chapter module's run: its verdicts, subject and provenance."""
    verdict(chapter.verdicts(result), chapter.subject(result), result.provenance, result.cfg.chapter)


def table(frame: pd.DataFrame, percent: Iterable[str] = (), integer: Iterable[str] = ("n",),
          index: bool = False) -> None:
    """A DataFrame as an HTML table that fits a phone (it scrolls inside its own box): columns
    in `percent` as percentages, `integer` ones as whole numbers, text as it is."""
    formats = {c: "{:.1%}" for c in percent if c in frame.columns}
    formats |= {c: "{:.0f}" for c in integer if c in frame.columns}
    styler = frame.style.format(formats, na_rep="-")
    if not index:
        styler = styler.hide(axis="index")
    display(HTML(f'<div class="ga-table">{styler.to_html()}</div>'))


def scores(frame: pd.DataFrame, label_columns: Iterable[str]) -> pd.DataFrame:
    """Rows with acc, lo, hi, n as text: "68.0% [58.3, 76.3]" and n, beside their labels."""
    out = frame[list(label_columns)].copy()
    out["accuracy [95% interval]"] = [brief(a, lo, hi) for a, lo, hi in zip(frame.acc, frame.lo, frame.hi)]
    out["n"] = frame.n.astype(int)
    return out


def provenance(record: dict) -> None:
    """The collapsed "how this page was made" block."""
    commit = record.get("commit", "not a git checkout")
    if record.get("dirty"):
        commit += " (with uncommitted changes)"
    rows = [("commit", commit), ("code version", record.get("code", "")),
            ("profile", record.get("profile", "")),
            ("models (revision)", "; ".join(f"{k} ({v})" for k, v in record.get("models", {}).items())),
            ("device", record.get("device", "")), ("dtype", record.get("dtype", "")),
            ("packages", ", ".join(f"{k} {v}" for k, v in record.get("versions", {}).items())),
            ("parameters", ", ".join(f"{k}={v}" for k, v in record.get("parameters", {}).items())),
            ("run time", f"{record.get('wall_s', 0):.0f} s (results already in the store are not recomputed)")]
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    display(HTML(f'<details class="ga-provenance"><summary>How this page was made</summary>'
                 f'<div class="ga-table"><table>{cells}</table></div></details>'))
