"""The benchmark scripts keep running: the GPU check's steps, on narrow models on CPU."""

import os
import subprocess
import sys

from helpers import book


def test_gpu_check_runs_its_steps_on_narrow_models(tmp_path):
    env = {**os.environ, "GA_DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(book.ROOT / "benchmarks" / "gpu_check.py"), "--tiny", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2. layer pruning (paper profile, smoke)" in done.stdout and "verdicts computed" in done.stdout
    assert "CUDA none (CPU), driver none (CPU); kernels: mamba-ssm not installed" in done.stdout
    assert "ssm kernels PyTorch fallback" in done.stdout
