"""What made a number: the code, the model's weights, the machine and the package versions.

Every results store and every executed page carries these, so that numbers from different code
or different weights never mix, and a reader can see how a page was made.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
from datetime import datetime, timezone
from functools import cache
from importlib import metadata
from pathlib import Path

import torch

from . import kernels, paths
from .registry import MODELS

# The libraries that compute a page's numbers (lm-eval is not one: the tests compare our scores
# with it, the chapters do not run it). The kernels and accelerate are in `kernels.status`.
PACKAGES = ("torch", "transformers", "datasets", "huggingface_hub", "numpy")


@cache
def file_hash(path: Path) -> str:
    """The first 12 hex digits of a file's SHA-256 (a checkpoint's identity)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


@cache
def code_version() -> str:
    """A hash of everything that can change a number: the package's source and the data folder
    (fixtures, reference numbers, configs, zoo checkpoints). Two runs with the same code
    version computed their numbers with the same code."""
    digest = hashlib.sha256()
    package = Path(__file__).parent
    for root, pattern in ((package, "**/*.py"), (paths.data(), "**/*")):
        for path in sorted(p for p in root.glob(pattern) if p.is_file() and "__pycache__" not in p.parts):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@cache
def git_commit() -> dict:
    """The checkout's commit and whether its tree differs from it (empty outside a checkout)."""
    try:
        root = paths.repository()
        run = lambda *args: subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout
        return {"commit": run("rev-parse", "--short=12", "HEAD").strip(), "dirty": bool(run("status", "--porcelain").strip())}
    except (FileNotFoundError, subprocess.CalledProcessError):
        return {}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


@cache
def cuda_driver() -> str:
    """The NVIDIA driver's version, as nvidia-smi reports it ("" without one)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ""
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


def cuda(device: torch.device) -> dict[str, str]:
    """The CUDA torch was built for and the driver, on a GPU; "none" on CPU."""
    if device.type != "cuda":
        return {"cuda": "none (CPU)", "driver": "none (CPU)"}
    return {"cuda": torch.version.cuda or "unknown", "driver": cuda_driver() or "unknown"}


def now() -> str:
    """The time of the run, UTC, to the second (ISO 8601)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def quantization(names) -> dict[str, str]:
    """How each model's weights were stored, for those not loaded as their authors trained them."""
    return {n: MODELS[n].quantization for n in names if n in MODELS and MODELS[n].quantization}


def datasets() -> dict[str, str]:
    """The datasets this process has read (`helpers.tasks.DATASETS`): revision and fingerprint."""
    from .tasks import DATASETS

    return {name: f"{d['revision']}, fingerprint {d['fingerprint']}" for name, d in sorted(DATASETS.items())}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def record(loaded_models: list, parameters: dict) -> dict:
    """Everything a page's "how this page was made" block shows, for the models a run used."""
    first = next(iter(loaded_models), None)
    device = next(first.model.parameters()).device if first else torch.device("cpu")
    dtype = str(next(first.model.parameters()).dtype).removeprefix("torch.") if first else ""
    return {"date": now(), **git_commit(), "code": code_version(), "device": device_name(device),
            **cuda(device), "dtype": dtype, "models": {m.name: m.revision for m in loaded_models},
            "quantization": quantization(m.name for m in loaded_models), "datasets": datasets(),
            "versions": versions(), "kernels": kernels.status(device.type), "parameters": parameters}
