"""The toy zoo: tiny models of each of the paper's architectures, trained here on the synthetic
tasks of `helpers.synthetic`, deterministically, on one CPU thread.

    python -m helpers.zoo build              # train every model, write data/zoo/ (make zoo)
    python -m helpers.zoo build toy-mamba2   # one model (the student also needs its teacher)

| name | role in the paper | class |
|---|---|---|
| toy-transformer | Llama-3.1 | transformers Llama, 4 layers, a short causal convolution before each attention but the first |
| toy-mamba2 | Llamba's SSD heads | transformers Mamba2 |
| toy-mamba1 | Falcon-Mamba | transformers Mamba (parallel `mambapy` scan for training) |
| toy-hybrid | Zamba2 | transformers Zamba2: Mamba-2 layers, the middle one with the shared attention block |
| toy-student | Llamba | `helpers.llamba`, distilled from toy-transformer the MOHAWK way |
| toy-rad-* | the follow-up's hybrids | toy-student's recipe, one teacher head kept as attention (`KEEP_BY`), each from three seeds (`-seed1`, `-seed2`) |

Each model is saved as `<name>.safetensors` beside `<name>.json`, which holds its config and its
training record (seed, steps, wall time, the loss and accuracy curves, final accuracies).

The Transformer has a short convolution before each attention (`helpers.convllama` says why).
KV training rows supervise four lookups each (one per row learned too slowly).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_model, save_model
from torch import nn

from . import evaluate, paths, synthetic
from .adapters import MambaAdapter, adapter_for
from .convllama import ConvLlamaConfig, ConvLlamaForCausalLM
from .hooks import LAYER_IN, LAYER_OUT, hooked
from .progress import bar
from .provenance import file_hash
from .registry import RAD_SEEDS, Loaded, seeded
from .ssm import discrete_hidden_attention

# --- the zoo ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    name: str
    role: str
    arch: str  # "conv_llama", "mamba2", "mamba", "zamba2", "llamba"
    config: dict
    steps: int
    heads_per_group: int = 0  # Mamba-1: channels per "head" (a group of channels)
    teacher: str | None = None  # distilled students
    distill_steps: tuple[int, int] = (0, 0)  # MOHAWK stages 1 and 2
    # Distilled hybrids (the follow-up's retrieval-aware distillation): `keep` of the teacher's
    # attention heads stay attention beside the mixers, chosen by `keep_by` (KEEP_BY; `draw`
    # numbers the random choices).
    keep: int = 0
    keep_by: str = ""
    draw: int = 0
    seed: int = 0  # what `build` trains it from: the follow-up's hybrids are trained from several


WIDTH, LAYERS, HEADS = 64, 3, 4
# The Transformer has a fourth layer in front, without a convolution: a layer's attention can
# match a two-token key only after a convolution, so the key is matched after the first layer and
# a swap can tell "the aggregating layer" from "the first one".
TEACHER_LAYERS = 4
STUDENT = dict(
    d_model=WIDTH,
    n_layer=TEACHER_LAYERS,
    mlp_cfg={"intermediate_size": 2 * WIDTH},
    ssm_cfg={"d_state": 16, "n_v_heads": HEADS, "n_qk_heads": HEADS, "chunk_size": 32},
)
RECIPES = {
    r.name: r
    for r in [
        Recipe(
            "toy-transformer",
            "Llama-3.1 (Transformer)",
            "conv_llama",
            dict(
                hidden_size=WIDTH,
                intermediate_size=2 * WIDTH,
                num_hidden_layers=TEACHER_LAYERS,
                num_attention_heads=HEADS,
                num_key_value_heads=HEADS,
                max_position_embeddings=512,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                conv_kernel=4,
                conv_layers=[1, 2, 3],
            ),
            steps=3000,
        ),
        Recipe(
            "toy-mamba2",
            "Llamba / Mamba-2 (pure SSM)",
            "mamba2",
            dict(
                hidden_size=WIDTH,
                num_hidden_layers=LAYERS,
                expand=2,
                num_heads=HEADS,
                head_dim=2 * WIDTH // HEADS,
                state_size=8,
                n_groups=1,
                conv_kernel=4,
                chunk_size=32,
                tie_word_embeddings=False,
            ),
            steps=3000,
        ),
        Recipe(
            "toy-mamba1",
            "Falcon-Mamba (Mamba-1)",
            "mamba",
            dict(
                hidden_size=WIDTH,
                num_hidden_layers=2,
                expand=2,
                state_size=16,
                conv_kernel=4,
                use_mambapy=True,
                tie_word_embeddings=False,
            ),
            steps=3000,
            heads_per_group=16,
        ),
        Recipe(
            "toy-hybrid",
            "Zamba2 (hybrid)",
            "zamba2",
            dict(
                hidden_size=WIDTH,
                num_hidden_layers=LAYERS,
                layers_block_type=["mamba", "hybrid", "mamba"],
                num_attention_heads=HEADS,
                n_mamba_heads=HEADS,
                mamba_d_state=4,
                mamba_ngroups=1,
                intermediate_size=2 * WIDTH,
                chunk_size=32,
                num_mem_blocks=1,
                use_mem_rope=True,
                tie_word_embeddings=False,
            ),
            steps=4000,
        ),
        Recipe(
            "toy-student",
            "Llamba (distilled)",
            "llamba",
            STUDENT,
            steps=0,
            teacher="toy-transformer",
            distill_steps=(400, 3000),
        ),
        # The follow-up's retrieval-aware distillation: the student with one of the teacher's 16
        # heads (6%) kept as attention, chosen by each rule (three random draws), each trained from
        # three seeds (a seed also draws the heads each rule is measured on, and the random heads).
        *(
            Recipe(
                seeded(f"toy-rad-{tag}", seed),
                f"hybrid keeping 1 head by {by}",
                "llamba",
                STUDENT,
                steps=0,
                teacher="toy-transformer",
                distill_steps=(400, 1600),
                keep=1,
                keep_by=by,
                draw=draw,
                seed=seed,
            )
            for seed in RAD_SEEDS
            for tag, by, draw in [
                ("ga", "G&A ranking", 0),
                ("retrieval", "retrieval score", 0),
                ("random0", "random", 0),
                ("random1", "random", 1),
                ("random2", "random", 2),
            ]
        ),
    ]
}

TRAIN_SIZES = {"kv": (2, 16), "mcq": (2, 8), "knowledge": (None, None)}
SCHEDULE = ["kv", "mcq"] * 3 + ["knowledge"]  # task of step i: SCHEDULE[i % 7]
KV_QUERIES = 4  # lookups supervised per training row
PROBES = {"kv": 8, "mcq": 4, "knowledge": None}  # the sizes tracked during training
FINAL = {"kv": [2, 4, 8, 16, 24, 32], "mcq": [2, 4, 6, 8], "knowledge": [None]}


def checkpoints() -> Path:
    """data/zoo: the shipped checkpoints and their training records."""
    return paths.data() / "zoo"


def digest(name: str, folder: Path | None = None) -> str:
    """SHA-256 of a checkpoint's file, as its record keeps it (`build`)."""
    path = (folder or checkpoints()) / f"{name}.safetensors"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise KeyError(f"unknown toy model {name!r}; the zoo has: {', '.join(RECIPES)}")
    return RECIPES[name]


def build_model(r: Recipe, kept_attention: dict | None = None) -> nn.Module:
    """An untrained model of the recipe (weights from the current torch seed); a hybrid's kept
    heads are described by `kept_attention` (`LlambaConfig`), which its build decides."""
    from transformers import (
        Mamba2Config,
        Mamba2ForCausalLM,
        MambaConfig,
        MambaForCausalLM,
        Zamba2Config,
        Zamba2ForCausalLM,
    )

    from .llamba import LlambaConfig, LlambaForCausalLM

    vocab = synthetic.VOCAB_SIZE
    if r.arch == "conv_llama":
        return ConvLlamaForCausalLM(
            ConvLlamaConfig(vocab_size=vocab, attn_implementation="sdpa", **r.config)
        )
    if r.arch == "mamba2":
        return Mamba2ForCausalLM(Mamba2Config(vocab_size=vocab, **r.config))
    if r.arch == "mamba":
        return MambaForCausalLM(MambaConfig(vocab_size=vocab, **r.config))
    if r.arch == "zamba2":
        return Zamba2ForCausalLM(
            Zamba2Config(vocab_size=vocab, attn_implementation="sdpa", **r.config)
        )
    if r.arch == "llamba":
        return LlambaForCausalLM(
            LlambaConfig(vocab_size=vocab, kept_attention=kept_attention, **r.config)
        )
    raise ValueError(f"unknown architecture {r.arch!r}")


def adapter_of(r: Recipe, model: nn.Module):
    return MambaAdapter(model, group=r.heads_per_group) if r.heads_per_group else adapter_for(model)


def load(name: str, folder: Path | None = None) -> Loaded:
    """A zoo model from its checkpoint, in eval mode with gradients off."""
    r = recipe(name)
    folder = folder or checkpoints()
    path = folder / f"{name}.safetensors"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing: rebuild the zoo with `python -m helpers.zoo build {name}` (make zoo)"
        )
    model = build_model(r, record(name, folder).get("kept_attention"))
    load_model(model, path)
    model.eval().requires_grad_(False)
    return Loaded(
        name, model, synthetic.tokenizer(), adapter_of(r, model), revision=file_hash(path)
    )


def record(name: str, folder: Path | None = None) -> dict:
    """The training record written beside the checkpoint."""
    folder = folder or checkpoints()
    return json.loads((folder / f"{name}.json").read_text())["record"]


# --- training --------------------------------------------------------------------------------------


@contextmanager
def one_thread():
    """Training runs on one thread: the same seed then gives the same weights on any machine
    (multi-threaded reductions may sum in another order)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def task_batch(step: int, rng: np.random.Generator, n: int) -> synthetic.Batch:
    task = SCHEDULE[step % len(SCHEDULE)]
    lo, hi = TRAIN_SIZES[task]
    return synthetic.make(
        task, n, None if lo is None else int(rng.integers(lo, hi + 1)), rng, KV_QUERIES
    )


def probes(seed: int, n: int) -> dict[str, synthetic.Batch]:
    """Fixed held-out batches (another seed stream than training's)."""
    rng = np.random.default_rng([seed, 1])
    return {task: synthetic.make(task, n, size, rng) for task, size in PROBES.items()}


def accuracy(model: nn.Module, batch: synthetic.Batch) -> float:
    """The model's accuracy on a batch, through the book's scorer (`helpers.evaluate`)."""
    return evaluate.score(model, synthetic.tokenizer(), synthetic.items(batch)).acc


def final_accuracies(model: nn.Module, seed: int, n: int) -> dict[str, float]:
    rng = np.random.default_rng([seed, 2])
    out = {}
    for task, sizes in FINAL.items():
        for size in sizes:
            out[task if size is None else f"{task}@{size}"] = accuracy(
                model, synthetic.make(task, n, size, rng)
            )
    return out


def optimiser(params, steps: int, lr: float = 3e-3, warmup: int = 100):
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    # Linear warm-up, then cosine decay to a tenth.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup)
            * (0.55 + 0.45 * math.cos(math.pi * min(1.0, s / max(1, steps))))
        ),
    )
    return opt, sched


def answer_loss(model: nn.Module, batch: synthetic.Batch) -> torch.Tensor:
    logits = model(input_ids=batch.ids).logits
    targets = torch.full(batch.ids.shape, -100) if batch.inline is None else batch.inline.clone()
    targets[torch.arange(len(batch)), batch.at] = batch.target
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train(
    model: nn.Module,
    steps: int,
    seed: int,
    batch: int = 64,
    every: int = 250,
    n_probe: int = 256,
    progress: bool = True,
) -> list[dict]:
    """Train on the task schedule; returns the curve (loss and probe accuracies every `every` steps)."""
    rng = np.random.default_rng([seed, 0])
    held = probes(seed, n_probe)
    opt, sched = optimiser(model.parameters(), steps)
    curve, losses = [], []
    model.train()
    for step in bar(range(steps), desc="train", disable=not progress):
        loss = answer_loss(model, task_batch(step, rng, batch))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % every == 0 or step + 1 == steps:
            model.eval()
            curve.append(
                {
                    "step": step + 1,
                    "loss": float(np.mean(losses[-every:])),
                    **{t: accuracy(model, b) for t, b in held.items()},
                }
            )
            model.train()
    model.eval()
    return curve


# --- MOHAWK distillation (stages 1 and 2) ----------------------------------------------------------


def copy_from_teacher(student: nn.Module, teacher: nn.Module) -> list[nn.Parameter]:
    """Give the student the teacher's embeddings, norms, MLPs and head; freeze them, and return
    the parameters left to train (the mixers)."""
    s, t = student.backbone, teacher.model
    with torch.no_grad():
        s.embedding.weight[: t.embed_tokens.weight.shape[0]] = t.embed_tokens.weight
        s.final_layernorm.weight.copy_(t.norm.weight)
        student.lm_head.weight[: teacher.lm_head.weight.shape[0]] = teacher.lm_head.weight
        for sl, tl in zip(s.layers, t.layers):
            norm = (
                tl.input_layernorm[0]
                if isinstance(tl.input_layernorm, nn.Sequential)
                else tl.input_layernorm
            )
            sl.input_layernorm.weight.copy_(norm.weight)
            sl.post_attention_layernorm.weight.copy_(tl.post_attention_layernorm.weight)
            sl.mlp.load_state_dict(tl.mlp.state_dict())
    student.requires_grad_(False)
    mixers = [p for layer in s.layers for p in layer.mixer.parameters()]
    for p in mixers:
        p.requires_grad_(True)
    return mixers


@torch.no_grad()
def teacher_states(
    teacher: nn.Module, ids: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Each layer's input and output residual streams, and its attention probabilities."""
    from .attention import attention_maps

    layers = range(len(teacher.model.layers))
    inputs, outputs = [], []
    taps = {
        (site, l): seen.append
        for l in layers
        for site, seen in ((LAYER_IN, inputs), (LAYER_OUT, outputs))
    }
    with hooked(teacher, taps):
        maps = attention_maps(teacher, ids, list(layers))
    return (
        [x.clone() for x in inputs],
        [x.clone() for x in outputs],
        [maps[i].clone() for i in layers],
    )


def distill(
    student: nn.Module,
    teacher: nn.Module,
    steps: tuple[int, int],
    seed: int,
    batch: int = 64,
    every: int = 100,
    progress: bool = True,
) -> list[dict]:
    """MOHAWK stages 1 (each layer's hidden attention matched to the teacher's attention,
    per head) and 2 (each layer's output matched to the teacher's, given the teacher's input),
    every layer at once, on the task schedule's inputs."""
    rng = np.random.default_rng([seed, 3])
    held = probes(seed, 256)
    params = copy_from_teacher(student, teacher)
    curve, step = [], 0
    for stage, n_steps in enumerate(steps, start=1):
        opt, sched = optimiser(params, n_steps, lr=1e-3 if stage == 1 else 3e-3)
        losses = []
        for i in bar(range(n_steps), desc=f"MOHAWK stage {stage}", disable=not progress):
            b = task_batch(step, rng, batch)
            valid = (torch.arange(b.ids.shape[1])[None] <= b.at[:, None]).float()  # no padding
            ins, outs, maps = teacher_states(teacher, b.ids)
            loss = 0.0
            for layer, (h, out, probs) in enumerate(zip(ins, outs, maps)):
                block = student.backbone.layers[layer]
                if stage == 1:
                    t = block.mixer.terms(block.input_layernorm(h))
                    alpha = discrete_hidden_attention(t["log_decay"], t["B"], t["C"])
                    pair = valid[:, None, :, None] * valid[:, None, None, :]
                    loss = loss + ((alpha - probs) ** 2 * pair).sum() / pair.sum() / probs.shape[1]
                else:
                    err = ((block(h) - out) ** 2).mean(-1)
                    loss = loss + (err * valid).sum() / valid.sum()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            step += 1
            if (i + 1) % every == 0 or i + 1 == n_steps:
                curve.append(
                    {
                        "step": step,
                        "stage": stage,
                        "loss": float(np.mean(losses[-every:])),
                        **{t: accuracy(student, hb) for t, hb in held.items()},
                    }
                )
    student.eval().requires_grad_(False)
    return curve


# --- hybrids that keep some teacher heads as attention (retrieval-aware distillation) -------------

KEEP_BY = ("G&A ranking", "retrieval score", "random")


@torch.no_grad()
def head_importance(
    teacher: Loaded, by: str, seed: int, draw: int = 0, n: int = 256
) -> dict[tuple[int, int], float]:
    """Each teacher head's claim to stay attention (higher first), from KV prompts (8 keys) of a
    stream no probe or final score draws from. "G&A ranking": how much zeroing the head raises
    the answer's loss (the book's KV ablation ranking); "retrieval score": the attention the
    answer's position pays to the queried value, the token the answer copies (Wu et al.'s
    retrieval heads, arXiv 2404.15574: a rule by attention, not by ablation); "random": a seeded
    shuffle."""
    from .specs import Spec

    a = teacher.adapter
    heads = [(l, h) for l in a.head_layers() for h in range(a.n_heads(l))]
    if by == "random":
        order = np.random.default_rng([seed, 5, draw]).permutation(len(heads))
        return {heads[i]: float(-rank) for rank, i in enumerate(order)}
    batch = synthetic.make("kv", n, PROBES["kv"], np.random.default_rng([seed, 4]))
    if by == "G&A ranking":

        def loss() -> float:
            return answer_loss(teacher.model, batch).item()

        clean = loss()
        out = {}
        for l, h in heads:
            with Spec(zero=[(l, h)]).applied(teacher):
                out[(l, h)] = loss() - clean
        return out
    if by == "retrieval score":
        from .attention import attention_maps

        maps = attention_maps(teacher, batch.ids, a.head_layers())  # layer -> [prompt, head, T, T]
        rows = torch.arange(len(batch))
        # The queried value's place in the dictionary: each value is written once, before the query.
        earlier = torch.arange(batch.ids.shape[1])[None] < batch.at[:, None]
        needle = ((batch.ids == batch.target[:, None]) & earlier).int().argmax(1)
        return {(l, h): maps[l][rows, h, batch.at, needle].mean().item() for l, h in heads}
    raise ValueError(f"unknown head rule {by!r}; the zoo keeps heads by {', '.join(KEEP_BY)}")


def choose_heads(teacher: Loaded, r: Recipe, seed: int) -> dict[int, list[int]]:
    """The recipe's `keep` heads with the highest claim, {layer: [head, ...]} (ties: lower index)."""
    claim = head_importance(teacher, r.keep_by, seed, r.draw)
    top = sorted(claim, key=lambda lh: (-claim[lh], lh))[: r.keep]
    kept: dict[int, list[int]] = {}
    for l, h in sorted(top):
        kept.setdefault(l, []).append(h)
    return kept


def kept_attention(teacher: nn.Module, kept: dict[int, list[int]]) -> dict:
    """`LlambaConfig.kept_attention` for these teacher heads."""
    c = teacher.config
    return {
        "heads": {str(l): len(hs) for l, hs in kept.items()},
        "from": {str(l): hs for l, hs in kept.items()},
        "head_dim": c.head_dim,
        "rope_theta": c.rope_parameters["rope_theta"],
        "conv_kernel": c.conv_kernel,
        "conv_layers": list(c.conv_layers),
    }


@torch.no_grad()
def copy_kept_heads(student: nn.Module, teacher: nn.Module, kept: dict[int, list[int]]) -> None:
    """The kept heads' slices of the teacher's projections (and its layer's convolution)."""
    d = teacher.config.head_dim
    for l, hs in kept.items():
        mine, theirs = student.backbone.layers[l].attention, teacher.model.layers[l]
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in hs])
        for proj in ("q_proj", "k_proj", "v_proj"):
            getattr(mine.attn, proj).weight.copy_(getattr(theirs.self_attn, proj).weight[rows])
        mine.attn.o_proj.weight.copy_(theirs.self_attn.o_proj.weight[:, rows])
        if isinstance(theirs.input_layernorm, nn.Sequential):
            mine.conv.load_state_dict(theirs.input_layernorm[1].state_dict())


# --- build -----------------------------------------------------------------------------------------


def build(
    name: str,
    folder: Path | None = None,
    seed: int | None = None,
    steps: int | None = None,
    n_final: int = 500,
    progress: bool = True,
) -> dict:
    """Train one zoo model from its recipe and seed (None: the recipe's); write its checkpoint
    and record."""
    r = recipe(name)
    seed = r.seed if seed is None else seed
    folder = folder or checkpoints()
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with one_thread():
        torch.manual_seed(seed)
        if r.teacher:
            with torch.random.fork_rng(devices=[]):  # a student's weights start from the seed alone
                teacher = load(r.teacher, folder)
        extra = {}
        if r.keep:
            kept = choose_heads(teacher, r, seed)
            extra = {"kept_attention": kept_attention(teacher.model, kept), "keep_by": r.keep_by}
        model = build_model(r, extra.get("kept_attention"))
        if r.teacher:
            teacher = teacher.model
            if r.keep:
                copy_kept_heads(model, teacher, kept)
            scale = 1.0 if steps is None else steps / sum(r.distill_steps)
            stages = tuple(max(1, round(s * scale)) for s in r.distill_steps)
            curve = distill(model, teacher, stages, seed, progress=progress)
            trained = {"distill_steps": list(stages), "teacher": r.teacher, **extra}
        else:
            n = r.steps if steps is None else steps
            curve = train(model, n, seed, progress=progress)
            trained = {"steps": n}
        final = final_accuracies(model, seed, n_final)
    wall = time.perf_counter() - start
    rec = {
        "seed": seed,
        **trained,
        "batch": 64,
        "threads": 1,
        "wall_s": round(wall, 1),
        "curve": curve,
        "final": final,
        "n_final": n_final,
        "torch": torch.__version__,
    }
    save_model(model, str(folder / f"{name}.safetensors"))
    write_json(folder, name, {"role": r.role, "arch": r.arch, "config": r.config}, rec)
    return rec


def write_json(folder: Path, name: str, about: dict, rec: dict) -> None:
    """`<name>.json` beside the checkpoint: what it is, its file's digest and its training record."""
    body = {"name": name, **about, "sha256": digest(name, folder), "record": rec}
    (folder / f"{name}.json").write_text(json.dumps(body, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m helpers.zoo", description="Train the toy zoo.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="train models and write their checkpoints and records")
    b.add_argument("names", nargs="*", help=f"default: all ({', '.join(RECIPES)})")
    b.add_argument("--out", type=Path, default=None, help="default: data/zoo")
    b.add_argument("--seed", type=int, default=None, help="default: the recipe's")
    b.add_argument(
        "--steps", type=int, default=None, help="override the recipes' step counts (smoke runs)"
    )
    args = p.parse_args(argv)
    for name in args.names or list(RECIPES):
        rec = build(name, args.out, args.seed, args.steps)
        print(name, f"{rec['wall_s']:.0f} s", json.dumps(rec["final"]))


if __name__ == "__main__":
    main()
