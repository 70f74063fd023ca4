"""The GPU environment installs as written: environment.yml names the same packages, at the same
versions, as pyproject.toml (its dependencies, `book` and `gpu` extras); the kernels' second step
(`make gpu`, paper.yml, the README) installs pyproject's `kernels` pins without build isolation;
and the pinned torch is one for which mamba-ssm and causal-conv1d publish prebuilt wheels, named
as their setup.py names them. Nothing here installs CUDA torch: what needs a GPU is listed in
the README ("The GPU check")."""

import ast
import importlib.metadata as md
import os
import platform
import re
import subprocess
import sys
import tomllib

import jupytext
import pytest
import yaml

from helpers import book, kernels
from helpers.book import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]


def requirements(lines):
    out = {}
    for line in lines:
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", line.strip())
        if m and not line.startswith("-"):
            out[m.group(1).lower()] = m.group(2).replace(" ", "")
    return out


def environment_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))


def test_environment_matches_pyproject():
    # The GPU torch pin (the `gpu` extra) replaces the dependencies' range.
    want = requirements(PROJECT["dependencies"] + EXTRAS["book"]) | requirements(EXTRAS["gpu"])
    pip = environment_pip()
    got = requirements(p for p in pip if not p.startswith("-e"))
    assert got == want
    assert "-e ." in pip
    assert "python=3.11" in yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]


def test_kernels_are_not_in_the_one_step_environment():
    # Their setup.py imports torch: in conda's single pip step they would be built before torch
    # is installed, and fail (or compile CUDA code) -- they come in the second step.
    assert not set(requirements(environment_pip())) & set(kernels.PACKAGES)


def test_kernel_pins_agree_everywhere():
    pins = requirements(EXTRAS["kernels"])
    assert pins == {name: f"=={v}" for name, v in kernels.PACKAGES.items()}
    words = [f"{name}=={v}" for name, v in kernels.PACKAGES.items()]
    installs = [line for line in make_gpu() if "--no-build-isolation" in line]
    assert len(installs) == 1 and all(w in installs[0].split() for w in words), installs
    # `make gpu` checks for a prebuilt wheel before pip starts, and that the kernels import after.
    assert [
        line.split("-m helpers.kernels")[-1] for line in make_gpu() if "-m helpers.kernels" in line
    ] == ["", " --installed"]
    assert make_gpu().index(installs[0]) == 2
    readme = (ROOT / "README.md").read_text()
    assert "make gpu" in readme and "huggingface-cli" not in readme
    paper = yaml.safe_load((ROOT / ".github" / "workflows" / "paper.yml").read_text())
    steps = [s.get("run", "") for job in paper["jobs"].values() for s in job.get("steps", [])]
    assert any(re.match(r"make gpu\b", s) for s in steps)
    # The kernels are optional: paper.yml goes on without them (each page says which path ran).
    step = next(
        s
        for job in paper["jobs"].values()
        for s in job.get("steps", [])
        if s.get("run", "").startswith("make gpu")
    )
    assert step.get("continue-on-error") is True


def make_gpu() -> list[str]:
    """The commands `make gpu` runs, a continued line as one."""
    # --no-print-directory: under `make test` this make is nested and would name its directory first
    make = subprocess.run(
        ["make", "--no-print-directory", "-n", "gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert make.returncode == 0, make.stderr
    return make.stdout.replace("\\\n", " ").splitlines()


STAND_IN_TORCH = {  # what the kernels' setup.py reads of torch: a CUDA 12.8 build of torch 2.10
    "__init__.py": "__version__ = '2.10.0+cu128'\nclass version:\n    cuda = '12.8'\n    hip = None\n"
    "class _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n",
    "utils/__init__.py": "",
    "utils/cpp_extension.py": "BuildExtension = CppExtension = CUDAExtension = None\nCUDA_HOME = HIP_HOME = None\n",
}


@pytest.mark.parametrize("package", sorted(kernels.PACKAGES))
def test_make_gpus_pip_step_fetches_the_prebuilt_wheel_without_nvcc(tmp_path, package):
    """The kernels' own setup.py, run by `make gpu`'s pip line (its environment variables) under a
    stand-in CUDA torch on a host without nvcc: it asks the release for the wheel `helpers.kernels`
    names and compiles nothing (the download is refused here, through a dead proxy). Without the
    variables, the same setup.py stops on nvcc's absence (mamba issues 602, 749)."""
    for name, text in STAND_IN_TORCH.items():
        (tmp_path / "torch" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "torch" / name).write_text(text)
    line = next(line for line in make_gpu() if "--no-build-isolation" in line)
    variables = dict(w.split("=", 1) for w in line.split() if re.fullmatch(r"[A-Z0-9_]+=\S+", w))
    assert variables == kernels.SKIP_BUILD
    base = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin",
    }
    spec = f"{package}=={kernels.PACKAGES[package]}"
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            spec,
            "-d",
            str(tmp_path / "sdist"),
        ],
        env={**base, **variables},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if got.returncode:
        pytest.skip(f"{spec}'s source distribution is not reachable: {got.stderr[-300:]}")
    sdist = next((tmp_path / "sdist").iterdir())
    dead = {"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"}
    build = lambda env: (
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-v",
                "--no-deps",
                "--no-build-isolation",
                str(sdist),
                "-w",
                str(tmp_path / "wheels"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        ).stdout
    )
    out = build({**base, **variables, **dead})
    machine = dict(
        torch="2.10.0+cu128",
        cuda="12.8",
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        cxx11abi=True,
        plat=f"linux_{platform.machine()}",
    )
    assert (
        f"Guessing wheel URL:  {kernels.wheel_url(package, kernels.PACKAGES[package], **machine)}"
        in out
    ), out[-2000:]
    assert (
        "bare_metal_version" not in out
        and "nvcc" not in out
        and not list(tmp_path.glob("wheels/*.whl"))
    )
    without = build({**base, **dead})
    assert "bare_metal_version" in without or "nvcc" in without.lower(), without[-2000:]


def test_the_pinned_torch_has_prebuilt_kernel_wheels():
    torch = requirements(EXTRAS["gpu"])["torch"].removeprefix("==")
    # PyPI's torch for Linux is a CUDA 12 build with the C++11 ABI; conda's Python is 3.11.
    assert kernels.has_wheel(torch, "12.8", "3.11", True)
    assert kernels.has_wheel(torch, "13.0", "3.11", True, "linux_aarch64")
    # The newest torch with wheels: a newer pin would compile.
    assert torch.startswith(kernels.TORCH[-1] + ".")


@pytest.mark.parametrize(
    "package, version, build, name",
    [
        # as setup.py's get_wheel_url writes it (mamba-ssm 2.3.2.post1, causal-conv1d 1.7.0)
        (
            "mamba-ssm",
            "2.3.2.post1",
            dict(torch="2.10.0+cu128", cuda="12.8", python="3.11.9", cxx11abi=True),
            "mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-cp311-cp311-linux_x86_64.whl",
        ),
        (
            "causal-conv1d",
            "1.7.0",
            dict(torch="2.6.0", cuda="11.8", python="3.10", cxx11abi=False),
            "causal_conv1d-1.7.0+cu11torch2.6cxx11abiFALSE-cp310-cp310-linux_x86_64.whl",
        ),
        (
            "causal-conv1d",
            "1.7.0",
            dict(torch="2.9.1", cuda="13.0", python="3.13", cxx11abi=True, plat="linux_aarch64"),
            "causal_conv1d-1.7.0+cu13torch2.9cxx11abiTRUE-cp313-cp313-linux_aarch64.whl",
        ),
    ],
)
def test_wheel_names_are_setup_pys(package, version, build, name):
    assert kernels.wheel_name(package, version, **build) == name


def test_release_matrix_follows_publish_yaml():
    # per Python: x86_64 builds 11 (torch 2.6: CUDA 11, 12 x both ABIs; 2.7: 11, 12; 2.8: 12;
    # 2.9 and 2.10: 12, 13), aarch64 6 (no 2.6, no 2.7 with CUDA 11); 4 Pythons
    assert len(kernels.RELEASE_MATRIX) == 4 * (11 + 6)
    assert not kernels.has_wheel("2.13.0", "12.8", "3.11", True)  # the local CPU pin: too new
    assert not kernels.has_wheel("2.10.0", "11.8", "3.11", True)  # CUDA 11.8 stops at torch 2.7
    assert not kernels.has_wheel("2.8.0", "13.0", "3.11", True)  # CUDA 13 starts at torch 2.9
    assert not kernels.has_wheel("2.10.0", "12.8", "3.11", False)  # 2.7+ only with the C++11 ABI
    assert kernels.has_wheel("2.6.0", "12.4", "3.12", False)
    assert not kernels.has_wheel("2.10.0", "12.8", "3.14", True)


def test_check_names_the_fix_before_pip_compiles():
    with pytest.raises(
        kernels.NoPrebuiltWheel, match=r"torch 2\.13.*Install torch==2\.10\.0.*make gpu"
    ):
        kernels.check("2.13.0", "12.8", "3.11.9", True, "linux_x86_64")
    with pytest.raises(kernels.NoPrebuiltWheel, match="CPU build"):
        kernels.check("2.13.0+cpu", None, "3.11.9", True, "linux_x86_64")
    urls = kernels.check("2.10.0", "12.8", "3.11.9", True, "linux_x86_64")
    assert urls == [
        "https://github.com/state-spaces/mamba/releases/download/v2.3.2.post1/"
        "mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-cp311-cp311-linux_x86_64.whl",
        "https://github.com/Dao-AILab/causal-conv1d/releases/download/v1.7.0/"
        "causal_conv1d-1.7.0+cu12torch2.10cxx11abiTRUE-cp311-cp311-linux_x86_64.whl",
    ]


def test_kernel_status_says_fallback_without_cuda():
    status = kernels.status("cpu")
    assert status["ssm kernels"] == "PyTorch fallback"
    assert status["accelerate"] == requirements(PROJECT["dependencies"])["accelerate"].removeprefix(
        "=="
    )
    assert status["mamba-ssm"] == "not installed"  # CPU machines cannot install it


def test_kernels_that_do_not_import_count_as_the_fallback(monkeypatch):
    import builtins

    monkeypatch.setattr(kernels.util, "find_spec", lambda name: object())  # "installed"
    real_import = builtins.__import__

    def broken(name, *a, **k):
        if name.startswith(("mamba_ssm", "causal_conv1d")):
            # a wheel for another torch
            raise ImportError("undefined symbol: _ZN3c105ErrorC2ENS_14SourceLocationESs")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", broken)
    assert not kernels.importable()
    assert kernels.status("cuda")["ssm kernels"] == "PyTorch fallback"


# Imported only on paths their extra serves, each behind a message naming the extra.
OPTIONAL = {"ray": "ray", "mamba_ssm": "kernels", "causal_conv1d": "kernels"}


def third_party_imports(files: list, chapters: bool) -> set[str]:
    """Top-level modules the files (and the chapters' cells) import, stdlib excluded."""
    sources = [p.read_text() for p in files]
    if chapters:
        sources += [
            "\n".join(c.source for c in jupytext.read(md_).cells if c.cell_type == "code")
            for md_ in book.chapters()
        ]
    names = set()
    for src in sources:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    # google.colab: Colab's own
    return names - set(sys.stdlib_module_names) - {"helpers", "google"} - set(OPTIONAL)


def installed_with(requirements_: list[str]) -> set[str]:
    """Distributions pip installs for these requirements here: them and, recursively, what they
    require on this platform and Python (extras' requirements only for the extras asked for)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo, seen = [Requirement(r) for r in requirements_], set()
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        if key in seen:
            continue
        seen.add(key)
        for line in md.requires(req.name) or []:
            dep = Requirement(line)
            if dep.marker is None or any(
                dep.marker.evaluate({"extra": e}) for e in req.extras or {""}
            ):
                todo.append(dep)
    return seen


def test_every_module_the_book_imports_is_installed_where_it_runs():
    # The paper profile runs in environment.yml's environment, and Colab in the package's own
    # dependencies: a module only the `dev` extra brings fails there, not in `make test`.
    from packaging.utils import canonicalize_name

    provided = md.packages_distributions()
    package = ROOT / "src" / "helpers"
    where = {
        "environment.yml": (
            third_party_imports(list(package.rglob("*.py")), True),
            installed_with([p for p in environment_pip() if not p.startswith("-e")]),
        ),
        # what a chapter runs on Colab (its cells, the chapter and protocol modules)
        "the package's dependencies (Colab)": (
            third_party_imports(
                list((package / "experiments").rglob("*.py"))
                + list((package / "protocol").glob("*.py")),
                True,
            ),
            installed_with(PROJECT["dependencies"]),
        ),
    }
    missing = {}
    for place, (modules, have) in where.items():
        for module in sorted(modules):
            if not {canonicalize_name(d) for d in provided.get(module, [module])} & have:
                missing.setdefault(place, []).append(module)
    assert not missing, f"imported but not installed: {missing}"
    assert set(OPTIONAL.values()) <= set(EXTRAS)
