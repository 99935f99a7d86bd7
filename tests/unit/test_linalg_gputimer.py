"""The ladder's GPU timer, run on the CPU with torch.cuda's graph, stream and event calls
replaced by stand-ins (graphs run their body once at capture, replay does nothing; events time
nothing): what this checks is the timer's logic, not its timing -- the ring, the gate's
residual bound and its statuses, and a whole `tune` through it to a written table."""
from __future__ import annotations

import argparse
import contextlib
import json
import types

import pytest
import torch

from tunedb.families import get
from tunedb.families.linalg import cli, configs, gputimer, ladder, problems
from tunedb.records import Status


class _Event:
    def __init__(self, enable_timing: bool = False) -> None:
        pass

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: "_Event") -> float:
        return 0.01


class _Stream:
    def wait_stream(self, other: object) -> None:
        pass


class _Graph:
    replays: list[str] = []

    def replay(self) -> None:
        self.replays.append("replay")


@pytest.fixture
def cpu_cuda(monkeypatch):
    """torch.cuda's calls the timer makes, on the CPU; inputs made on the CPU."""
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "get_device_properties", lambda i: types.SimpleNamespace(L2_cache_size=1 << 16))
    monkeypatch.setattr(cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(cuda, "synchronize", lambda: None)
    monkeypatch.setattr(cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(cuda, "Stream", _Stream)
    monkeypatch.setattr(cuda, "current_stream", lambda: _Stream())
    monkeypatch.setattr(cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(cuda, "graph", lambda g, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "Event", _Event)
    trace: list[str] = []
    monkeypatch.setattr(cuda, "_sleep", lambda cycles: trace.append("spin"))
    monkeypatch.setattr(_Graph, "replays", trace)
    make = problems.make_inputs
    monkeypatch.setattr(problems, "make_inputs", lambda sig, batch, device, seed: make(sig, batch, "cpu", seed))
    return trace


def test_the_gate_passes_torch_and_fails_a_wrong_arm(cpu_cuda, monkeypatch):
    timer = gputimer.GraphTimer(get("linalg"))
    cell = ladder.Cell("posv", "fp64", 8, 64)
    assert timer.gate(cell, "torch") == (Status.OK, 1.0)
    assert timer.gate(cell, configs.EAGER_ONLY)[0] is Status.OK
    family = get("linalg")
    real = family.launch

    def wrong(config, sig, *args, out=None, **kw):
        if config.id == "warp_p8_w4":
            x, info = problems.torch_arm(sig.op, *args)
            return x * 1.01, info
        return real(config, sig, *args, out=out, **kw)
    monkeypatch.setattr(family, "launch", wrong)
    status, ratio = timer.gate(cell, "warp_p8_w4")
    assert status is Status.INCORRECT and ratio > 4.0


def test_a_solver_cell_is_timed_on_restored_inputs(cpu_cuda, monkeypatch):
    timer = gputimer.GraphTimer(get("linalg"))
    cell = ladder.Cell("potrf", "fp32", 4, 32)
    restores = []
    st = timer._open(cell)
    monkeypatch.setattr(st["inputs"], "restore", lambda: restores.append(1))
    got = timer.sample(cell, ["torch", configs.EAGER_ONLY])
    assert set(got) == {"torch", configs.EAGER_ONLY} and all(isinstance(v, float) and v > 0 for v in got.values())
    reps = sum(st["reps"].values()) + len(st["reps"])  # the probe replay and the timed ones
    assert len(restores) == reps  # one restore before every replay


def test_every_timed_window_opens_behind_a_spin_kernel(cpu_cuda, monkeypatch):
    """The host's graph launch stays out of the timed window: a spin kernel goes first. An op
    with nothing to restore times a sample's replays back to back after one spin; a solver op
    spins before each replay (each follows its own restore)."""
    timer = gputimer.GraphTimer(get("linalg"))
    cell = ladder.Cell("gemv", "fp32", 4, 256)
    timer.sample(cell, ["torch"])
    reps = timer._open(cell)["reps"]["torch"]
    assert reps > 1  # the stand-in events time 10 us a replay: the sample needs several
    assert cpu_cuda == ["spin", "replay", "spin"] + ["replay"] * reps  # the probe, then one window
    cpu_cuda.clear()
    # a replay shorter than the host's launch of the next: one window (and one spin) each
    monkeypatch.setattr(_Event, "elapsed_time", lambda self, other: 0.004)
    cell = ladder.Cell("gemv", "fp32", 4, 512)
    timer.sample(cell, ["torch"])
    reps = timer._open(cell)["reps"]["torch"]
    assert cpu_cuda == ["spin", "replay"] * (reps + 1)
    cpu_cuda.clear()
    cell = ladder.Cell("potrf", "fp32", 4, 32)
    timer.sample(cell, ["torch"])
    reps = timer._open(cell)["reps"]["torch"]
    assert cpu_cuda == ["spin", "replay"] * (reps + 1)


def test_a_tune_through_the_graph_timer_writes_a_table(cpu_cuda, tmp_path, monkeypatch):
    monkeypatch.setattr(ladder, "QUICK_N", (4,))
    args = argparse.Namespace(prebuild=False, quick=True, legs="solver", ops="posv", dtypes="fp32", margin=None,
                              rounds=9, max_arms=1, build_jobs=None, dry_run=False, out=str(tmp_path / "t.json"),
                              seed=0, allow_busy=False, base=None)
    monkeypatch.setattr(cli, "_compile", lambda *a, **k: [])  # no Triton compile on the CPU
    assert cli.tune(args) == 0
    raw = json.loads((tmp_path / "t.json").read_text())
    point = raw["entries"]["linalg|op=posv|dt=fp32|n=4"]["evidence"]["M=4096"]
    assert point["torch"][2] == 9 and point["_inputs"] == "ring"
    triton = [a for a in point if a not in ("torch", configs.EAGER_ONLY) and not a.startswith("_")]
    assert triton and all(isinstance(point[a], str) for a in triton)  # no Triton on the CPU: a status
    assert raw["entries"]["linalg|op=posv|dt=fp32|n=4"]["regions"] == [[None, "torch"]]


def _torch_backed_triton(monkeypatch, failing: str | None = None):
    """launch's Triton step replaced by torch writing into the given out (launch's own out=
    contract, which refused the gate's poison, still runs); `failing` raises instead."""
    from tunedb.families.linalg import launch

    def fake(op, cfg, tensors, out, n, batch, inplace):
        if cfg.id == failing:
            raise RuntimeError("out of resources: shared memory, Required: 262144, Hardware limit: 232448")
        res = problems.torch_arm(op, *tensors)
        got = res[0] if isinstance(res, tuple) else res
        out.copy_(got)
        return (out, res[1].to(torch.int32)) if isinstance(res, tuple) else out
    monkeypatch.setattr(launch, "_triton", fake)


@pytest.mark.parametrize("op", ["potrf", "posv", "trsv"])
def test_the_gate_passes_a_correct_triton_arm_of_every_solver_op(cpu_cuda, monkeypatch, op):
    # The H200 tune recorded every potrf Triton arm as launch_error: the gate's NaN poison was made
    # `like` cholesky_ex's column-major L, and launch's out= takes only contiguous tensors.
    _torch_backed_triton(monkeypatch)
    timer = gputimer.GraphTimer(get("linalg"))
    cell = ladder.Cell(op, "fp32", 8, 16)
    triton = [a for a in ladder.arms(cell, None, 4) if a not in ("torch", configs.EAGER_ONLY)]
    assert triton
    for arm in triton:
        status, ratio = timer.gate(cell, arm)
        assert status is Status.OK, (arm, status, timer.failure(cell, arm))
        assert ratio is not None and ratio <= 4.0


def test_a_failed_arm_says_why_in_the_log_and_the_table(cpu_cuda, tmp_path, monkeypatch, capsys):
    _torch_backed_triton(monkeypatch, failing="block_w1")
    monkeypatch.setattr(ladder, "QUICK_N", (4,))
    monkeypatch.setattr(ladder, "QUICK_BATCH", (16,))
    args = argparse.Namespace(prebuild=False, quick=True, legs="solver", ops="potrf", dtypes="fp32", margin=None,
                              rounds=9, max_arms=4, build_jobs=None, dry_run=False, out=str(tmp_path / "t.json"),
                              seed=0, allow_busy=False, base=None)
    monkeypatch.setattr(cli, "_compile", lambda *a, **k: [])
    assert cli.tune(args) == 0
    entry = json.loads((tmp_path / "t.json").read_text())["entries"]["linalg|op=potrf|dt=fp32|n=4"]
    point = entry["evidence"]["M=16"]
    assert point["block_w1"] == "launch_error"
    assert "RuntimeError: out of resources: shared memory" in point["_error:block_w1"]
    assert any(n.startswith("M=16 block_w1 launch_error: RuntimeError: out of resources") for n in entry["notes"])
    others = [a for a in point if a not in ("torch", configs.EAGER_ONLY, "block_w1") and not a.startswith("_")]
    assert others and all(isinstance(point[a], list) and point[a][2] == 9 for a in others)
    assert not any(k.startswith("_error:") for k in point if k != "_error:block_w1")
    log = capsys.readouterr().err
    assert "failed: block_w1 launch_error (RuntimeError: out of resources: shared memory" in log


def test_a_potrf_cell_through_the_tune_with_interpreter_kernels(tmp_path):
    """One potrf cell through cli.tune and the graph timer's real launch path, the Triton
    kernels under the interpreter (a child process: TRITON_INTERPRET must precede triton's
    import): every Triton arm passes the gate and is timed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "t.json"
    script = f"""
import argparse, contextlib, sys, types
sys.path.insert(0, {str(Path(__file__).parent)!r})
import pytest, torch
import test_linalg_gputimer as t
from tunedb.families.linalg import cli, ladder
mp = pytest.MonkeyPatch()
t.cpu_cuda.__wrapped__(mp)
mp.setattr(ladder, "QUICK_N", (4,))
mp.setattr(ladder, "QUICK_BATCH", (8,))
mp.setattr(cli, "_compile", lambda *a, **k: [])
args = argparse.Namespace(prebuild=False, quick=True, legs="solver", ops="potrf", dtypes="fp32", margin=None,
                          rounds=9, max_arms=4, build_jobs=None, dry_run=False, out={str(out)!r},
                          seed=0, allow_busy=False, base=None)
sys.exit(cli.tune(args))
"""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    point = json.loads(out.read_text())["entries"]["linalg|op=potrf|dt=fp32|n=4"]["evidence"]["M=8"]
    triton = [a for a in point if a not in ("torch", configs.EAGER_ONLY) and not a.startswith("_")]
    assert len(triton) == 4 and all(isinstance(point[a], list) and point[a][2] == 9 for a in triton), point
