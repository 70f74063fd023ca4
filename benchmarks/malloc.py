"""glibc's mmap threshold for a chapter's kernel, measured side by side:

    .venv/bin/python benchmarks/malloc.py [--thresholds default 1048576 33554432] [--reps 2]

The book's builder fixes `MALLOC_MMAP_THRESHOLD_` for each chapter's kernel (`book.MMAP_THRESHOLD`):
allocations above it are mapped from the kernel and unmapped when freed, so a model's large
activations do not stay resident after a measurement, but every such allocation costs fresh,
zeroed pages (minor page faults, counted as system time). The same workload, a sweep of two
layers' heads and an attribution screen of ten layers on SmolLM2 over 40 KV prompts of 8 keys
(the KV ranking's two steps, in the registered dtype), runs in a child process under each
setting in turn, `--reps` times; printed per setting: the two steps' seconds, the child's user
and system seconds, minor page faults and peak resident memory, and the time against the first
setting's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

WORKLOAD = """
import time, helpers
from helpers import registry, screen
from helpers.engine import SweepEngine
from helpers.specs import Spec
m = helpers.load(registry.cast("cpu", "retrieval"))
items = helpers.kv_items(8, 40, seed=0, query="repeat")
start = time.perf_counter()
SweepEngine(m, m.tokenizer, items).head_sweep(layers=[14, 16], progress=False)
middle = time.perf_counter()
screen.attribution(SweepEngine(m, m.tokenizer, items), progress=False, within=Spec(keep_layers=range(20, 30)))
print(f"{middle - start:.2f} {time.perf_counter() - middle:.2f}")
"""


def run(threshold: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    if threshold != "default":
        env["MALLOC_MMAP_THRESHOLD_"] = threshold
    child = subprocess.Popen(
        [sys.executable, "-c", WORKLOAD],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(
            f"the workload failed under MALLOC_MMAP_THRESHOLD_={threshold} (status {status})"
        )
    sweep, screen = map(float, out.split())
    return {
        "sweep": sweep,
        "screen": screen,
        "user": usage.ru_utime,
        "system": usage.ru_stime,
        "faults": usage.ru_minflt,
        "peak_gb": usage.ru_maxrss / 1024**2,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--thresholds",
        nargs="+",
        default=["default", "1048576", "33554432"],
        help="bytes, or `default` (glibc's own, which grows with the first large frees)",
    )
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    results = {t: [] for t in args.thresholds}
    # alternated, so that a busy moment does not fall on one setting only
    for _ in range(args.reps):
        for t in args.thresholds:
            start = time.perf_counter()
            results[t].append(run(t))
            print(
                f"  MALLOC_MMAP_THRESHOLD_={t}: {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    mean = {t: {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for t, rs in results.items()}
    first = mean[args.thresholds[0]]
    print(f"SmolLM2, 40 KV prompts (8 keys), {args.reps} runs per setting, means:")
    for t, m in mean.items():
        work = m["sweep"] + m["screen"]
        print(
            f"  {t:>10}: sweep {m['sweep']:5.1f} s, screen {m['screen']:5.1f} s ({work / (first['sweep'] + first['screen']):.2f}x "
            f"the {args.thresholds[0]}'s time); user {m['user']:5.1f} s, system {m['system']:5.1f} s, "
            f"{m['faults'] / 1e6:5.1f} M minor faults, peak {m['peak_gb']:.2f} GB"
        )


if __name__ == "__main__":
    main()
