"""Whether a chapter's verdicts hold in float32 as in bfloat16, the dtype the CPU chapters run in
where the CPU multiplies it natively (`models.cpu_dtype`; elsewhere bfloat16 is emulated, slowly):

    .venv/bin/python benchmarks/dtype_verdicts.py [--smoke] [--results DIR] kv_retrieval head_zeroing ...

Each dtype runs the chapter (`helpers.experiments.<chapter>`, the CPU profile, the same items)
in a process of its own with `GA_DTYPE` set, into stores of its own (a store's file name carries
the dtype); then every claim's outcome is printed side by side, with how many differ. A claim
whose outcome moves with the dtype rests on near ties that bfloat16's rounding decides.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext

from helpers import book

DTYPES = ("bfloat16", "float32")


def outcomes(chapter: str, smoke: bool) -> list[dict]:
    """The chapter's verdicts, in this process's dtype."""
    module = importlib.import_module(f"helpers.experiments.{chapter}")
    result = module.run(module.Config.for_profile("cpu", smoke=smoke))
    return [
        {"claim": v.claim, "outcome": v.outcome, "evidence": v.evidence}
        for v in module.verdicts(result)
    ]


def paired(a: list[dict], b: list[dict]) -> list[tuple[dict, dict]]:
    """The two dtypes' claims side by side: a claim with the same text in both pairs with it; the
    rest pair up in order (a claim that names a head may name another head in the other dtype)."""
    none = {"claim": "(no such claim)", "outcome": "-", "evidence": ""}
    left = list(b)
    same = [next((y for y in left if y["claim"] == x["claim"]), None) for x in a]
    for y in same:
        if y is not None:
            left.remove(y)
    out, rest = [], iter(left)
    for x, y in zip(a, same):
        out.append((x, y if y is not None else next(rest, none)))
    return out + [(none, y) for y in rest]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("chapters", nargs="*")
    p.add_argument("--smoke", action="store_true", help="the chapters' smoke sizes")
    p.add_argument("--results", help="GA_RESULTS for the runs (default: the environment's)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(outcomes(args.child, args.smoke)))
        return
    if not args.chapters:
        p.error("name at least one chapter, e.g. kv_retrieval")
    # at smoke size in the smoke book's batches (`book.smoke_batches`)
    with book.smoke_batches() if args.smoke else nullcontext():
        env = {**os.environ, **({"GA_RESULTS": args.results} if args.results else {})}
    for chapter in args.chapters:
        got, seconds = {}, {}
        for dtype in DTYPES:
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, __file__, "--child", chapter] + ["--smoke"] * args.smoke,
                env={**env, "GA_DTYPE": dtype},
                capture_output=True,
                text=True,
            )
            if done.returncode:
                sys.exit(f"{chapter} in {dtype} failed:\n{done.stderr[-3000:]}")
            got[dtype] = json.loads(done.stdout.strip().splitlines()[-1])
            seconds[dtype] = time.perf_counter() - start
        pairs = paired(got["bfloat16"], got["float32"])
        differ = sum(x["outcome"] != y["outcome"] for x, y in pairs)
        print(
            f"\n{chapter}{' (smoke)' if args.smoke else ''}: {len(pairs)} claims, {differ} outcome(s) differ "
            f"(bfloat16 {seconds['bfloat16']:.0f} s, float32 {seconds['float32']:.0f} s)"
        )
        for x, y in pairs:
            mark = "  " if x["outcome"] == y["outcome"] else "! "
            other = "" if x["claim"] == y["claim"] else f"  [float32: {y['claim'][:60]}]"
            print(
                f"{mark}{x['claim'][:70]:<70} bfloat16: {x['outcome']:<15} float32: {y['outcome']}{other}"
            )
            if x["outcome"] != y["outcome"]:
                print(f"    bfloat16: {x['evidence'][:160]}\n    float32:  {y['evidence'][:160]}")


if __name__ == "__main__":
    main()
