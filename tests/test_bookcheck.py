"""The rendered-page check's colour rules on hand-written pages, in headless Chromium: text below
the contrast threshold fails in the scheme where it is low and passes where it is not, the dark
scheme is what the browser reports when asked for, and the browser is found as documented."""

import shutil

import pytest

from helpers import bookcheck

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("google-chrome") is None,
    reason="no Chromium or Chrome here (`make browser`)",
)

# A page whose paragraph is readable in light, unreadable in dark (light grey on near-white:
# the verdict box of the issue, about 1.4:1), and a box of ours that follows the scheme.
PAGE = """<!doctype html><html><head><style>
body { background: #fff; color: #222; }
.ga-verdict { background: #f6f8fa; }
@media (prefers-color-scheme: dark) { body { background: #111; color: #ddd; } .ga-verdict span { color: #d0d0d0; } }
.good { background: var(--bg, #fff); }
</style></head><body><main><article>
<p>Plain text, readable in both.</p>
<div class="ga-verdict"><span>the verdict's subject</span></div>
</article></main></body></html>"""


def measured(tmp_path, scheme: str, page: str = PAGE) -> dict:
    path = tmp_path / "page.html"
    path.write_text(page)
    browser = bookcheck.driver(scheme)
    try:
        browser.get(path.as_uri())
        return {
            **browser.execute_script(bookcheck.CONTRAST, bookcheck.MIN_CONTRAST),
            "dark": browser.execute_script(
                "return matchMedia('(prefers-color-scheme: dark)').matches"
            ),
        }
    finally:
        browser.quit()


def test_low_contrast_fails_in_the_dark_scheme_only(tmp_path):
    light, dark = measured(tmp_path, "light"), measured(tmp_path, "dark")
    assert (light["dark"], dark["dark"]) == (False, True)
    assert light["checked"] == dark["checked"] == 2 and light["low"] == []
    (low,) = dark["low"]
    assert low.startswith("span ") and "the verdict's subject" in low
    ratio = float(low.split()[1].split(":")[0])
    assert 1.0 < ratio < 1.6  # d0d0d0 on f6f8fa
    problems = bookcheck.problems_of(
        "p",
        {
            **dark,
            "rawTable": False,
            "stderr": [],
            "errors": [],
            "broken": [],
            "uncaptioned": [],
            "images": 1,
            "verdict": True,
            "sideways": False,
            "wide": [],
        },
        True,
        "laptop, dark",
    )
    assert problems == [f"p (laptop, dark): text below 4.5:1 contrast: {low}"]


def test_the_book_css_keeps_the_verdict_readable_in_the_dark(tmp_path):
    css = (bookcheck.Path(__file__).resolve().parents[1] / "_static" / "ga.css").read_text()
    page = f"""<!doctype html><html data-theme="dark"><head><style>
    html {{ --pst-color-text-base: #ced6dd; --pst-color-text-muted: #9ca4af; --pst-color-surface: #29313d;
            --pst-color-border: #48566b; --pst-color-background: #121212; --pst-color-link: #66aaff; }}
    body {{ background: #121212; color: #ced6dd; }} {css}</style></head><body><main><article>
    <div class="ga-verdict"><p class="ga-verdict-head"><span class="ga-badge ga-reproduced">reproduced</span>
    <span>subject</span></p><ul><li><strong>claim</strong> <span class="ga-source">(Fig. 2)</span><br>
    <span class="ga-evidence">evidence</span></li></ul></div>
    <div class="ga-table"><table><tr><th>a</th></tr><tr><td>1</td></tr></table></div>
    <p class="ga-downloads">Download: <a class="ga-download" href="#">CSV</a></p></article></main></body></html>"""
    found = measured(tmp_path, "dark", page)
    assert found["checked"] >= 8 and found["low"] == [], found


def test_browser_paths_prefer_the_environment(monkeypatch):
    monkeypatch.setenv("GA_CHROME", "/opt/chrome/chrome")
    monkeypatch.setenv("GA_CHROMEDRIVER", "/opt/chrome/chromedriver")
    assert bookcheck.browser_paths() == ("/opt/chrome/chrome", "/opt/chrome/chromedriver")
    monkeypatch.delenv("GA_CHROME")
    monkeypatch.delenv("GA_CHROMEDRIVER")
    monkeypatch.setattr(bookcheck.shutil, "which", lambda name: None)
    # nothing on PATH: Selenium Manager chooses (an installed Google Chrome, or one it fetches)
    assert bookcheck.browser_paths() == (None, None)


@pytest.mark.parametrize("with_css", [False, True])
def test_a_figure_on_a_phone_keeps_its_text_readable(tmp_path, with_css):
    """A 7-inch figure (helpers.plots' width, saved at 150 dpi) in a phone's column: squeezed to
    it, its 9 pt text is about 7 px and the check says so; the book's CSS gives it 600 px, which
    scroll inside the figure's box, and the page does not scroll sideways."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7, 3))
    fig.savefig(tmp_path / "figure.png", dpi=150)
    plt.close(fig)
    css = (
        (bookcheck.Path(__file__).resolve().parents[1] / "_static" / "ga.css").read_text()
        if with_css
        else ""
    )
    (tmp_path / "page.html").write_text(
        f"""<!doctype html><html><head><meta name="viewport" content="width=device-width"><style>
        img {{ max-width: 100%; }} {css}</style></head><body><main><article><div class="cell_output">
        <figure><img src="figure.png"><figcaption>A caption.</figcaption></figure></div></article></main></body></html>"""
    )
    browser = bookcheck.driver("light")
    try:
        browser.set_window_size(bookcheck.WIDTHS["phone"], 900)
        browser.get((tmp_path / "page.html").as_uri())
        found = browser.execute_script(
            bookcheck.PROBE, bookcheck.FIGURE_TEXT_PX, bookcheck.MIN_FIGURE_TEXT_PX
        )
    finally:
        browser.quit()
    problems = bookcheck.problems_of("p", found, False, "phone, light")
    if with_css:
        assert problems == [], problems
    else:
        assert len(problems) == 1 and "figure text below 8 px: figure.png" in problems[0], problems
