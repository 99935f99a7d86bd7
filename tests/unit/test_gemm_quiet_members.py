"""Sibling members left as written, quiet eagerly (families/gemm/quiet_members.py), through
TunedLinear.forward's own source with CUDA read as CPU and the stream handle faked (as
test_gemm_host_path.py does): once a member's group declined its eager call on a default stream
after priming, the member runs F.linear with no question asked; a CUDA-graph capture (a side
stream) still reaches the group's launch through it, which stays in place; a refresh, a copy or a
parametrization leave it."""
from __future__ import annotations

import copy
import gc
import pickle

import pytest
import torch
import torch.nn.functional as F

from test_gemm_host_path import _as_cpu
from tunedb.families.gemm import kernels_siblings, patching, quiet_members, siblings

from sibling_models import Attn


class _Graph:
    """torch.cuda.CUDAGraph's capture methods, as a CPU stand-in: record the calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.calls.append("begin")

    def capture_end(self):
        self.calls.append("end")


@pytest.fixture
def world(monkeypatch):
    """A written q/k/v group on the CPU: a fake launch site counting launches, streams faked
    (0: the default stream), a fresh capture wrap over _Graph, TunedLinear.forward as CPU."""
    gc.collect()  # groups and members of earlier tests (each holds the other) leave the quiet set
    launches = []

    def site_for(ns, k, has_bias, acts, interpret=False, tiles=None, m=1):
        def site(grid, x, *ptrs):
            launches.append(m)
            for i in range(len(acts)):
                y = F.linear(x.view(m, k), ptrs[i], ptrs[6 + i] if has_bias else None)
                ptrs[3 + i].copy_(y.view(-1))
        return site, (1,)

    stream = {"raw": 0, "capturing": False}
    monkeypatch.setattr(kernels_siblings, "site_for", site_for)
    monkeypatch.setattr(siblings, "_RAW_STREAM", lambda index: stream["raw"])
    monkeypatch.setattr(siblings, "_capturing", lambda: stream["capturing"])
    raw = lambda index: stream["raw"]  # noqa: E731
    monkeypatch.setattr(patching.TunedLinear, "forward", _as_cpu(patching.TunedLinear.forward, patching, _raw_stream=raw))
    monkeypatch.setattr(patching, "_raw_stream", raw)
    # the quiet forward's own source, CUDA read as CPU too (its side-stream test is then reachable)
    monkeypatch.setattr(quiet_members, "_RAW_STREAM", raw)
    monkeypatch.setattr(quiet_members, "_forward", _as_cpu(quiet_members._forward, quiet_members, _RAW_STREAM=raw))
    monkeypatch.setattr(torch.cuda.graphs, "CUDAGraph", type("Graph", (_Graph,), {}))  # wrapped afresh per test
    monkeypatch.setattr(quiet_members, "_wrapped", [False])
    monkeypatch.setattr(quiet_members, "_captures", [0])
    monkeypatch.setattr(siblings, "EAGER_MIN_BYTES", 1 << 40)
    torch.set_grad_enabled(False)
    yield launches, stream
    torch.set_grad_enabled(True)


def _written(bias: bool):
    torch.manual_seed(0)
    attn = Attn(bias=bias).to(torch.float16)
    members = [patching.TunedLinear(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj")]
    for m in members:
        m.__dict__["_as_written"] = True
    g = siblings.SiblingGroup(members, ("q_proj", "k_proj", "v_proj"), max_rows=16)
    g._arch_ok = True
    for i, m in enumerate(members):
        m.__dict__["_siblings"] = (g, i)
    return g, members


def _quiet(bias: bool, rows: int):
    """A written group whose members went quiet after eager calls of `rows` rows, and that x."""
    g, members = _written(bias)
    x = torch.randn(rows, 16, dtype=torch.float16)
    for _ in range(2):
        for m in members:
            m(x)
    assert all(quiet_members.is_quiet(m.__dict__.get("forward")) for m in members)
    return g, members, x


def _plain(members, x):
    return [F.linear(x, m.weight, m.bias) for m in members]


@pytest.mark.parametrize("bias", [False, True])
def test_a_declined_member_goes_quiet_and_a_capture_sees_the_group_launch(world, bias):
    launches, stream = world
    g, members = _written(bias)
    x = torch.randn(4, 16, dtype=torch.float16)
    ys = [m(x) for m in members]  # q primes the launch (outputs dropped); each declined call: quiet
    assert launches == [4] and all(quiet_members.is_quiet(m.__dict__.get("forward")) for m in members)
    assert all(torch.equal(a, b) for a, b in zip(ys, _plain(members, x)))
    ys = [m(x) for m in members]
    assert all(torch.equal(a, b) for a, b in zip(ys, _plain(members, x))) and launches == [4]
    quiet = [m.__dict__["forward"] for m in members]
    assert all(torch.equal(m(x), y) for m, y in zip(members, _plain(members, x))) and launches == [4]

    graph = torch.cuda.graphs.CUDAGraph()  # wrapped at the first member's enter()
    graph.capture_begin()
    # the forwards stay (a compiled model's guard on them holds: no recompile inside the capture)
    assert graph.calls == ["begin"] and [m.__dict__.get("forward") for m in members] == quiet
    stream.update(raw=0x7F00, capturing=True)
    ys = [m(x) for m in members]  # in the capture (a side stream): one group launch, each member takes its output
    assert launches == [4, 4] and g.launches == 1
    assert all(torch.equal(a, b) for a, b in zip(ys, _plain(members, x)))
    graph.capture_end()
    stream.update(raw=0, capturing=False)
    assert graph.calls == ["begin", "end"]
    assert [m.__dict__.get("forward") for m in members] == quiet


def test_a_nested_capture_refuses_new_quiet_members_until_the_last_ends_and_a_failed_begin_counts_nothing(world):
    _g, members, _x = _quiet(False, 2)
    quiet_members.leave(members[:1])
    outer, inner = torch.cuda.graphs.CUDAGraph(), torch.cuda.graphs.CUDAGraph()
    outer.capture_begin()
    inner.capture_begin()
    inner.capture_end()
    assert not quiet_members.enter(members[0])  # never entered while a capture runs
    outer.capture_end()
    assert all("forward" in m.__dict__ for m in members[1:]) and quiet_members._captures == [0]
    assert quiet_members.enter(members[0])

    class Refusing(_Graph):
        def capture_begin(self, pool=None, capture_error_mode="global"):
            raise RuntimeError("CUDA graphs must be captured on a non-default stream")

    torch.cuda.graphs.CUDAGraph = Refusing  # the fixture's monkeypatch restores torch's
    quiet_members._wrapped[0] = False
    quiet_members.leave(members)
    assert quiet_members.enter(members[0])  # wraps the refusing begin
    with pytest.raises(RuntimeError, match="non-default stream"):
        torch.cuda.graphs.CUDAGraph().capture_begin()
    assert quiet_members._captures == [0] and "forward" in members[0].__dict__


def test_refresh_copies_and_a_parametrization_leave_quiet(world):
    g, members, x = _quiet(True, 3)
    twin = copy.deepcopy(members[1])
    assert "forward" not in twin.__dict__  # a copy starts without (its closure would read the original)
    assert "forward" not in pickle.loads(pickle.dumps(members[1])).__dict__
    assert torch.equal(twin(x), F.linear(x, twin.weight, twin.bias))

    torch.nn.utils.parametrize.register_parametrization(members[0], "weight", _Double())
    y = members[0](x)  # the weight left its slot: the layer's own forward, no longer quiet
    assert torch.equal(y, F.linear(x, members[0].weight, members[0].bias))
    assert "forward" not in members[0].__dict__

    members[2].weight = torch.nn.Parameter(torch.randn(8, 16, dtype=torch.float16))  # a new weight: read per call
    assert torch.equal(members[2](x), F.linear(x, members[2].weight, members[2].bias))
    g.refresh()  # optimize() re-run serves a member now: the group's rule may differ
    assert all("forward" not in m.__dict__ for m in members)


class _Double(torch.nn.Module):
    def forward(self, w):
        return w * 2


def test_a_member_called_with_more_rows_than_its_group_takes_goes_quiet_too(world):
    """An encoder's q/k/v called on a whole sequence (more rows than TUNEDB_SIBLING_ROWS) are
    declined before any priming; eagerly on a default stream that is as final as a primed
    decline, so the members go quiet at their first call; a side stream never makes them quiet."""
    launches, stream = world
    g, members = _written(False)
    many = torch.randn(40, 16, dtype=torch.float16)
    stream["raw"] = 0x7F00  # a side stream, not capturing: declined, never quiet
    assert torch.equal(members[0](many), F.linear(many, members[0].weight))
    assert "forward" not in members[0].__dict__
    stream["raw"] = 0
    ys = [m(many) for m in members]
    assert launches == [] and all(quiet_members.is_quiet(m.__dict__.get("forward")) for m in members)
    assert all(torch.equal(a, b) for a, b in zip(ys, _plain(members, many)))


def test_a_side_stream_call_takes_the_layer_forward_and_primes_while_the_default_stream_stays_quiet(world):
    """torch's recommended warm-up before a capture runs on a side stream: a quiet member hands
    such a call to TunedLinear.forward, which primes the group at those rows (and stays quiet)."""
    launches, stream = world
    g, members, x = _quiet(False, 3)
    two = torch.randn(2, 16, dtype=torch.float16)
    members[0](two)  # default stream: F.linear, no priming
    assert launches == [3]
    stream["raw"] = 0x7F00
    y = members[0](two)
    assert launches == [3, 2] and torch.equal(y, F.linear(two, members[0].weight))
    assert quiet_members.is_quiet(members[0].__dict__.get("forward"))


def test_a_capture_primes_the_kernel_forms_its_quiet_groups_never_ran(world, monkeypatch):
    """Quiet members never primed the rows a capture may call with: before the capture begins
    each such group runs its kernel's forms not yet run (one row, a few, sixteen)."""
    from tunedb.families.gemm import kernels_siblings as ks

    assert siblings.MAX_ROWS_KERNEL == ks.MAX_ROWS
    monkeypatch.setattr(siblings.SiblingGroup, "prime_forms", _as_cpu(siblings.SiblingGroup.prime_forms, siblings))
    launches, _stream = world
    g, members, x = _quiet(False, 3)
    assert launches == [3]
    graph = torch.cuda.graphs.CUDAGraph()
    graph.capture_begin()
    assert sorted(launches) == [1, 2, 3, 16]
    graph.capture_end()
    graph.capture_begin()  # primed once
    graph.capture_end()
    assert sorted(launches) == [1, 2, 3, 16]


def test_a_bias_registered_later_a_script_and_a_data_parallel_replica(world):
    g, members, x = _quiet(False, 3)
    m = members[0]
    del m.bias
    m.bias = torch.nn.Parameter(torch.randn(16, dtype=torch.float16))
    assert torch.equal(m(x), F.linear(x, m.weight, m.bias))  # read from its slot at every call
    replica = members[1]._replicate_for_data_parallel()
    assert "forward" not in replica.__dict__ and quiet_members.is_quiet(members[1].__dict__.get("forward"))
    members[2].__prepare_scriptable__()  # what torch.jit.script calls first: the closure goes
    assert "forward" not in members[2].__dict__


class _Three(torch.nn.Module):
    def __init__(self, members):
        super().__init__()
        self.q, self.k, self.v = members

    def forward(self, x):
        return self.q(x).sum(-1) + self.k(x).sum(-1) + self.v(x).sum(-1)


@pytest.mark.parametrize("quiet", [False, True])
def test_dynamo_traces_written_members_in_one_graph_and_never_touches_the_group(world, quiet):
    """Under a compiler's trace a member left as written is nn.Linear's form: the group's launch
    (kept outputs, primed rows, stream queries) is host state Dynamo broke its graph on (session
    46: 10 breaks in Llama-3-8B's layers, tunedb+compile 0.58x of compile without graphs); so are
    quiet members. The trace neither primes, launches nor makes a member quiet."""
    launches, stream = world
    if quiet:
        g, members, x = _quiet(False, 3)
    else:
        g, members = _written(False)
        x = torch.randn(3, 16, dtype=torch.float16)
    model = _Three(members)
    before = (list(launches), set(g.quiet), [m.__dict__.get("forward") for m in members])
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert (list(launches), set(g.quiet), [m.__dict__.get("forward") for m in members]) == before
    want = sum(F.linear(x, m.weight).sum(-1) for m in members)
    torch.testing.assert_close(torch.compile(model, backend="eager", fullgraph=True)(x), want)
    torch._dynamo.reset()
