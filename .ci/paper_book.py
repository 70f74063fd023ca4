"""Put the paper-profile book into the Pages site: the `book-html-paper` artifact of the latest
successful paper.yml run on main, unpacked into the folder given (book.yml: _build/html/paper).
Without such a run, a one-page placeholder says how to make one, so the CPU book's link to
/paper/ never breaks.

    python .ci/paper_book.py _build/html/paper     # GITHUB_TOKEN, GITHUB_REPOSITORY from Actions

PAPER_RUN (a run id: paper.yml passes its own when it starts book.yml, before that run counts as
finished) takes the book from that run instead.

Standard library only: it runs before anything is installed, in book.yml's container.
"""

from __future__ import annotations

import io
import json
import os
import sys
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

ARTIFACT = "book-html-paper"
WORKFLOW = "paper.yml"
PLACEHOLDER = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>The paper-profile book: not published yet</title>
<style>body{font-family:system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em;line-height:1.5}
@media (prefers-color-scheme: dark){body{background:#15171a;color:#e6e6e6}a{color:#8cb4ff}}</style></head>
<body><h1>The paper-profile book is not published yet</h1>
<p>This page holds the book executed on the paper's models on a GPU. No full run of the
<code>paper</code> workflow on <code>main</code> has finished yet: start one from the repository's
Actions tab (workflow <em>paper</em>, profile <code>paper</code>, on a GPU runner).</p>
<p><a href="../index.html">Back to the CPU book</a></p></body></html>
"""


def api(path: str, token: str, raw: bool = False):
    url = path if path.startswith("https://") else f"{os.environ.get('GITHUB_API_URL', 'https://api.github.com')}{path}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                                   "Accept": "application/vnd.github+json"})
    if not raw:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())
    # An artifact's archive redirects to a signed storage address, which must be fetched
    # without the GitHub token (urllib would send it on).
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=60) as response:
            return response.read()
    except urllib.error.HTTPError as e:
        if e.code not in (301, 302, 303, 307, 308):
            raise
        with urllib.request.urlopen(e.headers["Location"], timeout=300) as response:
            return response.read()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # urllib then raises the 3xx as an HTTPError, with its Location


def latest_book(repository: str, token: str, call=api, run_id: str = "") -> str | None:
    """The download URL of the newest unexpired `book-html-paper` among paper.yml's successful
    runs on main (newest first), or of run `run_id`'s when given; None without one."""
    if run_id:
        if not run_id.isdigit():
            raise SystemExit(f"PAPER_RUN is a run id (digits), not {run_id!r}")
        ids = [int(run_id)]
    else:
        runs = call(f"/repos/{repository}/actions/workflows/{WORKFLOW}/runs?branch=main&status=success&per_page=30", token)
        ids = [run["id"] for run in runs.get("workflow_runs", [])]
    for run in ({"id": i} for i in ids):
        artifacts = call(f"/repos/{repository}/actions/runs/{run['id']}/artifacts?name={ARTIFACT}", token)
        for artifact in artifacts.get("artifacts", []):
            if artifact["name"] == ARTIFACT and not artifact.get("expired"):
                return artifact["archive_download_url"]
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    target = Path(argv[0])
    target.mkdir(parents=True, exist_ok=True)
    repository, token = os.environ.get("GITHUB_REPOSITORY"), os.environ.get("GITHUB_TOKEN")
    if not (repository and token):
        raise SystemExit("set GITHUB_REPOSITORY (owner/name) and GITHUB_TOKEN (a token that may read Actions)")
    try:
        url = latest_book(repository, token, run_id=os.environ.get("PAPER_RUN", ""))
        archive = api(url, token, raw=True) if url else None
    except (OSError, ValueError, KeyError) as e:  # urllib's errors are OSErrors; a reply not as expected
        # The CPU book is published either way; the placeholder stands in for the paper book.
        print(f"::warning::could not fetch the paper-profile book ({e}): publishing the placeholder")
        url = None
    if url is None:
        (target / "index.html").write_text(PLACEHOLDER)
        print(f"no {ARTIFACT} artifact from a successful {WORKFLOW} run on main: wrote a placeholder in {target}")
        return 0
    zipfile.ZipFile(io.BytesIO(archive)).extractall(target)
    print(f"unpacked {url} into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
