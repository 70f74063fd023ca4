"""A mini Hugging Face hub on disk, so that the paper profile can be rehearsed on CPU.

`build(directory)` writes a Hugging Face cache (the `HF_HOME` layout) that holds, under each paper
model's own repo id, a random-weight checkpoint of the same class with the real number of layers,
heads, KV heads, SSM heads and hybrid-layer positions, only narrower; SmolLM2's tokenizer under
every tokenizer repo; `cais/mmlu` plus the six knowledge datasets as `datasets` prepares them,
written from our fixtures; and the generative tasks of §6 (GSM8K, BBH's 27 subtasks, ARC-Challenge's
train split for its chat form, SWDE) under the repo ids and configs lm-eval's own task YAMLs name,
written from the book's tasks in data/lm_eval_tasks. With `HF_HOME=directory HF_HUB_OFFLINE=1
GA_DEVICE=cpu`, the unchanged calls of the paper profile (`helpers.load`, `load_mmlu("paper")`,
`load_knowledge("paper")`, lm-eval's tasks) load all of it in seconds. Numbers computed on it are about random weights and fixture questions:
they rehearse the code path, never the paper's results.

    python -m helpers.minihub DIR [--full-shapes] [--models NAME ...]

`--full-shapes` keeps the published widths too (random bf16 weights, ~116 GB for every model: a
check for a big GPU machine, never CI).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

from . import paths
from .adapters import adapter_for
from .models import config_fields, config_from_fields, gguf_file, model_from_config
from .registry import MODELS
from .tasks import KNOWLEDGE_SOURCES

# Saved as the published checkpoints are (and loaded in float32 on CPU by `helpers.load`).
WEIGHT_DTYPE = torch.bfloat16


def paper_models() -> list[str]:
    return [name for name, s in MODELS.items() if s.profile == "paper"]


# --- narrow configs -------------------------------------------------------------------------------


def narrow_widths(fields: dict) -> dict:
    """Config fields that shrink a paper model's widths while every count the book reads (layers,
    heads, KV heads, SSM heads, hybrid positions, shared blocks) stays as published."""
    kind = fields["model_type"]
    if kind == "llama":
        # Heads of 4 channels (rotary needs an even width), side by side as wide as the residual.
        hidden = 4 * fields["num_attention_heads"]
        return {"hidden_size": hidden, "head_dim": 4, "intermediate_size": 2 * hidden}
    if kind == "llamba":
        # As wide as the narrowed Llama it was distilled from (the published width / 32, which is
        # Llama's 4 channels per head), so that the hybrid swap can put Llama's layers into it;
        # short scan chunks: the CPU scan's cost grows with their square.
        return {
            "d_model": fields["d_model"] // 32,
            "mlp_cfg": {"intermediate_size": 128},
            "ssm_cfg": {"d_state": 4, "expand": 1, "chunk_size": 16},
        }
    if kind == "falcon_mamba":
        # Its "heads" are single inner channels (the paper's L35 ch 7305, L36 ch 4925): the inner
        # width expand * hidden_size stays as published; the rest is as small as it goes.
        inner = fields["expand"] * fields["hidden_size"]
        return {"hidden_size": 16, "expand": inner // 16, "state_size": 2, "time_step_rank": 2}
    if kind == "zamba2":
        # Zamba2 derives its head widths: attention 2 * hidden / heads, Mamba (expand 1) hidden /
        # mamba heads. The smallest hidden both head counts divide keeps both counts (and gives
        # even rotary widths). Short scan chunks: the CPU scan's cost grows with their square.
        hidden = math.lcm(fields["num_attention_heads"], fields["n_mamba_heads"])
        return {
            "hidden_size": hidden,
            "intermediate_size": hidden,
            "mamba_expand": 1,
            "mamba_d_state": 8,
            "adapter_rank": 4,
            "chunk_size": 16,
        }
    raise ValueError(f"no narrow widths for model_type {kind!r}")


def merged(fields: dict, overrides: dict) -> dict:
    """`fields` with `overrides` applied, nested dicts (Llamba's mlp_cfg, ssm_cfg) merged key by key."""
    out = dict(fields)
    for key, value in overrides.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def hub_fields(name: str, tokenizer, full_shapes: bool = False) -> dict:
    """The config.json fields of the mini-hub's `name`: published, narrowed unless `full_shapes`,
    with the vocabulary and special tokens of the tokenizer it ships with."""
    fields = config_fields(name)
    if not full_shapes:
        fields = merged(fields, narrow_widths(fields) | {"vocab_size": len(tokenizer)})
    if fields["model_type"] == "llamba":
        return fields  # published Llamba configs carry no token ids
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return fields | {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos,
        "pad_token_id": pad,
    }


def shape_summary(model: torch.nn.Module) -> dict:
    """The counts a mini-hub model shares with the published one: layers, heads per layer, KV
    heads, Llamba's B/C heads, Zamba2's hybrid layers, Mamba heads and shared blocks."""
    adapter = adapter_for(model)
    config = model.config
    summary = {
        "class": type(model).__name__,
        "layers": adapter.n_layers,
        "heads": [adapter.n_heads(layer) for layer in adapter.head_layers()],
    }
    if adapter.family in ("llama", "zamba2"):
        summary["kv_heads"] = config.num_key_value_heads
    if adapter.family == "llamba":
        summary["qk_heads"] = [adapter.mixer(layer).n_qk_heads for layer in range(adapter.n_layers)]
    if adapter.family == "zamba2":
        mamba = adapter.mamba_heads()
        summary["hybrid_layers"] = adapter.hybrid_layers
        summary["mamba_heads"] = [mamba.n_heads(layer) for layer in range(mamba.n_layers)]
        summary["mamba_groups"] = config.mamba_ngroups
        # Distinct attention weights among the hybrid layers: the shared blocks they call.
        summary["shared_blocks"] = len(
            {id(adapter.attention(layer).q_proj.weight) for layer in adapter.hybrid_layers}
        )
    return summary


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build modules directly in `dtype` (an 8B model in float32 would need 32 GB first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def random_model(fields: dict, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    with default_dtype(WEIGHT_DTYPE):
        return model_from_config(config_from_fields(fields))


# --- repo writers ---------------------------------------------------------------------------------


def seed_for(repo_id: str) -> int:
    """A fixed seed per repo, so a repo's files do not depend on what else is built."""
    return zlib.crc32(repo_id.encode())


def model_writer(name: str, tokenizer, full_shapes: bool) -> Callable[[Path], None]:
    spec = MODELS[name]
    fields = hub_fields(name, tokenizer, full_shapes)

    def write(folder: Path) -> None:
        model = random_model(fields, seed_for(spec.hub_id))
        with torch.device("meta"):
            published = shape_summary(model_from_config(config_from_fields(config_fields(name))))
        if shape_summary(model) != published:
            raise AssertionError(
                f"the mini {name} lost a published count: {shape_summary(model)} != {published}"
            )
        if spec.ours:
            write_llamba(model, fields, folder)
        else:
            model.save_pretrained(folder)

    return write


def write_llamba(model: torch.nn.Module, fields: dict, folder: Path) -> None:
    """Llamba as Cartesia publishes it and `LlambaForCausalLM.from_pretrained` reads it: the
    published config.json keys and one model.safetensors. A tied model (Llamba-3B) has no
    `lm_head` module in Cartesia's code, so its checkpoint stores the embedding once."""
    from safetensors.torch import save_file

    state = model.state_dict()
    if fields["tie_embeddings"]:
        del state["lm_head.weight"]
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (folder / "config.json").write_text(json.dumps(fields, indent=2) + "\n")


def content_hash(folder: Path) -> str:
    """A commit-like 40-hex revision from a folder's file names and bytes."""
    digest = hashlib.sha1()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def write_repo(hub: Path, repo_id: str, writers: list[Callable[[Path], None]]) -> Path:
    """One model repo in the hub cache: models--org--name/snapshots/<rev>/ and refs/main = <rev>."""
    repo_dir = hub / ("models--" + repo_id.replace("/", "--"))
    shutil.rmtree(repo_dir, ignore_errors=True)
    staging = repo_dir / "staging"
    staging.mkdir(parents=True)
    for write in writers:
        write(staging)
    revision = content_hash(staging)
    snapshot = repo_dir / "snapshots" / revision
    snapshot.parent.mkdir()
    staging.rename(snapshot)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(revision)
    return snapshot


def write_tokenizer_repo_config(folder: Path) -> None:
    """transformers 5 reads a repo's config.json before its tokenizer files. A repo the book takes
    only a tokenizer from (Meta's base Llama of a Llamba) holds its model's full config on the
    hub; here it holds the model type, which is all the tokenizer loader reads."""
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, indent=2) + "\n"
    )


# Llama-3's pre-tokenizer, as Meta's tokenizer (`pat_str`, the same as tiktoken's cl100k_base)
# and its tokenizer.json (a Split, then byte-level BPE) have it: numbers in runs of up to three
# digits with no leading space, a space before a digit a token of its own.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_BOS, LLAMA3_EOS = "<|begin_of_text|>", "<|end_of_text|>"


def llama3_tokenizer(vocab_size: int = 2000):
    """A tokenizer built as Llama-3's is (its pre-tokenizer, byte-level BPE, a BOS on every
    encoding), with a small vocabulary trained here on KV-retrieval prompts, deterministically:
    how Llama-3 splits a prompt (`' is', ' ', '42'`) without Meta's vocabulary, which no package
    ships. Not written into the hub: the paper models there keep SmolLM2's tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from .tasks import kv_items

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [
        c + x
        for items in (
            kv_items(k, 50, seed=k, query=q, form=f)
            for k in (4, 8, 16)
            for q in ("paper", "repeat")
            for f in ("released", "spaced")
        )
        for it in items
        for c, x in it.pairs[:1]
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[LLAMA3_BOS, LLAMA3_EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    bos = tok.token_to_id(LLAMA3_BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{LLAMA3_BOS} $A", special_tokens=[(LLAMA3_BOS, bos)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=LLAMA3_BOS, eos_token=LLAMA3_EOS)


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    gguf = gguf_file("smollm2-135m-instruct")
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


# --- datasets -------------------------------------------------------------------------------------


def _fixture(name: str) -> list[dict]:
    return [
        json.loads(line)
        for line in (paths.data() / "fixtures" / name).read_text().splitlines()
        if line.strip()
    ]


def _gold(row: dict) -> int:
    return row["choices"]["label"].index(row["answerKey"])


def _pair(row: dict, i: int) -> tuple[list[str], int]:
    """Two options from a four-choice fixture row: the answer and the choice after it, answer
    first on even rows and second on odd ones (balanced labels)."""
    texts, gold = row["choices"]["text"], _gold(row)
    options = [texts[gold], texts[(gold + 1) % len(texts)]]
    return (options, 0) if i % 2 == 0 else (options[::-1], 1)


def mmlu_rows(split: str) -> list[dict]:
    return [
        {k: r[k] for k in ("question", "subject", "choices", "answer")}
        for r in _fixture("mmlu.jsonl")
        if r["split"] == split
    ]


def arc_rows(tasks: tuple[str, ...]) -> list[dict]:
    return [
        {k: r[k] for k in ("id", "question", "choices", "answerKey")}
        for r in _fixture("knowledge.jsonl")
        if r["task"] in tasks
    ]


def openbookqa_rows() -> list[dict]:
    return [
        {
            "id": r["id"],
            "question_stem": r["question"],
            "choices": r["choices"],
            "answerKey": r["answerKey"],
        }
        for r in _fixture("knowledge.jsonl")
    ]


def piqa_rows() -> list[dict]:
    rows = []
    for i, r in enumerate(_fixture("knowledge.jsonl")):
        (sol1, sol2), label = _pair(r, i)
        rows.append({"goal": r["question"], "sol1": sol1, "sol2": sol2, "label": label})
    return rows


def hellaswag_rows() -> list[dict]:
    return [
        {
            "ind": i,
            "activity_label": r["task"].capitalize(),
            "ctx_a": r["question"],
            "ctx_b": "",
            "ctx": r["question"],
            "endings": r["choices"]["text"],
            "source_id": r["id"],
            "split": "val",
            "split_type": "indomain",
            "label": str(_gold(r)),
        }
        for i, r in enumerate(_fixture("knowledge.jsonl"))
    ]


def winogrande_rows() -> list[dict]:
    rows = []
    for i, r in enumerate(_fixture("knowledge.jsonl")):
        (option1, option2), label = _pair(r, i)
        rows.append(
            {
                "sentence": f"{r['question']} _ is the answer.",
                "option1": option1,
                "option2": option2,
                "answer": str(label + 1),
            }
        )
    return rows


def dataset_features(kind: str):
    """Each dataset's column schema as the hub's copy declares it."""
    from datasets import ClassLabel, Features, List, Value

    text = Value("string")
    choices = {"text": List(text), "label": List(text)}
    return Features(
        {
            "mmlu": {
                "question": text,
                "subject": text,
                "choices": List(text),
                "answer": ClassLabel(names=list("ABCD")),
            },
            "arc": {"id": text, "question": text, "choices": choices, "answerKey": text},
            "openbookqa": {
                "id": text,
                "question_stem": text,
                "choices": choices,
                "answerKey": text,
            },
            "piqa": {"goal": text, "sol1": text, "sol2": text, "label": Value("int64")},
            "hellaswag": {
                "ind": Value("int32"),
                "activity_label": text,
                "ctx_a": text,
                "ctx_b": text,
                "ctx": text,
                "endings": List(text),
                "source_id": text,
                "split": text,
                "split_type": text,
                "label": text,
            },
            "winogrande": {"sentence": text, "option1": text, "option2": text, "answer": text},
            "gsm8k": {"question": text, "answer": text},
            "bbh": {"input": text, "target": text},
            "swde": {"text": text, "value": text},
        }[kind]
    )


def dataset_sources() -> list[tuple[str, str | None, str, dict[str, list[dict]]]]:
    """(repo id, config, schema, rows per split) of every dataset the paper profile loads: MMLU
    and the knowledge tasks where `helpers.tasks.KNOWLEDGE_SOURCES` names them."""
    knowledge = {
        "arc_easy": ("arc", arc_rows(("capitals", "everyday"))),
        "arc_challenge": ("arc", arc_rows(("symbols",))),
        "openbookqa": ("openbookqa", openbookqa_rows()),
        "piqa": ("piqa", piqa_rows()),
        "hellaswag": ("hellaswag", hellaswag_rows()),
        "winogrande": ("winogrande", winogrande_rows()),
    }
    sources = [("cais/mmlu", "all", "mmlu", {"test": mmlu_rows("test"), "dev": mmlu_rows("dev")})]
    for task, (path, config, split) in KNOWLEDGE_SOURCES.items():
        kind, rows = knowledge[task]
        splits = {split: rows}
        # lm-eval's arc_challenge_chat reads the train split too (its few-shot pool)
        if task == "arc_challenge":
            splits |= {"train": arc_rows(("capitals",)), "validation": arc_rows(("everyday",))}
        sources.append((path, config, kind, splits))
    return sources + generative_sources()


# The §6 chapter's tasks (Table 2) as lm-eval's own task YAMLs load them (`dataset_path`,
# `dataset_name`): rows written from the book's own generative tasks (data/lm_eval_tasks) and the
# knowledge fixture, in each dataset's columns.
GSM8K = ("openai/gsm8k", "main")
BBH = "SaylorTwift/bbh"  # one config per subtask (lm-eval's bbh_cot_fewshot_<subtask> reads <subtask>)
SWDE = ("hazyresearch/based-swde-v2", "default")  # lm-eval's swde task class names them


def _book_task(name: str, split: str) -> list[dict]:
    path = paths.data() / "lm_eval_tasks" / f"{name}-{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def gsm8k_rows(docs: list[dict]) -> list[dict]:
    """GSM8K's columns: the question, and an answer that works the steps, then ends in
    '#### <number>' (what lm-eval's strict-match filter reads)."""
    return [
        {"question": d["question"], "answer": f"{d['solution']}\n#### {d['answer']}"} for d in docs
    ]


def bbh_subtasks() -> list[str]:
    """The subtasks of lm-eval's `bbh` group (its bbh_cot_fewshot tasks), read from its own YAMLs."""
    import lm_eval.tasks
    import yaml

    folder = Path(lm_eval.tasks.__file__).parent / "bbh" / "cot_fewshot"
    return sorted(
        yaml.safe_load(p.read_text())["dataset_name"]
        for p in folder.glob("*.yaml")
        if p.stem[0] != "_"
    )


def generative_sources() -> list[tuple[str, str | None, str, dict[str, list[dict]]]]:
    """GSM8K (train: its 5-shot pool; test), BBH (every subtask's test split; its few-shot examples
    are in lm-eval's YAMLs) and SWDE (validation: a page, then the field asked for)."""
    arithmetic = _book_task("arithmetic_words", "test")
    bbh = [
        {
            "input": f"{r['question']} Options: {', '.join(r['choices']['text'])}",
            "target": r["choices"]["text"][_gold(r)],
        }
        for r in _fixture("knowledge.jsonl")
    ]
    swde = [
        {"text": f"{d['page']}\n{d['field']}:", "value": d["answer"]}
        for d in _book_task("page_field", "test")
    ]
    return (
        [
            (
                *GSM8K,
                "gsm8k",
                {"train": gsm8k_rows(arithmetic[:8]), "test": gsm8k_rows(arithmetic[8:])},
            )
        ]
        + [(BBH, subtask, "bbh", {"test": bbh}) for subtask in bbh_subtasks()]
        + [(*SWDE, "swde", {"validation": swde})]
    )


def write_dataset(
    hf_home: Path, repo_id: str, config: str | None, kind: str, splits: dict[str, list[dict]]
) -> Path:
    """One dataset as `datasets` prepares it, where it looks offline:
    datasets/<namespace>___<name>/<config>/0.0.0/<hash>/ with dataset_info.json and
    <name>-<split>.arrow, made by datasets' own Parquet builder from Parquet files of the rows.
    A dataset loaded without a config is prepared as "default", its only config in the cache."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.naming import camelcase_to_snakecase
    from datasets.packaged_modules.parquet.parquet import Parquet

    namespace, name = repo_id.split("/")
    config_name = config or "default"
    features = dataset_features(kind)
    digest = hashlib.sha1(
        json.dumps([repo_id, config_name, splits], sort_keys=True).encode()
    ).hexdigest()
    target = (
        hf_home
        / "datasets"
        / f"{namespace}___{camelcase_to_snakecase(name)}"
        / config_name
        / "0.0.0"
        / digest
    )
    shutil.rmtree(target.parent.parent, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split, rows in splits.items():
            files[split] = str(Path(tmp) / f"{split}.parquet")
            pq.write_table(pa.Table.from_pylist(rows, schema=features.arrow_schema), files[split])
        builder = Parquet(
            cache_dir=str(Path(tmp) / "cache"),
            dataset_name=name,
            config_name=config_name,
            hash=digest,
            data_files=files,
            features=features,
        )
        prepared = Path(tmp) / "prepared"
        builder.download_and_prepare(output_dir=str(prepared))
        target.mkdir(parents=True)
        for path in sorted(prepared.iterdir()):
            if path.suffix in (".json", ".arrow"):  # not the builder's lock files
                shutil.copyfile(path, target / path.name)
    return target


# --- the whole hub --------------------------------------------------------------------------------


def build(
    directory: str | Path, full_shapes: bool = False, models: list[str] | None = None
) -> Path:
    """Write the mini-hub into `directory` (an HF_HOME) and return it. `models` (default: every
    paper model) picks the model repos; their tokenizer repos and all datasets come along.
    Deterministic: the same call writes the same bytes."""
    hf_home = Path(directory).resolve()
    models = paper_models() if models is None else list(models)
    unknown = sorted(set(models) - set(paper_models()))
    if unknown:
        raise KeyError(f"not paper models: {unknown}; paper models: {', '.join(paper_models())}")
    tokenizer = smollm2_tokenizer()
    model_repos = {
        MODELS[name].hub_id: model_writer(name, tokenizer, full_shapes) for name in models
    }
    tokenizer_repos = {MODELS[name].tokenizer_id or MODELS[name].hub_id for name in models}
    for repo_id in sorted(model_repos.keys() | tokenizer_repos):
        if repo_id in model_repos:
            writers = [model_repos[repo_id]]
        elif repo_id.startswith("meta-llama/"):
            writers = [write_tokenizer_repo_config]
        else:
            raise ValueError(f"{repo_id}: a tokenizer-only repo that is not one of Meta's Llamas")
        if repo_id in tokenizer_repos:
            writers.append(tokenizer.save_pretrained)
        write_repo(hf_home / "hub", repo_id, writers)
    for source in dataset_sources():
        write_dataset(hf_home, *source)
    return hf_home


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.minihub", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "directory",
        help="the HF_HOME to write (then run with HF_HOME=DIR HF_HUB_OFFLINE=1 GA_DEVICE=cpu)",
    )
    parser.add_argument(
        "--full-shapes",
        action="store_true",
        help="published widths too (random bf16 weights, ~116 GB)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        metavar="NAME",
        help=f"paper models to write (default: all of {', '.join(paper_models())})",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models or []) - set(paper_models()))
    if unknown:
        parser.error(f"not paper models: {', '.join(unknown)}")
    start = time.perf_counter()
    hf_home = build(args.directory, full_shapes=args.full_shapes, models=args.models)
    print(
        f"mini-hub written to {hf_home} in {time.perf_counter() - start:.1f} s; use it with "
        f"HF_HOME={hf_home} HF_HUB_OFFLINE=1 GA_DEVICE=cpu"
    )


if __name__ == "__main__":
    main()
