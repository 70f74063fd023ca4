"""Digests of chapters' numbers at smoke size on cheap models (toys and SmolLM2, never Qwen), in
a fresh results folder: a sha256 of each Result's fields, provenance and timing left out. Run on
two versions of the code (e.g. an exported copy of main: PYTHONPATH=<copy>/src GA_DATA=<copy>/data),
identical digests say a refactor did not change a number.

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python benchmarks/digest.py [run ...]

DIGEST_DROP=kinds,... leaves out fields a change added (to compare the numbers beside them);
DIGEST_DUMP=<folder> writes each Result's JSON there, to diff two runs field by field.
"""

import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["GA_RESULTS"] = tempfile.mkdtemp(prefix="digest-")

import numpy as np
import pandas as pd
import torch

torch.set_num_threads(1)

from helpers.experiments import (  # noqa: E402 (after the thread count and GA_RESULTS are set)
    attention_maps,
    beyond_mmlu,
    head_zeroing,
    hybrid_models,
    hybrid_swap,
    layer_pruning,
    layer_removal,
    masking,
    retrieval_aware,
    robustness,
    ssm_vs_attention,
    toy_zoo,
)

DROP = {"provenance", "wall_s", "timer", "record"} | set(
    os.environ.get("DIGEST_DROP", "").split(",")
)


def plain(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {
            f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x) if f.name not in DROP
        }
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items() if k not in DROP}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.generic,)):
        return x.item()
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, pd.DataFrame):
        return {"columns": [str(c) for c in x.columns], "rows": plain(x.to_dict("records"))}
    if isinstance(x, pd.Series):
        return plain(x.to_dict())
    if isinstance(x, float) and x != x:
        return "nan"
    if callable(x):
        return getattr(x, "__qualname__", type(x).__name__)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


RUNS = {
    "layer_pruning": lambda: layer_pruning.run(
        layer_pruning.Config.for_profile("cpu", smoke=True, model="smollm2-135m-instruct")
    ),
    "layer_removal": lambda: layer_removal.run(
        layer_removal.Config.for_profile(
            "cpu", smoke=True, model="smollm2-135m-instruct", minimal_layers=3
        )
    ),
    "head_zeroing": lambda: head_zeroing.run(
        head_zeroing.Config.for_profile("cpu", smoke=True, model="toy-transformer")
    ),
    "head_zeroing_kv": lambda: head_zeroing.run(
        head_zeroing.Config.for_profile(
            "cpu", smoke=True, model="toy-transformer", task="kv", n_screen=6, n_check=6
        )
    ),
    "head_zeroing_ssm": lambda: head_zeroing.run(
        head_zeroing.Config.for_profile("cpu", smoke=True, model="toy-mamba2")
    ),
    "attention_maps": lambda: attention_maps.run(
        attention_maps.Config.for_profile(
            "cpu", smoke=True, model="toy-transformer", kv_pairs=4, seed=1
        )
    ),
    "attention_maps_smol": lambda: attention_maps.run(
        attention_maps.Config.for_profile(
            "cpu",
            smoke=True,
            gather=["L16H0"],
            aggregate=["L18H6"],
            n_prompts=2,
            n_mmlu=2,
            kv_pairs=4,
        )
    ),
    "masking": lambda: masking.run(
        masking.Config.for_profile("cpu", smoke=True, models=["toy-transformer"], seed=2)
    ),
    "masking_smol": lambda: masking.run(
        masking.Config.for_profile(
            "cpu",
            smoke=True,
            models=["smollm2-135m-instruct"],
            task="kv",
            gather=["L16H0"],
            aggregate=["L18H6"],
            n=2,
            kv_pairs=4,
        )
    ),
    "hybrid_swap": lambda: hybrid_swap.run(hybrid_swap.Config.for_profile("cpu", smoke=True)),
    "hybrid_models": lambda: hybrid_models.run(hybrid_models.Config.for_profile("cpu", smoke=True)),
    "beyond_mmlu": lambda: beyond_mmlu.run(
        beyond_mmlu.Config.for_profile(
            "cpu",
            smoke=True,
            model="smollm2-135m-instruct",
            n=2,
            tasks=["page_field", "choice_chat"],
        )
    ),
    "robustness": lambda: robustness.run(
        robustness.Config.for_profile("cpu", smoke=True, model="toy-transformer")
    ),
    "ssm_vs_attention": lambda: ssm_vs_attention.run(
        ssm_vs_attention.Config.for_profile(
            "cpu", smoke=True, models=["toy-transformer", "toy-mamba1"]
        )
    ),
    "toy_zoo": lambda: toy_zoo.run(toy_zoo.Config.for_profile("cpu", smoke=True)),
    "retrieval_aware": lambda: retrieval_aware.run(
        retrieval_aware.Config.for_profile("cpu", smoke=True)
    ),
}

if __name__ == "__main__":
    names = sys.argv[1:] or list(RUNS)
    for name in names:
        t = time.perf_counter()
        result = RUNS[name]()
        text = json.dumps(plain(result), sort_keys=True, default=str)
        print(
            f"{name}: {hashlib.sha256(text.encode()).hexdigest()[:16]} ({time.perf_counter() - t:.0f} s)",
            flush=True,
        )
        if os.environ.get("DIGEST_DUMP"):
            with open(os.path.join(os.environ["DIGEST_DUMP"], f"{name}.json"), "w") as f:
                f.write(text)
