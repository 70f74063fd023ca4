"""The rendered book as a reader meets it, checked in headless Chromium at a laptop's width and a
phone's, in the light and the dark colour scheme: every page is opened at both widths,
screenshotted, and failed if a reader would see through it; the verdict box, tables and links
are also screenshotted and measured in the dark scheme (the theme follows the reader's setting).

A page fails when its text shows a raw markdown table (a table that did not render), when any
cell output is stderr or an error, when a figure did not load or has no caption, when a chapter
has no verdict box, when the page scrolls sideways outside code blocks and tables (which
scroll inside their own box), or when the book's own text (verdict box, tables, download links,
the provenance block, paragraphs) has less than `MIN_CONTRAST` against its background in either
scheme.

The browser: `GA_CHROME` (a Chrome or Chromium binary) and `GA_CHROMEDRIVER` when set, else
`chromium` and `chromedriver` on PATH (Debian's), else Selenium Manager, which finds an installed
Google Chrome (or fetches one) and its driver. `python -m helpers.book build --no-check` skips
the check.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

WIDTHS = {"laptop": 1400, "phone": 420}
SCHEMES = ("light", "dark")
# WCAG 2's AA threshold for body text: the ratio of the lighter colour's relative luminance
# (+0.05) to the darker's.
MIN_CONTRAST = 4.5

# The contrast of the book's own text against what is painted behind it (the first ancestor
# with an opaque background), for every element that holds text of its own.
CONTRAST = r"""
const min = arguments[0];
const rgb = (c) => { const m = c.match(/[\d.]+/g) || []; return m.map(Number); };
const lum = ([r, g, b]) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
const behind = (el) => { for (let e = el; e; e = e.parentElement) { const c = rgb(getComputedStyle(e).backgroundColor);
  if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c; }
  const root = rgb(getComputedStyle(document.documentElement).backgroundColor);
  return root.length >= 3 && (root.length < 4 || root[3] > 0.5) ? root : [255, 255, 255]; };
const own = (el) => [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
const main = document.querySelector('main') || document.body;
const els = [...main.querySelectorAll('.ga-verdict *, .ga-table th, .ga-table td, .ga-downloads, .ga-downloads *, ' +
                                      '.ga-provenance summary, article p, article li')].filter(e => own(e) && e.offsetParent);
const low = [];
for (const e of els) { const fg = lum(rgb(getComputedStyle(e).color)), bg = lum(behind(e));
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  if (ratio < min) low.push(`${e.tagName.toLowerCase()}${e.className ? '.' + String(e.className).split(' ')[0] : ''} ` +
                           `${ratio.toFixed(2)}:1 "${e.textContent.trim().slice(0, 40)}"`); }
return {checked: els.length, low: low.slice(0, 5), scheme: document.documentElement.dataset.theme || ''};
"""

# The figures' smallest text, in pixels of their PNG: 9 pt (`plots.MIN_FONT`) saved at 150 dpi.
# Shown at less than about 40% of its width (a 7-inch figure in a phone's column) it is under
# MIN_FIGURE_TEXT_PX high, which nobody reads.
FIGURE_TEXT_PX = 9 * 150 / 72
MIN_FIGURE_TEXT_PX = 8

# Everything a page is checked for, read in the browser: one script, one round trip per page
# (arguments: FIGURE_TEXT_PX, MIN_FIGURE_TEXT_PX).
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
const tiny = images.filter(i => i.closest('.cell_output') && i.naturalWidth > 0)
  .map(i => [i.src.split('/').pop(), i.getBoundingClientRect().width / i.naturalWidth * arguments[0]])
  .filter(([, px]) => px < arguments[1]).map(([name, px]) => `${name} (${px.toFixed(1)} px)`);
const width = document.documentElement.clientWidth;
const scrolls = (el) => { for (let e = el; e; e = e.parentElement) {
  if (e.matches && e.matches('pre, .highlight, .ga-table, .MathJax, mjx-container, .cell_output .output')) return true;
  const ox = getComputedStyle(e).overflowX; if (ox === 'auto' || ox === 'scroll') return true; } return false; };
const wide = [...main.querySelectorAll('*')].filter(e => {
  const r = e.getBoundingClientRect(); return r.width > 0 && r.right > width + 1 && !scrolls(e); })
  .slice(0, 3).map(e => e.tagName.toLowerCase() + (e.className ? '.' + String(e.className).split(' ')[0] : ''));
return {rawTable, stderr, errors, images: images.length, broken, uncaptioned, tiny,
        verdict: !!document.querySelector('.ga-verdict'),
        sideways: document.documentElement.scrollWidth > width + 1, wide,
        height: document.documentElement.scrollHeight};
"""


def browser_paths() -> tuple[str | None, str | None]:
    """The Chrome binary and chromedriver to use; None leaves the choice to Selenium Manager."""
    binary = (
        os.environ.get("GA_CHROME") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    driver_path = os.environ.get("GA_CHROMEDRIVER") or (
        shutil.which("chromedriver") if binary else None
    )
    return binary, driver_path


def driver(scheme: str = "light"):
    """Headless Chrome(ium) that reports `scheme` as the reader's preferred colour scheme."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise SystemExit(
            "the rendered-page check needs selenium (the `book` extra: pip install 'ga-companion[book]'); "
            "or skip the check with `python -m helpers.book build --no-check`"
        ) from None

    opts = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--blink-settings=preferredColorScheme={0 if scheme == 'dark' else 1}",
    ):
        opts.add_argument(flag)
    binary, driver_path = browser_paths()
    if binary:
        opts.binary_location = binary
    try:
        browser = webdriver.Chrome(
            service=Service(driver_path) if driver_path else Service(), options=opts
        )
    except WebDriverException as e:
        raise SystemExit(
            f"the rendered-page check found no usable Chrome or Chromium ({e.msg or e}): install Debian's "
            "`chromium chromium-driver` or Google Chrome, set GA_CHROME (and GA_CHROMEDRIVER) to one, or skip "
            "the check with `python -m helpers.book build --no-check` (`make book BOOK_FLAGS=--no-check`)"
        ) from None
    # What the theme reads to follow the reader's setting (before any page's scripts run).
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
    )
    return browser


def problems_of(page: str, found: dict, chapter: bool, width: str) -> list[str]:
    where = f"{page} ({width})"
    out = []
    if found["rawTable"]:
        out.append(f"{where}: a markdown table shows as raw text")
    if found["stderr"]:
        out.append(
            f"{where}: {len(found['stderr'])} output(s) on stderr, e.g. {found['stderr'][0]!r}"
        )
    if found["errors"]:
        out.append(f"{where}: a cell shows an error: {found['errors'][0]!r}")
    if found["broken"]:
        out.append(f"{where}: figure(s) did not load: {', '.join(found['broken'])}")
    if found["uncaptioned"]:
        out.append(f"{where}: figure(s) without a caption: {', '.join(found['uncaptioned'])}")
    if found.get("tiny"):
        out.append(
            f"{where}: figure text below {MIN_FIGURE_TEXT_PX} px: {', '.join(found['tiny'])}"
        )
    if chapter and not found["images"]:
        out.append(f"{where}: no figure")
    if chapter and not found["verdict"]:
        out.append(f"{where}: no verdict box")
    if found["sideways"]:
        out.append(
            f"{where}: the page scrolls sideways; widest: {', '.join(found['wide']) or 'unknown'}"
        )
    if found.get("low"):
        out.append(f"{where}: text below {MIN_CONTRAST}:1 contrast: {'; '.join(found['low'])}")
    return out


def check_html(html: Path, chapters: list[str], screenshots: Path) -> list[str]:
    """Open every page of the book at each width in the light scheme, and at the laptop's in the
    dark one, save a screenshot of each, and return the problems found (chapters are also checked
    for a figure and a verdict box; text contrast in both schemes)."""
    screenshots.mkdir(parents=True, exist_ok=True)
    pages = sorted(
        str(p.relative_to(html).with_suffix(""))
        for p in html.rglob("*.html")
        if not p.name.startswith(("genindex", "search"))
        and "_static" not in p.parts
        and p.name != "index.html"
        and "paper" not in p.relative_to(html).parts[:1]
    )
    missing = [c for c in chapters if c not in pages]
    problems = [f"{c}: no rendered page" for c in missing]
    for scheme in SCHEMES:
        browser = driver(scheme)
        # the dark scheme at the laptop's width and the phone's for the chapters' screenshot pairs
        try:
            for width_name, width in WIDTHS.items():
                browser.set_window_size(width, 900)
                for page in pages:
                    browser.get((html / f"{page}.html").as_uri())
                    found = browser.execute_script(PROBE, FIGURE_TEXT_PX, MIN_FIGURE_TEXT_PX)
                    found.update(browser.execute_script(CONTRAST, MIN_CONTRAST))
                    if scheme == "dark" and found["scheme"] != "dark":
                        problems.append(
                            f"{page} ({width_name}): the dark scheme was asked for, the theme shows "
                            f"{found['scheme'] or 'no scheme'}"
                        )
                    problems += problems_of(
                        page, found, page in chapters, f"{width_name}, {scheme}"
                    )
                    browser.set_window_size(width, min(found["height"], 16000))
                    suffix = "" if scheme == "light" else "-dark"
                    browser.save_screenshot(
                        str(screenshots / f"{page.replace('/', '-')}-{width_name}{suffix}.png")
                    )
                    browser.set_window_size(width, 900)
        finally:
            browser.quit()
    return problems
