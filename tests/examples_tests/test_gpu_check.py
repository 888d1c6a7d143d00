"""``bench/gpu_check.sh --device cpu --quick``: the GPU readiness script's CPU fallback runs
and prints its table of ratios (the GPU figures come from a lent machine, not from CI)."""

from __future__ import annotations

import os
from pathlib import Path
import re
import subprocess
import sys

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_cpu_fallback_prints_every_ratio() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu_check.sh"), "--device", "cpu", "--quick"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for check in (
        "core engine / plain PyTorch, fp32",
        "core engine / plain PyTorch, bf16",
        "core engine bf16 / fp32",
        "DeepSpeed 1-rank engine / the core's plain engine, bf16",
    ):
        line = next(line for line in out.splitlines() if line.startswith(check))
        ratio = float(re.search(r"([\d.]+)x$", line).group(1))  # type: ignore[union-attr]
        assert ratio > 0
    assert "CUDA streams" in out and "n/a" in out  # no streams on a CPU
