"""The rendered book as a reader meets it, checked in headless Chromium at a laptop's width and a
phone's: every page is opened at both, screenshotted, and failed if a reader would see through it.

A page fails when its text shows a raw markdown table (a table that did not render), when any
cell output is stderr or an error, when a figure did not load or has no caption, when a chapter
has no verdict box, or when the page scrolls sideways outside code blocks and tables (which
scroll inside their own box).
"""

from __future__ import annotations

import shutil
from pathlib import Path

WIDTHS = {"laptop": 1400, "phone": 420}

# Everything a page is checked for, read in the browser: one script, one round trip per page.
PROBE = r"""
const main = document.querySelector('main') || document.body;
const text = main.innerText;
const rawTable = text.split('\n').some(l => /^\s*\|.*\|\s*$/.test(l) && /\|\s*:?-{3,}/.test(text));
const stderr = [...document.querySelectorAll('.cell_output .stderr, .cell_output .output.stderr')]
  .map(e => e.innerText.slice(0, 160));
const errors = [...document.querySelectorAll('.cell_output .traceback, .cell_output .output.error')]
  .map(e => e.innerText.slice(0, 160));
const images = [...main.querySelectorAll('.cell_output img, figure img')];
const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.split('/').pop());
const uncaptioned = images.filter(i => !i.closest('figure') || !i.closest('figure').querySelector('figcaption'))
  .map(i => i.src.split('/').pop());
const width = document.documentElement.clientWidth;
const scrolls = (el) => { for (let e = el; e; e = e.parentElement) {
  if (e.matches && e.matches('pre, .highlight, .ga-table, .MathJax, mjx-container, .cell_output .output')) return true;
  const ox = getComputedStyle(e).overflowX; if (ox === 'auto' || ox === 'scroll') return true; } return false; };
const wide = [...main.querySelectorAll('*')].filter(e => {
  const r = e.getBoundingClientRect(); return r.width > 0 && r.right > width + 1 && !scrolls(e); })
  .slice(0, 3).map(e => e.tagName.toLowerCase() + (e.className ? '.' + String(e.className).split(' ')[0] : ''));
return {rawTable, stderr, errors, images: images.length, broken, uncaptioned,
        verdict: !!document.querySelector('.ga-verdict'),
        sideways: document.documentElement.scrollWidth > width + 1, wide,
        height: document.documentElement.scrollHeight};
"""


def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"):
        opts.add_argument(flag)
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts)


def problems_of(page: str, found: dict, chapter: bool, width: str) -> list[str]:
    where = f"{page} ({width})"
    out = []
    if found["rawTable"]:
        out.append(f"{where}: a markdown table shows as raw text")
    if found["stderr"]:
        out.append(f"{where}: {len(found['stderr'])} output(s) on stderr, e.g. {found['stderr'][0]!r}")
    if found["errors"]:
        out.append(f"{where}: a cell shows an error: {found['errors'][0]!r}")
    if found["broken"]:
        out.append(f"{where}: figure(s) did not load: {', '.join(found['broken'])}")
    if found["uncaptioned"]:
        out.append(f"{where}: figure(s) without a caption: {', '.join(found['uncaptioned'])}")
    if chapter and not found["images"]:
        out.append(f"{where}: no figure")
    if chapter and not found["verdict"]:
        out.append(f"{where}: no verdict box")
    if found["sideways"]:
        out.append(f"{where}: the page scrolls sideways; widest: {', '.join(found['wide']) or 'unknown'}")
    return out


def check_html(html: Path, chapters: list[str], screenshots: Path) -> list[str]:
    """Open every page of the book at each width, save a screenshot of it, and return the
    problems found (chapters are also checked for a figure and a verdict box)."""
    screenshots.mkdir(parents=True, exist_ok=True)
    pages = sorted(str(p.relative_to(html).with_suffix("")) for p in html.rglob("*.html")
                   if not p.name.startswith(("genindex", "search")) and "_static" not in p.parts and p.name != "index.html")
    missing = [c for c in chapters if c not in pages]
    problems = [f"{c}: no rendered page" for c in missing]
    browser = driver()
    try:
        for width_name, width in WIDTHS.items():
            browser.set_window_size(width, 900)
            for page in pages:
                browser.get((html / f"{page}.html").as_uri())
                found = browser.execute_script(PROBE)
                problems += problems_of(page, found, page in chapters, width_name)
                browser.set_window_size(width, min(found["height"], 16000))
                browser.save_screenshot(str(screenshots / f"{page.replace('/', '-')}-{width_name}.png"))
                browser.set_window_size(width, 900)
    finally:
        browser.quit()
    return problems
