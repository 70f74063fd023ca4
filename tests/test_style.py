"""The house style, as `make test` holds it: ruff's formatter and linter at 100 columns
(pyproject.toml's [tool.ruff]) over the package, the tests and the benchmarks. To fix a failure:
`.venv/bin/ruff format src tests benchmarks && .venv/bin/ruff check --fix src tests benchmarks`."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = [sys.executable, "-m", "ruff"]
TREES = ["src", "tests", "benchmarks"]


@pytest.mark.parametrize(
    "command", [["format", "--check", "--diff"], ["check"]], ids=["format", "lint"]
)
def test_the_code_is_as_ruff_formats_and_lints_it(command):
    done = subprocess.run(RUFF + command + TREES, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff {command[0]}:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"


def test_the_check_sees_a_badly_formatted_file(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = {  'a':1 }\n")
    done = subprocess.run(
        RUFF + ["format", "--check", str(bad)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 1 and "bad.py" in done.stdout + done.stderr
