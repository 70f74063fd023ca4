"""Progress of long work goes to the person waiting, not onto the page.

In a book build (`helpers.book`) the builder sets `GA_PROGRESS` to a log file that it echoes to
its own terminal; bars are written there, and a chapter's rendered page stays free of them.
Anywhere else bars go where tqdm puts them (a widget in Jupyter or Colab, stderr in a terminal).
Library chatter while a model loads (transformers' loading bars and warnings) is written to
the same place, never to the page. Imports nothing heavy (tqdm).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import sys
from typing import Iterable, TextIO


def stream() -> TextIO | None:
    """Where bars and chatter go: the build's log file, or None (tqdm's own choice)."""
    path = os.environ.get("GA_PROGRESS")
    return open(path, "a", buffering=1) if path else None


def bar(
    iterable: Iterable | None = None,
    desc: str = "",
    total: int | None = None,
    disable: bool = False,
    **kw,
):
    """A tqdm bar (see the module's docstring for where it is shown)."""
    out = stream()
    if out is not None:
        from tqdm.std import tqdm

        return tqdm(
            iterable,
            desc=desc,
            total=total,
            disable=disable,
            file=out,
            mininterval=2,
            ascii=True,
            **kw,
        )
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:  # without ipywidgets tqdm.auto only warns and falls back to text
        from tqdm.std import tqdm
    return tqdm(iterable, desc=desc, total=total, disable=disable, **kw)


@contextlib.contextmanager
def quiet():
    """Silence libraries' loading bars and warnings for the block (they go to the build's log,
    or nowhere outside a build), then restore the loggers and stderr as they were."""
    import transformers

    out = stream() or io.StringIO()
    loggers = [logging.getLogger(name) for name in ("transformers", "huggingface_hub", "datasets")]
    levels = [lg.level for lg in loggers]
    bars = transformers.utils.logging.is_progress_bar_enabled()
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(out):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if bars:
            transformers.utils.logging.enable_progress_bar()
        if out is not sys.stderr:
            out.close()
