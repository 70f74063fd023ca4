"""environment.yml (the GPU conda environment) names the same packages, at the same versions, as
pyproject.toml's dependencies plus its `book` and `gpu` extras."""

import re
import tomllib

import yaml

from helpers.book import ROOT


def requirements(lines):
    out = {}
    for line in lines:
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", line.strip())
        if m and not line.startswith("-"):
            out[m.group(1).lower()] = m.group(2).replace(" ", "")
    return out


def test_environment_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    want = requirements(project["dependencies"] + extras["book"] + extras["gpu"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    got = requirements(p for p in pip if not p.startswith("-e"))
    assert got == want
    assert "-e ." in pip
