"""The GPU kernels (mamba-ssm, causal-conv1d): which prebuilt wheel their setup fetches, whether
one exists, and whether the fused kernels are what ran.

Both packages are source distributions on PyPI. Their `setup.py` imports torch (so pip needs
`--no-build-isolation`, after torch is installed) and downloads a prebuilt wheel from the
project's GitHub release named after the installed torch, CUDA, Python and C++ ABI; when no such
wheel exists it compiles the CUDA code, which needs nvcc and takes an hour. `wheel_name` is that
naming rule (mamba-ssm 2.3.2.post1 and causal-conv1d 1.7.0 `setup.py: get_wheel_url`), and
`RELEASE_MATRIX` what their release workflows (`.github/workflows/publish.yaml`) build, so a
torch pin can be checked here, on a machine without a GPU.

    python -m helpers.kernels              # the wheels setup.py would fetch for this torch; fails if none
    python -m helpers.kernels --installed  # after pip: whether the fused kernels import

`make gpu` runs pip with `SKIP_BUILD` set, so that setup.py never looks for nvcc: without it,
on a host with no CUDA toolkit (a driver-only cloud image, Colab) both setup.py files stop with
`NameError: name 'bare_metal_version' is not defined` before they fetch the wheel (mamba issues
602 and 749). With it they still fetch the prebuilt wheel, but where the release has none they
build a wheel without the kernels: hence the check before pip and `--installed` after it.
"""

from __future__ import annotations

import argparse
import platform
import sys
from importlib import metadata, util

# What `make gpu` sets for pip: fetch the prebuilt wheel, never compile (nor look for nvcc).
SKIP_BUILD = {"MAMBA_SKIP_CUDA_BUILD": "TRUE", "CAUSAL_CONV1D_SKIP_CUDA_BUILD": "TRUE"}
# The packages and the versions pyproject's `gpu` extra pins (tests/test_environment.py checks).
PACKAGES = {"mamba-ssm": "2.3.2.post1", "causal-conv1d": "1.7.0"}
# A source build, where no wheel exists: nvcc from conda-forge, and about an hour.
SOURCE_BUILD = (
    "conda install -c conda-forge cuda-nvcc, then MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE "
    "pip install --no-build-isolation " + " ".join(f"{n}=={v}" for n, v in PACKAGES.items())
)
RELEASES = {
    "mamba-ssm": "https://github.com/state-spaces/mamba/releases/download",
    "causal-conv1d": "https://github.com/Dao-AILab/causal-conv1d/releases/download",
}

# What publish.yaml builds (read at mamba-ssm's tag v2.3.2.post1; causal-conv1d's workflow has the
# same matrix): torch x CUDA toolkit x Python x C++ ABI, for Linux x86_64 and aarch64, less its
# `exclude:` entries. The wheel carries only the CUDA major version.
TORCH = ("2.6", "2.7", "2.8", "2.9", "2.10")
PYTHON = ("3.10", "3.11", "3.12", "3.13")
PLATFORMS = ("linux_x86_64", "linux_aarch64")


def _built(torch: str, cuda: int, abi: bool, plat: str) -> bool:
    """publish.yaml's `exclude:` list, rule by rule."""
    if cuda == 11 and torch in ("2.8", "2.9", "2.10"):
        return False  # CUDA 11.8 is not supported by PyTorch 2.8+
    if cuda == 13 and torch in ("2.6", "2.7", "2.8"):
        return False  # CUDA 13.0 only with PyTorch 2.9+
    if plat == "linux_aarch64" and (torch == "2.6" or (torch == "2.7" and cuda == 11)):
        return False  # no aarch64 PyTorch wheels for these
    if not abi and torch != "2.6":
        return False  # PyTorch 2.7+ pip wheels use the C++11 ABI: no FALSE builds
    return True


RELEASE_MATRIX = frozenset(
    (t, c, p, abi, plat)
    for t in TORCH
    for c in (11, 12, 13)
    for p in PYTHON
    for abi in (False, True)
    for plat in PLATFORMS
    if _built(t, c, abi, plat)
)


class NoPrebuiltWheel(RuntimeError):
    """setup.py would compile the CUDA code: the message names a torch that has wheels."""


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def wheel_name(
    package: str,
    version: str,
    torch: str,
    cuda: str,
    python: str,
    cxx11abi: bool,
    plat: str = "linux_x86_64",
) -> str:
    """The file name `setup.py` asks the release for: torch and Python as major.minor, CUDA as its
    major version only (setup.py maps 11.x to 11.8, 12.x to 12.3, 13.x to 13.0 and names the
    major), the ABI as TRUE/FALSE, e.g.
    `mamba_ssm-2.3.2.post1+cu12torch2.10cxx11abiTRUE-cp311-cp311-linux_x86_64.whl`."""
    major = int(cuda.split(".")[0])
    if major not in (11, 12, 13):
        raise ValueError(f"CUDA version {cuda} not supported (setup.py knows 11, 12 and 13)")
    py = "cp" + "".join(python.split(".")[:2])
    return (
        f"{package.replace('-', '_')}-{version}+cu{major}torch{_major_minor(torch)}"
        f"cxx11abi{str(bool(cxx11abi)).upper()}-{py}-{py}-{plat}.whl"
    )


def wheel_url(package: str, version: str, **build) -> str:
    return f"{RELEASES[package]}/v{version}/{wheel_name(package, version, **build)}"


def has_wheel(
    torch: str, cuda: str, python: str, cxx11abi: bool, plat: str = "linux_x86_64"
) -> bool:
    """Whether the release workflow builds a wheel for this combination."""
    key = (
        _major_minor(torch),
        int(cuda.split(".")[0]),
        ".".join(python.split(".")[:2]),
        bool(cxx11abi),
        plat,
    )
    return key in RELEASE_MATRIX


def check(torch: str, cuda: str | None, python: str, cxx11abi: bool, plat: str) -> list[str]:
    """The wheel URLs `pip install --no-build-isolation` would fetch for this build of torch, or
    `NoPrebuiltWheel` naming the fix, before pip starts a compile that needs nvcc."""
    if not cuda:
        raise NoPrebuiltWheel(
            f"torch {torch} is a CPU build: mamba-ssm and causal-conv1d need a CUDA build of torch. Install "
            f"the GPU environment first (conda env create -f environment.yml), or skip the kernels: the "
            "models fall back to their PyTorch paths."
        )
    if not has_wheel(torch, cuda, python, cxx11abi, plat):
        raise NoPrebuiltWheel(
            f"mamba-ssm {PACKAGES['mamba-ssm']} and causal-conv1d {PACKAGES['causal-conv1d']} publish no wheel for "
            f"torch {_major_minor(torch)}, CUDA {cuda}, Python {python}, cxx11abi {cxx11abi}, {plat}, so pip would "
            f"compile them. Install torch=={TORCH[-1]}.0 (environment.yml's pin; wheels exist for torch "
            f"{', '.join(TORCH)} with Python {', '.join(PYTHON)}), then `make gpu`; or build them from source: "
            f"{SOURCE_BUILD}. Without them the SSM models run their PyTorch paths."
        )
    build = dict(torch=torch, cuda=cuda, python=python, cxx11abi=cxx11abi, plat=plat)
    return [wheel_url(name, version, **build) for name, version in PACKAGES.items()]


def this_machine() -> dict:
    """The installed torch's build, as setup.py reads it."""
    import torch

    return dict(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=platform.python_version(),
        cxx11abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        plat=f"linux_{platform.machine()}",
    )


def importable() -> bool:
    """Whether the fused kernels import here: installed, and built for this torch (a wheel for
    another torch installs but fails at import with an undefined symbol)."""
    if any(util.find_spec(m) is None for m in ("mamba_ssm", "causal_conv1d")):
        return False
    return not import_error()


def status(device_type: str) -> dict:
    """What the provenance block shows: each kernel package's version (or "not installed"), and
    which SSM path the run had: the fused kernels need a CUDA device and both packages importing
    (without them transformers' Mamba, Falcon-Mamba and Zamba2 and `helpers.llamba` take their
    PyTorch paths)."""
    out = {}
    for name in (*PACKAGES, "accelerate"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    fused = device_type == "cuda" and importable()
    out["ssm kernels"] = "fused (mamba-ssm, causal-conv1d)" if fused else "PyTorch fallback"
    return out


def import_error() -> str:
    """Why the fused kernels do not import here ("" when they do)."""
    try:
        import causal_conv1d  # noqa: F401
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn  # noqa: F401
    except Exception as e:  # ImportError, or an OSError / RuntimeError from a mismatched CUDA build
        return f"{type(e).__name__}: {e}"
    return ""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m helpers.kernels", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--installed", action="store_true", help="after pip: check that the fused kernels import"
    )
    args = p.parse_args(argv)
    if args.installed:
        if error := import_error():
            raise SystemExit(
                f"mamba-ssm / causal-conv1d do not import their kernels ({error}); the SSM models will run their "
                f"PyTorch paths and each page says so. Where pip built them without their prebuilt wheel, `pip "
                f"uninstall -y mamba-ssm causal-conv1d`, `pip cache remove mamba_ssm; pip cache remove causal_conv1d`, "
                f"and build from source: {SOURCE_BUILD}."
            )
        print("fused SSM kernels import: the SSM models run them on a GPU")
        return
    try:
        for url in check(**this_machine()):
            print(url)
    except NoPrebuiltWheel as e:
        raise SystemExit(str(e)) from None


if __name__ == "__main__":
    main(sys.argv[1:])
