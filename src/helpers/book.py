"""Build the book: execute every chapter with papermill, render with Jupyter Book 1.x, and check
the rendered pages in a headless browser.

    python -m helpers.book sync              # write book/*.ipynb (for Colab) from book/*.md
    python -m helpers.book build [--smoke]   # execute all chapters, render _build/html, check it

Chapters are MyST-markdown notebooks (jupytext). papermill does not read jupytext, so each is
read with jupytext and executed by papermill in one process. The rendered book is built from a
staging folder that holds the executed notebooks in place of the `.md` sources, so Jupyter Book
runs nothing itself (`execute_notebooks: off`) and the launch buttons, which point at
`book/<chapter>.ipynb` in the repository, open the committed notebook in Colab.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"


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


def sync() -> list[Path]:
    """Write the Colab notebooks (`book/<name>.ipynb`, no outputs) from the `.md` sources whose
    cells changed; returns the notebooks written."""
    import jupytext

    def cells(nb):
        return [(c.cell_type, c.source.strip(), sorted(c.metadata.get("tags", []))) for c in nb.cells]

    written = []
    for md in chapters():
        target = md.with_suffix(".ipynb")
        source = jupytext.read(md)
        if target.exists() and cells(jupytext.read(target)) == cells(source):
            continue  # unchanged: keep the file (and its cell ids) as committed
        jupytext.write(source, target)
        written.append(target)
    return written


def execute(md: Path, output: Path, parameters: dict | None = None, cwd: Path = ROOT) -> Path:
    import jupytext
    import papermill

    nb = jupytext.read(md)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    output.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(nb, str(output), parameters=parameters or {}, cwd=str(cwd),
                               kernel_name="python3", progress_bar=False)
    return output


def stage(executed: dict[Path, Path], stage_dir: Path) -> Path:
    """A copy of the book sources with executed notebooks in place of the chapters' `.md`."""
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy(ROOT / name, stage_dir / name)
    for page in toc_pages():
        md = ROOT / f"{page}.md"
        target = stage_dir / page
        target.parent.mkdir(parents=True, exist_ok=True)
        if md in executed:
            shutil.copy(executed[md], target.with_suffix(".ipynb"))
        else:
            shutil.copy(md, target.with_suffix(".md"))
    return stage_dir


def render(stage_dir: Path, out: Path) -> Path:
    """Render the staged book with Jupyter Book 1.x, warnings as errors, into `out/html`."""
    build = stage_dir / "_build"
    cmd = [str(Path(sys.executable).with_name("jupyter-book")), "build", str(stage_dir), "-W", "-n", "--keep-going"]
    subprocess.run(cmd, check=True)
    html = out / "html"
    if html.exists():
        shutil.rmtree(html)
    shutil.move(str(build / "html"), html)
    return html


def check_html(html: Path, pages: list[str]) -> list[str]:
    """Open each chapter page in headless Chromium; return the problems found (a cell that
    shows an error, a figure that is missing or did not load)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run"):
        opts.add_argument(flag)
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=opts)
    problems = []
    try:
        for page in pages:
            path = html / f"{page}.html"
            if not path.exists():
                problems.append(f"{page}: no rendered page at {path}")
                continue
            driver.get(path.as_uri())
            errors = driver.execute_script(
                "return [...document.querySelectorAll('.cell_output .traceback, .cell_output .output.error,"
                " .cell_output .stderr')].map(e => e.innerText.slice(0, 200))")
            # A progress bar on stderr is not an error; a traceback is.
            errors = [e for e in errors if "Traceback" in e or "Error" in e]
            figures = driver.execute_script(
                "return [...document.querySelectorAll('.cell_output img')]"
                ".map(i => i.complete && i.naturalWidth > 0)")
            if errors:
                problems.append(f"{page}: a cell shows an error: {errors[0]!r}")
            if not figures:
                problems.append(f"{page}: no figure in the rendered page")
            elif not all(figures):
                problems.append(f"{page}: {figures.count(False)} figure(s) did not load")
    finally:
        driver.quit()
    return problems


def build(smoke: bool = False, out: Path = ROOT / "_build") -> Path:
    executed = {}
    for md in chapters():
        start = time.time()
        print(f"executing {md.relative_to(ROOT)}{' (smoke)' if smoke else ''} ...", flush=True)
        executed[md] = execute(md, out / "executed" / md.relative_to(ROOT).with_suffix(".ipynb"),
                               {"smoke": smoke})
        print(f"  done in {time.time() - start:.0f} s", flush=True)
    html = render(stage(executed, out / "stage"), out)
    problems = check_html(html, [str(md.relative_to(ROOT).with_suffix("")) for md in executed])
    if problems:
        raise SystemExit("rendered book check failed:\n  " + "\n  ".join(problems))
    print(f"book: {html / 'index.html'}")
    return html


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.book", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sync", help="write book/*.ipynb from book/*.md")
    b = sub.add_parser("build", help="execute every chapter, render HTML, check it in a browser")
    b.add_argument("--smoke", action="store_true", help="tiny sizes (what CI runs)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "sync":
        for path in sync():
            print(f"wrote {path.relative_to(ROOT)}")
    else:
        build(smoke=args.smoke)


if __name__ == "__main__":
    main()
