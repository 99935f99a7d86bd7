"""runtime/graph_captures: the process's count of CUDA-graph captures torch began, and the sibling
group's use of it (the driver asked only before a priming launch)."""
from __future__ import annotations

import types

import pytest
import torch

from tunedb.runtime import graph_captures


class _FakeGraph:
    """torch.cuda.graphs.CUDAGraph's two capture methods, recording their calls."""

    calls: list = []

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if capture_error_mode == "bad":
            raise RuntimeError("capture refused")
        self.calls.append("begin")

    def capture_end(self):
        self.calls.append("end")


@pytest.fixture
def fresh(monkeypatch):
    import torch.cuda.graphs as graphs

    fake = type("CUDAGraph", (_FakeGraph,), {})
    monkeypatch.setattr(graphs, "CUDAGraph", fake)
    monkeypatch.setattr(graph_captures, "_watching", [])
    monkeypatch.setattr(graph_captures, "_begun", [0])
    return fake


def test_captures_are_counted_from_begin_to_end_and_a_refused_begin_is_not(fresh):
    assert graph_captures.active() is None  # not watching yet: callers ask the driver
    assert graph_captures.watch() and graph_captures.watch()  # once; the second call changes nothing
    g = fresh()
    assert graph_captures.active() is False
    g.capture_begin()
    assert graph_captures.active() is True
    h = fresh()
    h.capture_begin(capture_error_mode="thread_local")
    g.capture_end()
    assert graph_captures.active() is True  # h still captures
    h.capture_end()
    assert graph_captures.active() is False
    with pytest.raises(RuntimeError, match="capture refused"):
        g.capture_begin(capture_error_mode="bad")
    assert graph_captures.active() is False
    assert fresh.capture_begin.__name__ == "capture_begin"  # the wrapper keeps torch's name and docs


def test_without_torchs_methods_nothing_is_counted(monkeypatch):
    import torch.cuda.graphs as graphs

    monkeypatch.setattr(graphs, "CUDAGraph", types.SimpleNamespace())
    monkeypatch.setattr(graph_captures, "_watching", [])
    assert graph_captures.watch() is False and graph_captures.active() is None


def test_a_left_as_written_group_asks_the_driver_only_before_priming(monkeypatch):
    from tunedb.families.gemm import siblings
    from tunedb.families.gemm.patching import TunedLinear

    launches = []
    monkeypatch.setattr(siblings.SiblingGroup, "_launch", lambda self, x, w, b: launches.append(x) or [None] * 3)
    monkeypatch.setattr(siblings.SiblingGroup, "_operands", lambda self, x: ([1, 2, 3], [None] * 3, []))
    asked = []
    driver = {"capturing": False}
    monkeypatch.setattr(siblings, "_capturing_now", lambda: asked.append(1) or driver["capturing"])
    counted = {"now": False}
    monkeypatch.setattr(graph_captures, "active", lambda: counted["now"])
    members = [TunedLinear(torch.nn.Linear(16, 16).half()) for _ in range(3)]
    for m in members:
        m.__dict__["_as_written"] = True
    g = siblings.SiblingGroup(members, ("q", "k", "v"), max_rows=16)
    x = torch.randn(2, 16, dtype=torch.float16)
    assert not g.may_take(x) and len(asked) == 1 and len(launches) == 1  # primed once, after asking
    for _ in range(3):
        assert not g.may_take(x)
    assert len(asked) == 1 and len(launches) == 1  # steady eager calls: no driver call
    counted["now"] = True  # a capture torch began
    assert g.may_take(x) and len(asked) == 1
    counted["now"] = False
    driver["capturing"] = True  # a capture the count missed, at a row count never primed
    assert g.may_take(torch.randn(3, 16, dtype=torch.float16)) and len(launches) == 1  # no launch in it
