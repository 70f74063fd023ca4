"""How close the book's computations come to what this machine can multiply, in one process:

    .venv/bin/python benchmarks/roofline.py [--n 40] [--models qwen2.5-coder-1.5b-instruct smollm2-135m-instruct]

For each CPU model (Qwen2.5-Coder-1.5B on letter questions, SmolLM2-135M on KV prompts of 8 keys)
and each dtype (bfloat16, the book's; float32):

- **peak**: torch's matrix multiply on the model's own projection shapes (each weight of its first
  layer and the LM head, times 1024 tokens, a CPU batch of the book), with the threads torch
  uses; the best shape's rate is the roofline the others are read against;
- **achieved**: the FLOPs of each computation, counted by `torch.utils.flop_counter.FlopCounterMode`
  on a pass of its own (matrix multiplies and attention, forward and backward: the shapes actually
  computed, padding included), divided by the wall time of an uncounted pass, for a clean scoring
  pass (`evaluate.choice_loglikelihoods`), the engine's exact head sweep (every head of one
  middle layer, `SweepEngine.head_sweep`), the screen (`screen.attribution`, one pass for all
  layers) and greedy generation of 32 tokens (`model.generate`, which lm-eval's generate_until
  runs for Beyond MMLU's tasks).

Printed: GFLOP/s and the fraction of the same dtype's peak. What the fraction leaves out is
time outside matrix multiplies (norms, activations, softmax, Python, copies), padding counted as
work, and shapes smaller than the peak's (one generated token per step).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import helpers
from helpers import evaluate, registry, screen, tasks
from helpers.engine import SweepEngine

TOKENS = 1024  # rows of a CPU batch (`packing.default_batch_tokens`)


def best_seconds(fn, reps: int = 3) -> float:
    fn()  # warm-up: kernels chosen, memory allocated
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def peak(model, dtype: torch.dtype) -> tuple[float, str]:
    """The best GFLOP/s of a (TOKENS x in) @ (in x out) multiply over the model's weight shapes."""
    layer = model.get_decoder().layers[0]
    shapes = {tuple(m.weight.shape) for m in layer.modules() if isinstance(m, torch.nn.Linear)}
    shapes.add(tuple(model.get_output_embeddings().weight.shape))
    rates = {}
    for out_features, in_features in sorted(shapes):
        x = torch.randn(TOKENS, in_features, dtype=dtype)
        w = torch.randn(out_features, in_features, dtype=dtype)
        seconds = best_seconds(lambda: F.linear(x, w))
        rates[f"{in_features}->{out_features}"] = (
            2 * TOKENS * in_features * out_features / seconds / 1e9
        )
    shape = max(rates, key=rates.get)
    return rates[shape], shape


def counted(fn) -> float:
    """FLOPs of one call of `fn` (matrix multiplies and attention)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def workloads(loaded, items, prompts) -> dict:
    model, tok = loaded.model, loaded.tokenizer
    engine = SweepEngine(loaded, tok, items)
    middle = len(model.get_decoder().layers) // 2

    def generate():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            model.generate(ids, max_new_tokens=32, do_sample=False, pad_token_id=tok.eos_token_id)

    return {
        "clean scoring pass": lambda: evaluate.choice_loglikelihoods(model, tok, items),
        f"exact head sweep (L{middle})": lambda: engine.head_sweep(layers=[middle], progress=False),
        "screen (attribution, all layers)": lambda: screen.attribution(
            engine, alpha=1.0, progress=False
        ),
        "greedy generation, 32 tokens": generate,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=40, help="items per workload")
    p.add_argument(
        "--models",
        nargs="+",
        default=[registry.cast("cpu", "letters"), registry.cast("cpu", "retrieval")],
    )
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.models:
        if name == registry.cast("cpu", "letters"):
            items = tasks.load_letters(n=args.n, seed=0)[0]
        else:
            items = helpers.kv_items(8, args.n, seed=0)
        prompts = [it.pairs[0][0] for it in items[:2]]
        for dtype in (torch.bfloat16, torch.float32):
            loaded = helpers.load(name, dtype=dtype)
            top, shape = peak(loaded.model, dtype)
            print(
                f"\n{name}, {str(dtype).removeprefix('torch.')}: peak {top:.0f} GFLOP/s (matmul {TOKENS} x {shape})"
            )
            for label, fn in workloads(loaded, items, prompts).items():
                flops = counted(fn)
                seconds = best_seconds(fn, reps=1)
                rate = flops / seconds / 1e9
                print(
                    f"  {label:<36} {flops / 1e9:9.1f} GFLOP in {seconds:6.2f} s = {rate:6.0f} GFLOP/s, "
                    f"{rate / top:4.0%} of peak"
                )
            del loaded


if __name__ == "__main__":
    main()
