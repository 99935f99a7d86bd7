"""bench/e2e.py --dry-run: the end-to-end benchmark's plan, from models built on meta (no GPU).

The lead runs the benchmark once on the device; this checks here that it builds each model at the
reduced depth it claims and records the census points of exactly the benchmarked batches.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TUNEDB_USER_DB="off")
    return subprocess.run([sys.executable, str(ROOT / "bench" / "e2e.py"), *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def test_dry_run_plans_whisper_at_reduced_depth_and_benchmarked_batches():
    res = _run("--dry-run", "--models", "whisper-large-v3")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "whisper-large-v3 (4 of 32 layers" in out
    assert "batch 1: inputs 1x128x3000" in out and "batch 8: inputs 8x128x3000" in out
    # fc1 (gelu fused) at M = 1500 x batch: the shapes tunedb tunes are the runtime's own signatures
    for m in (1500, 12000):
        assert f"point gemm|op=gemm_act|dt=bf16|N=5120|K=1280|act=gelu|bias=1 M={m} calls=4" in out
    assert "M=3000" not in out  # only the benchmarked batches are in the census
    assert "tune: build estimate" in out and "triton.autotune:" in out


def test_unknown_model_is_refused_with_the_allowed_names():
    res = _run("--dry-run", "--models", "whisper-tiny")
    assert res.returncode == 2
    assert "whisper-tiny" in res.stderr and "llama-3-8b" in res.stderr
