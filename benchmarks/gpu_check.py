"""The GPU check: one command, a few minutes, whenever a GPU machine is at hand.

1. A mini-hub with the paper model's *full* shapes (random bf16 weights, from data/configs),
   built where it can be loaded offline (`helpers.minihub --full-shapes`).
2. One paper-profile chapter at smoke size against it, on the GPU: layer pruning, through the
   chapter's own `run()`, with the time and the peak GPU memory.
3. The sweep benchmark's GPU section (the exact engine on one layer of an 8B-shaped model).

    python benchmarks/gpu_check.py                        # Llama-3.1-8B-Instruct's shape (~16 GB of weights)
    python benchmarks/gpu_check.py --model llama-3.2-3b-instruct
    GA_DEVICE=cpu python benchmarks/gpu_check.py --tiny   # the same steps on narrow models, on CPU (a test)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def peak() -> str:
    return (
        f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        if torch.cuda.is_available()
        else "no GPU"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="llama-3.1-8b-instruct", help="the paper model the chapter runs"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="where the mini-hub is written (default: a temp dir)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="narrow widths (the rehearsal's), to test this script"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))

    # 1. The mini-hub; the environment is set before huggingface_hub is imported (it reads it then).
    os.environ.update(HF_HOME=str(out / "hub"), HF_HUB_OFFLINE="1", GA_RESULTS=str(out / "results"))
    from helpers import minihub

    t = time.perf_counter()
    minihub.build(out / "hub", full_shapes=not args.tiny, models=[args.model])
    print(
        f"1. mini-hub of {args.model} ({'narrow' if args.tiny else 'full shapes'}) in {out / 'hub'}: "
        f"{time.perf_counter() - t:.0f} s",
        flush=True,
    )

    # 2. The chapter.
    from helpers.experiments import layer_pruning as chapter

    profile = "paper-3b" if "3b" in args.model or "2.7b" in args.model else "paper"
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    result = chapter.run(chapter.Config.for_profile(profile, smoke=True, model=args.model))
    print(
        f"2. layer pruning ({profile} profile, smoke) on {result.provenance['device']}: "
        f"{time.perf_counter() - t:.0f} s, peak GPU memory {peak()}; verdicts computed: "
        f"{[v.outcome for v in chapter.verdicts(result)]}",
        flush=True,
    )
    # what the page's provenance block will say: CUDA, the driver, and which SSM path ran
    made = result.provenance
    print(
        f"   CUDA {made.get('cuda')}, driver {made.get('driver')}; kernels: "
        + ", ".join(f"{k} {v}" for k, v in made.get("kernels", {}).items()),
        flush=True,
    )

    # 3. The sweep benchmark's GPU section.
    if torch.cuda.is_available():
        script = Path(__file__).with_name("sweep.py")
        subprocess.run([sys.executable, str(script), "--gpu-only"], check=True)
    else:
        print("3. sweep benchmark GPU section: skipped (no GPU)")


if __name__ == "__main__":
    main()
