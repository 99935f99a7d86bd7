"""The conv family's cuDNN arms on the CPU: `torch` leaves the process's cuDNN flags alone, the
autotuner's flag is set around a bench arm's call and restored (also from many threads at once),
and a bench arm never benchmarks inside a CUDA graph capture unless this thread already did for
that key (a capture is faked: arms._capturing)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from tunedb.families.conv import arms, keys

DW = keys.make_signature("conv1d", "fp16", 8, 8, 5, 1, 2, 1, 8, True)


@pytest.fixture
def flag():
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    arms._WARM.keys = set()
    yield
    torch.backends.cudnn.benchmark = old
    arms._WARM.keys = set()


def spy():
    seen = []

    def conv(x, w, b, **kw):
        seen.append(torch.backends.cudnn.benchmark)
        return torch.nn.functional.conv1d(x, w, b, **kw)
    return conv, seen


def test_torch_arm_keeps_the_process_setting(flag):
    conv, seen = spy()
    x, w = torch.randn(1, 8, 20), torch.randn(8, 1, 5)
    kw = dict(padding=2, groups=8)
    arms._call(conv, x, w, None, False, kw)
    torch.backends.cudnn.benchmark = True  # a process that runs cuDNN's autotuner keeps it under tunedb
    arms._call(conv, x, w, None, False, kw)
    assert seen == [False, True] and torch.backends.cudnn.benchmark is True


def test_bench_arm_benchmarks_outside_captures_only(flag, monkeypatch):
    conv, seen = spy()
    x, w = torch.randn(1, 8, 20), torch.randn(8, 1, 5)
    kw = dict(padding=2, groups=8)
    monkeypatch.setattr(arms, "_capturing", lambda: True)
    arms._call(conv, x, w, None, True, kw)  # first met inside a capture: the autotuner stays off
    monkeypatch.setattr(arms, "_capturing", lambda: False)
    arms._call(conv, x, w, None, True, kw)  # the warm-up outside: it benchmarks
    monkeypatch.setattr(arms, "_capturing", lambda: True)
    arms._call(conv, x, w, None, True, kw)  # now the capture replays the cached pick
    arms._call(conv, torch.randn(1, 8, 30), w, None, True, kw)  # another length: a new cuDNN key
    assert seen == [False, True, True, False]
    assert torch.backends.cudnn.benchmark is False  # restored every time
    seen.clear()
    warmed = threading.Thread(target=lambda: arms._call(conv, x, w, None, True, kw))
    warmed.start()
    warmed.join()
    assert seen == [False]  # cuDNN's plan cache is per thread: so is the warm-up


def test_flag_restored_when_threads_toggle_at_once(flag):
    inside = []

    def work():
        for _ in range(20):
            with arms.cudnn_benchmark(True):
                inside.append(torch.backends.cudnn.benchmark)
                time.sleep(0.0005)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(inside) and len(inside) == 160
    assert torch.backends.cudnn.benchmark is False


def test_every_cudnn_arm_computes_the_same_convolution_on_cpu(flag):
    args, _ = arms.make_inputs(DW, 40, "cpu", 0)
    x, w, b = (a.float() if isinstance(a, torch.Tensor) else a for a in args[:3])
    ref = torch.nn.functional.conv1d(x, w, b, padding=2, groups=8)
    for bench in (False, True):
        for cl in (False, True):
            torch.testing.assert_close(arms.torch_conv(DW, x, w, b, bench, cl), ref)
    assert torch.backends.cudnn.benchmark is False
