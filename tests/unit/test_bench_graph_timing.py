"""bench/graph_timing.replay_ms on a fake CUDA: the body is captured once for i in 0..n-1, one
warm replay runs untimed, and the result is the median over the timed replays divided by n."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import graph_timing  # noqa: E402


class _Graph:
    replays = 0

    def replay(self):
        _Graph.replays += 1


class _Capture:
    def __init__(self, g):
        self.g = g

    def __enter__(self):
        return self.g

    def __exit__(self, *exc):
        return False


class _Event:
    clock = iter([0.0, 4.0, 10.0, 12.0, 20.0, 26.0])  # replay times 4, 2, 6 ms

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = next(_Event.clock)

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.t - self.t


def test_replay_ms_times_one_captured_graph(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _Capture)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    seen = []
    ms = graph_timing.replay_ms(seen.append, 2, reps=3)
    assert seen == [0, 1]  # captured once
    assert _Graph.replays == 4  # one warm replay, three timed
    assert ms == 2.0  # median(4, 2, 6) / 2
