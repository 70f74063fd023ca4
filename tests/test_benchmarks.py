"""The benchmark scripts keep running: the GPU check's steps, on narrow models on CPU; the sweep
benchmark's TransformerLens peer zeroes the same head as the engine."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import helpers
from helpers import book, models
from helpers.engine import SweepEngine


def test_gpu_check_runs_its_steps_on_narrow_models(tmp_path):
    env = {**os.environ, "GA_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            str(book.ROOT / "benchmarks" / "gpu_check.py"),
            "--tiny",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "2. layer pruning (paper profile, smoke)" in done.stdout
        and "verdicts computed" in done.stdout
    )
    assert "CUDA none (CPU), driver none (CPU); kernels: mamba-ssm not installed" in done.stdout
    assert "ssm kernels PyTorch fallback" in done.stdout


def _sweep_benchmark():
    spec = importlib.util.spec_from_file_location(
        "sweep_benchmark", book.ROOT / "benchmarks" / "sweep.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_transformerlens_zeroing_hook_z_equals_the_engine(smol):
    pytest.importorskip("transformer_lens")
    sweep = _sweep_benchmark()
    items = helpers.kv_items(4, 2, seed=0, query="repeat")
    bridge, why = sweep.transformerlens_bridge(smol)
    assert bridge is not None, why
    # The bridge wraps a copy: the loaded model keeps its own modules and attention.
    assert smol.model.config._attn_implementation != "eager"
    assert type(smol.adapter.head_site(5)) is torch.nn.Linear
    engine = SweepEngine(smol, smol.tokenizer, items)
    intact, zeroed = engine.loglikelihoods(["none", "zero L5H2"])
    lens = sweep.transformerlens_naive(bridge, smol.tokenizer, items, 5, 2)
    # eager (the bridge) against SDPA attention: equal up to float32 rounding, and the head matters
    np.testing.assert_allclose(lens, zeroed, rtol=0, atol=1e-4)
    assert np.abs(zeroed - intact).max() > 1e-2
    # the wrong head is told apart: same layer, another head
    other = sweep.transformerlens_naive(bridge, smol.tokenizer, items, 5, 3)
    assert np.abs(other - zeroed).max() > 1e-3


@pytest.mark.skipif(
    models.cpu_dtype() != torch.bfloat16,
    reason="bfloat16 is emulated on this CPU: the smoke chapter took over 15 minutes in it",
)
def test_dtype_verdicts_runs_a_chapter_in_both_dtypes_into_stores_of_their_own(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(book.ROOT / "benchmarks" / "dtype_verdicts.py"),
            "--smoke",
            "--results",
            str(tmp_path),
            "attention_maps",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    header = next(
        line for line in done.stdout.splitlines() if line.startswith("attention_maps (smoke)")
    )
    claims = [
        line for line in done.stdout.splitlines() if "bfloat16: " in line and "float32: " in line
    ]
    assert len(claims) == int(header.split(": ")[1].split()[0]) > 0
    stores = sorted(p.name for p in (tmp_path / "attention_maps").glob("*.jsonl"))
    assert any("-cpu-bfloat16-" in s for s in stores) and any(
        "-cpu-float32-" in s for s in stores
    ), stores
