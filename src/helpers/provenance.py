"""What made a number: the code, the model's weights, the machine and the package versions.

Every results store and every executed page carries these, so that numbers from different code
or different weights never mix, and a reader can see how a page was made. A store's file name
carries the version of the code its measurements read (`measurement_version`), an executed
page's key the version of the whole package (`code_version`): editing a caption re-renders a
page without recomputing a number.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import shutil
import subprocess
from datetime import datetime, timezone
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from . import kernels, paths
from .registry import MODELS

if TYPE_CHECKING:  # torch loads in seconds: not for `python -m helpers.book --help`
    import torch

# The libraries that compute a page's numbers (lm-eval is not one: the tests compare our scores
# with it, the chapters do not run it). The kernels and accelerate are in `kernels.status`.
PACKAGES = ("torch", "transformers", "datasets", "huggingface_hub", "numpy")
PACKAGE = Path(__file__).parent  # the package whose source the versions below read
TOP = __name__.partition(".")[0]  # its import name ("helpers")


@cache
def file_hash(path: Path) -> str:
    """The first 12 hex digits of a file's SHA-256 (a checkpoint's identity)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def code_version(package: Path | None = None, data: Path | None = None) -> str:
    """A hash of everything that can change a page: the package's source and the data folder
    (fixtures, reference numbers, configs, zoo checkpoints). Two runs with the same code
    version ran the same code (the book's execution key, `helpers.book.key`). `package` and
    `data` default to the installed package (`PACKAGE`) and `paths.data()`; computed once per
    process."""
    return _code_version(package or PACKAGE, data or paths.data())


@cache
def _code_version(package: Path, data: Path) -> str:
    digest = hashlib.sha256()
    for root, pattern in ((package, "**/*.py"), (data, "**/*")):
        for path in sorted(
            p for p in root.glob(pattern) if p.is_file() and "__pycache__" not in p.parts
        ):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


# --- what a measurement reads ------------------------------------------------------------------

# The package's modules that never change a number a results store holds, decided by reading
# them: nothing their functions return reaches a `compute` except through a cell's key, which is
# stored with the cell (so a change there makes new cells anyway). Figures (`plots`), pages
# (`page`), the book's build and check (`book`, `bookcheck`), progress bars (`progress`), this
# module (it names stores and describes runs); the verdict rules (`verdicts`: they decide from
# stored numbers, and where one picks what is measured next, as the minimal model's depth does,
# the pick is in the next cells' keys); the paper's numbers (`reference`: the settings a profile
# takes from them, dictionary sizes, shots, heads, reach a measurement as config fields and
# heads, which every cell's key names). A chapter's own verdict, table and figure code sits in
# its module, so editing it does recompute that chapter (no chapter imports another; editing a
# module of `protocol`, which chapters share, recomputes the chapters that import it).
PRESENTATION = frozenset(
    {"book", "bookcheck", "page", "plots", "progress", "provenance", "reference", "verdicts"}
)
# The data folders no measurement reads: the paper's numbers, read through `reference` (above).
PRESENTATION_DATA = frozenset({"reference"})


def measurement_version(
    module: str,
    package: Path | None = None,
    data: Path | None = None,
    reads: tuple[str, ...] = (),
) -> str:
    """A hash of the code and data that the measurements of `module` read: what decides the
    numbers in the results stores it opens (`protocol.stores.open_store`).

    `module` is a module of the package (`helpers.experiments.layer_pruning`) or a chapter's
    name (`layer_pruning`); `reads`, the top-level functions of `module` that fill the store (the
    measurements, or the function a measuring closure is defined in). The rule:

    - the module's own code as far as `reads` reach it (`reached`: a chapter's figure, table and
      verdict functions are not reached by its measurements, so editing them recomputes
      nothing); without `reads`, the whole module;
    - the code of every module of the package it imports, transitively, read with `ast`
      (imports inside functions included, those under `if TYPE_CHECKING:` left out since they
      never run; `from . import x` counts `x`), never from what happens to be imported in this
      process. Importing a module runs its packages' `__init__.py`: what one runs there besides
      defining and importing names counts too (a package that is a chapter keeps its figures
      in its `__init__.py`, and its measurements in modules beside it);
    - except the `PRESENTATION` modules, where the walk stops (not followed through them either):
      they never change a stored number;
    - code counts as Python reads it, less its docstrings: a comment, a docstring or a reformat
      changes no version;
    - plus every file of the data folder (fixtures, letters, configs, zoo, lm_eval_tasks, ...)
      except the `PRESENTATION_DATA` folders.

    So editing a caption in `plots`, a sentence in `page` or a chapter's `figure` leaves every
    version as it was, and editing the scorer (`evaluate`) or a measurement changes the version
    of every store whose measurements read it. `package` and `data` default to the installed
    package (`PACKAGE`) and `paths.data()`; versions are computed once per process, as
    `code_version` is."""
    package = package or PACKAGE
    name = _module_name(module, package)
    reads = tuple(sorted(set(reads)))
    if reads:
        reached(name, reads, package)  # every name defined there, or the error
    return _measurement_version(name, package, data or paths.data(), reads)


def measurement_files(module: str, package: Path | None = None) -> list[str]:
    """The package's source files that `module`'s measurements read (`measurement_version`),
    relative to the package, in order: the modules they import, and the packages around them."""
    package = package or PACKAGE
    modules = _modules(package)
    read = _reads(_module_name(module, package), package)
    return sorted(modules[m].relative_to(package).as_posix() for m in read | _packages(read))


def reached(module: str, names: tuple[str, ...], package: Path | None = None) -> list[str]:
    """The top-level definitions of `module` that the functions `names` reach, in source order:
    themselves and every top-level name their code mentions, transitively (a class whole, with
    its methods; a constant with its value). Statements that define no name of their own
    (imports, registrations) are always read, and what they mention is reached."""
    package = package or PACKAGE
    tree = _tree(_modules(package)[_module_name(module, package)])
    defined = {n: node for node in tree.body for n in _defines(node) or ()}
    unknown = sorted(set(names) - set(defined))
    if unknown:
        raise ValueError(
            f"{module} defines no top-level {', '.join(unknown)}: name the functions that fill "
            f"the store (for a closure, the function it is defined in)"
        )
    todo = [*names, *(n for node in tree.body if _defines(node) is None for n in _mentions(node))]
    seen: set[str] = set()
    while todo:
        n = todo.pop()
        if n in defined and n not in seen:
            seen.add(n)
            todo.extend(_mentions(defined[n]))
    return [n for node in tree.body for n in _defines(node) or () if n in seen]


def _defines(node: ast.stmt) -> list[str] | None:
    """The names a top-level statement defines; None for one that defines no name of its own."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    else:
        return None
    return [t.id for t in targets] if all(isinstance(t, ast.Name) for t in targets) else None


def _mentions(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@cache
def _tree(path: Path) -> ast.Module:
    """A module as Python reads it, less its docstrings."""
    tree = ast.parse(path.read_bytes(), str(path))
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)
        ):
            node.body = node.body[1:] or [ast.Pass()]
    return tree


@cache
def _measurement_version(module: str, package: Path, data: Path, reads: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    modules = _modules(package)
    around = {modules[m] for m in _packages(_reads(module, package))}
    for rel in measurement_files(module, package):
        tree = _tree(package / rel)
        if package / rel in around:  # run on import: what it does besides defining and importing
            tree = ast.Module(
                [n for n in tree.body if _defines(n) is None and not _imports_only(n)], []
            )
        elif reads and package / rel == modules[module]:
            keep = set(reached(module, reads, package))
            tree = ast.Module(
                [n for n in tree.body if _defines(n) is None or keep & set(_defines(n))], []
            )
        digest.update(rel.encode())
        digest.update(ast.dump(tree).encode())
    digest.update(_data_digest(data).encode())
    return digest.hexdigest()[:12]


@cache
def _data_digest(data: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(
        p for p in data.glob("**/*") if p.is_file() and "__pycache__" not in p.parts
    ):
        rel = path.relative_to(data)
        if rel.parts[0] not in PRESENTATION_DATA:
            digest.update(str(rel).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def _modules(package: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its `__init__.py`)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = (TOP, *path.relative_to(package).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _module_name(module: str, package: Path) -> str:
    modules = _modules(package)
    for name in (module, f"{TOP}.experiments.{module}"):
        if name in modules:
            if name.removeprefix(f"{TOP}.") in PRESENTATION:
                raise ValueError(
                    f"{name} is presentation (provenance.PRESENTATION): it computes no stored number"
                )
            return name
    chapters = sorted(
        m.rpartition(".")[2] for m in modules if m.rpartition(".")[0] == f"{TOP}.experiments"
    )
    raise ValueError(
        f"unknown module {module!r}: give a module of the package ({TOP}.experiments.layer_pruning) "
        f"or a chapter's name (one of {', '.join(chapters)})"
    )


def _imports_only(node: ast.stmt) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom))


def _type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): a block that never runs."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _running(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if _type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _packages(read: set[str]) -> set[str]:
    """The packages around the modules `read` that are not among them (their `__init__.py` runs
    when the modules are imported)."""
    around = {".".join(m.split(".")[:i]) for m in read for i in range(1, m.count(".") + 1)}
    return around - read


@cache
def _imports(module: str, package: Path) -> frozenset[str]:
    """The package's modules that `module` imports anywhere in its source where it runs."""
    modules = _modules(package)
    path = modules[module]
    # what `from .` means
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in _running(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # `from . import x`: x may be a module
            found.update(f"{base}.{a.name}" for a in node.names)
    return frozenset(m for m in found if m in modules and m != module)


def _reads(module: str, package: Path) -> set[str]:
    """`module` and the modules it imports, transitively, stopping at the presentation modules."""
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m in seen or m.removeprefix(f"{TOP}.") in PRESENTATION:
            continue
        seen.add(m)
        todo.extend(_imports(m, package))
    return seen


@cache
def git_commit() -> dict:
    """The checkout's commit and whether its tree differs from it (empty outside a checkout)."""
    try:
        root = paths.repository()
        run = lambda *args: (
            subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=True
            ).stdout
        )
        return {
            "commit": run("rev-parse", "--short=12", "HEAD").strip(),
            "dirty": bool(run("status", "--porcelain").strip()),
        }
    except (FileNotFoundError, subprocess.CalledProcessError):
        return {}


def device_name(device: torch.device) -> str:
    import torch

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
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


def cuda(device: torch.device) -> dict[str, str]:
    """The CUDA torch was built for and the driver, on a GPU; "none" on CPU."""
    import torch

    if device.type != "cuda":
        return {"cuda": "none (CPU)", "driver": "none (CPU)"}
    return {"cuda": torch.version.cuda or "unknown", "driver": cuda_driver() or "unknown"}


def now() -> str:
    """The time of the run, UTC, to the second (ISO 8601)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def quantization(loaded_models) -> dict[str, str]:
    """How each model's weights were stored, for those not loaded as their authors trained them,
    and (a GGUF's) the dtype they were dequantized to."""
    described = {}
    for m in loaded_models:
        s = MODELS.get(m.name)
        if s and s.quantization:
            dtype = str(next(m.model.parameters()).dtype).removeprefix("torch.")
            described[m.name] = (
                f"{s.quantization}, dequantized to {dtype}" if s.gguf else s.quantization
            )
    return described


def datasets() -> dict[str, str]:
    """The datasets this process has read (`helpers.tasks.DATASETS`): revision and fingerprint."""
    from .tasks import DATASETS

    return {
        name: f"{d['revision']}, fingerprint {d['fingerprint']}"
        for name, d in sorted(DATASETS.items())
    }


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
    import torch

    first = next(iter(loaded_models), None)
    device = next(first.model.parameters()).device if first else torch.device("cpu")
    dtype = str(next(first.model.parameters()).dtype).removeprefix("torch.") if first else ""
    return {
        "date": now(),
        **git_commit(),
        "code": code_version(),
        "device": device_name(device),
        **cuda(device),
        "dtype": dtype,
        "models": {m.name: m.revision for m in loaded_models},
        "quantization": quantization(loaded_models),
        "datasets": datasets(),
        "versions": versions(),
        "kernels": kernels.status(device.type),
        "parameters": parameters,
    }
