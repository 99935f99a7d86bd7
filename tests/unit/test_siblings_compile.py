"""Sibling groups in compiled code (families/gemm/siblings_compile.py), on the CPU: the traced
member op computes the member's own output; the post-grad pass turns one group's members on one
tensor into one launch node and leaves a member called alone as it is; the decomposition keeps the
op only where the forward runs in CUDA graphs and the launch takes the shapes; Dynamo traces a
grouped model's members as the op, in one graph, with no state touched."""
from __future__ import annotations

import inspect
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from tunedb.families.gemm import linear_forms, ops_compile, patching, siblings, siblings_compile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sibling_models import Attn  # noqa: E402

SIB = torch.ops.tunedb.sibling.default
SIBS = torch.ops.tunedb.siblings.default
TRACED = (SIB, torch.ops.tunedb.sibling)  # Dynamo's graph names the packet, AOT's the overload


def _operands(bias=True, dt=torch.float32, n=(6, 4, 4), k=8, rows=1):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 1, k, generator=g).to(dt)
    ws = [torch.randn(m, k, generator=g).to(dt) for m in n]
    bs = [torch.randn(m, generator=g).to(dt) for m in n] if bias else [None] * len(n)
    return x, ws, bs


def _three(x, ws, bs, acts=("none", "silu", "none"), written=(False, False, True)):
    acts, written = list(acts), list(written)
    return [torch.ops.tunedb.sibling(x, ws, bs, acts, written, i) for i in range(len(ws))]


def _want(x, ws, bs, acts=("none", "silu", "none")):
    return [siblings_compile.ops.ACTS[a](F.linear(x, w, b)) for w, b, a in zip(ws, bs, acts)]


@pytest.mark.parametrize("bias", [False, True])
def test_the_member_op_is_the_members_own_output_and_the_group_op_every_members(bias):
    x, ws, bs = _operands(bias)
    for got, want in zip(_three(x, ws, bs), _want(x, ws, bs)):
        torch.testing.assert_close(got, want)
    both = torch.ops.tunedb.siblings(x, ws, bs, ["none", "silu", "none"])  # the CPU: each member's torch form
    for got, want in zip(both, _want(x, ws, bs)):
        torch.testing.assert_close(got, want)


def test_the_member_op_names_a_bad_index():
    x, ws, bs = _operands()
    with pytest.raises(ValueError, match="index 3 of 3 weights"):
        torch.ops.tunedb.sibling(x, ws, bs, ["none"] * 3, [False] * 3, 3)


def _traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def test_the_pass_makes_one_launch_of_a_groups_members_on_one_tensor():
    x, ws, bs = _operands()

    def f(x, w0, w1, w2, b0, b1, b2):
        q, k, v = _three(x, [w0, w1, w2], [b0, b1, b2])
        lone = torch.ops.tunedb.sibling(x * 2, [w0, w1, w2], [b0, b1, b2], ["none", "silu", "none"],
                                        [False, False, True], 1)  # another tensor: runs alone
        return q + 1, k, v, lone

    gm = _traced(f, x, *ws, *bs)
    want = gm(x, *ws, *bs)
    assert siblings_compile.group(gm.graph) == 1
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(SIBS) == 1 and targets.count(SIB) == 1
    launch = next(n for n in gm.graph.nodes if n.target is SIBS)
    assert sorted(u.args[1] for u in launch.users) == [0, 1, 2]
    for got, w in zip(gm(x, *ws, *bs), want):
        torch.testing.assert_close(got, w)


def test_the_pass_leaves_a_single_member_and_other_ops_alone():
    x, ws, bs = _operands(bias=False)

    def f(x, w0, w1, w2):
        k = torch.ops.tunedb.sibling(x, [w0, w1, w2], [None] * 3, ["none"] * 3, [True] * 3, 1)
        return F.linear(x, w0) + 0, k

    gm = _traced(f, x, *ws)
    before = [(n.op, n.target) for n in gm.graph.nodes]
    assert siblings_compile.group(gm.graph) == 0
    assert [(n.op, n.target) for n in gm.graph.nodes] == before


def test_the_pass_launches_for_two_of_three_members_and_types_the_third():
    x, ws, bs = _operands(bias=False)

    def f(x, w0, w1, w2):
        acts, written = ["none"] * 3, [True] * 3  # a group optimize() marked for the K split
        return (torch.ops.tunedb.sibling(x, [w0, w1, w2], [None] * 3, acts, written, 0, True),
                torch.ops.tunedb.sibling(x, [w0, w1, w2], [None] * 3, acts, written, 2, True))

    gm = _traced(f, x, *ws)
    assert siblings_compile.group(gm.graph) == 1
    gm.recompile()
    launch = next(n for n in gm.graph.nodes if n.target is SIBS)
    assert [tuple(v.shape) for v in launch.meta["val"]] == [(1, 1, 6), (1, 1, 4), (1, 1, 4)]
    assert launch.args[4] is True  # the group's split goes to its launch
    for got, w in zip(gm(x, *ws), (F.linear(x, ws[0]), F.linear(x, ws[2]))):
        torch.testing.assert_close(got, w)


def _fake_cuda(rows=1, k=4096, n=(4096, 1024, 1024), dt=torch.bfloat16, bias=False):
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(rows, 1, k, device="cuda", dtype=dt)
        ws = [torch.empty(m, k, device="cuda", dtype=dt) for m in n]
        bs = [torch.empty(m, device="cuda", dtype=dt) for m in n] if bias else [None] * len(n)
    return mode, x, ws, bs


def test_admits_what_one_launch_takes():
    _, x, ws, bs = _fake_cuda()
    assert siblings_compile.admits(x, ws, bs, ["none"] * 3)
    _, x16, ws16, bs16 = _fake_cuda(rows=16)
    assert siblings_compile.admits(x16, ws16, bs16, ["none"] * 3)
    _, x17, ws17, bs17 = _fake_cuda(rows=17)
    assert not siblings_compile.admits(x17, ws17, bs17, ["none"] * 3)  # more rows than the kernel's tile
    _, xf, wsf, bsf = _fake_cuda(dt=torch.float32)
    assert not siblings_compile.admits(xf, wsf, bsf, ["none"] * 3)
    _, xd, wsd, bsd = _fake_cuda(k=8192, n=(128, 128))
    assert not siblings_compile.admits(xd, wsd, bsd, ["none"] * 2)  # a deep K over few weight rows
    _, xb, wsb, bsb = _fake_cuda(bias=True)
    assert not siblings_compile.admits(xb, wsb, [bsb[0], None, None], ["none"] * 3)  # biases mixed
    assert not siblings_compile.admits(x, ws, bs, ["none", "tanh", "none"])  # no such epilogue
    x_cpu, ws_cpu, bs_cpu = _operands(dt=torch.bfloat16)
    assert not siblings_compile.admits(x_cpu, ws_cpu, bs_cpu, ["none"] * 3)


def test_admits_nothing_with_siblings_off(monkeypatch):
    monkeypatch.setenv("TUNEDB_SIBLINGS", "0")
    _, x, ws, bs = _fake_cuda()
    assert not siblings_compile.admits(x, ws, bs, ["none"] * 3)


@pytest.mark.parametrize("graphs", [False, True])
def test_the_decomposition_keeps_the_op_only_for_graphs(monkeypatch, graphs):
    from torch._inductor import config as inductor_config

    monkeypatch.setenv("TUNEDB_COMPILED_SIBLINGS", "1")
    monkeypatch.setattr(ops_compile, "_compiler_captures", lambda: graphs)
    mode, x, ws, bs = _fake_cuda()
    with mode, inductor_config.patch(post_grad_custom_pre_pass=None):
        got = siblings_compile.decomposition(x, ws, bs, ["none"] * 3, [True] * 3, 1)
    if graphs:
        assert got is NotImplemented
    else:
        assert tuple(got.shape) == (1, 1, 1024)  # the member's own form (F.linear: left as written)
    with mode:  # a shape the launch does not take: the member's own form, graphs or not
        x17 = torch.empty(17, 1, 4096, device="cuda", dtype=torch.bfloat16)
        assert siblings_compile.decomposition(x17, ws, bs, ["none"] * 3, [True] * 3, 1) is not NotImplemented


# Inductor's config is set through its own patch(): pytest's monkeypatch (9.2) restores an
# attribute that is not in a module's __dict__ by deleting it, which hides a config entry for good


def test_the_decomposition_keeps_nothing_unless_opted_in(monkeypatch):
    monkeypatch.setattr(ops_compile, "_compiler_captures", lambda: True)
    mode, x, ws, bs = _fake_cuda()
    from torch._inductor import config as inductor_config

    for value, kept in (("0", False), ("1", True)):
        monkeypatch.setenv("TUNEDB_COMPILED_SIBLINGS", value)
        with mode, inductor_config.patch(post_grad_custom_pre_pass=None):
            got = siblings_compile.decomposition(x, ws, bs, ["none"] * 3, [True] * 3, 1)
        assert (got is NotImplemented) == kept


def test_install_pass_leaves_a_users_pass_alone():
    from torch._inductor import config as inductor_config

    def users(graph):
        pass

    for theirs in (users, [users]):
        with inductor_config.patch(post_grad_custom_pre_pass=theirs):
            assert not siblings_compile.install_pass()
            assert inductor_config.post_grad_custom_pre_pass is theirs
    with inductor_config.patch(post_grad_custom_pre_pass=None):
        assert siblings_compile.install_pass() and siblings_compile.install_pass()
        installed = inductor_config.post_grad_custom_pre_pass
        assert isinstance(installed, siblings_compile.GroupPass) and isinstance(installed.uuid(), str)


def test_a_decomposition_beside_a_users_pass_compiles_the_member_alone(monkeypatch):
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(siblings_compile, "_kept", lambda *args: True)
    x, ws, bs = _operands()
    with inductor_config.patch(post_grad_custom_pre_pass=lambda graph: None):
        got = siblings_compile.decomposition(x, ws, bs, ["none"] * 3, [True] * 3, 1)
    torch.testing.assert_close(got, F.linear(x, ws[1], bs[1]))


def _as_cpu(fn, module):
    source = inspect.getsource(fn.__code__)
    ns = dict(vars(module))
    exec(compile(textwrap.dedent(source).replace(".is_cuda", ".is_cpu"), "<as cpu>", "exec"), ns)
    return ns[fn.__name__]


class _Attn(torch.nn.Module):
    def __init__(self, members):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = members

    def forward(self, h):
        return self.q_proj(h) * (self.k_proj(h).sum(-1, keepdim=True) + self.v_proj(h).sum(-1, keepdim=True))


def _grouped(monkeypatch, dt=torch.bfloat16, written=False, opted_in=True):
    """A q/k/v group of TunedLinears on the CPU, member_call reading the CPU as CUDA."""
    monkeypatch.setenv("TUNEDB_COMPILED_SIBLINGS", "1" if opted_in else "0")
    monkeypatch.setattr(linear_forms, "member_call", _as_cpu(siblings_compile.member_call, siblings_compile))
    torch.manual_seed(0)
    attn = Attn(d=16, kv=8).to(dt)
    members = [patching.TunedLinear(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj")]
    g = siblings.SiblingGroup(members, ("q_proj", "k_proj", "v_proj"), max_rows=16)
    for i, m in enumerate(members):
        m.__dict__["_siblings"] = (g, i)
        if written:
            m.__dict__["_as_written"] = True
    return _Attn(members), g, members


def _dynamo_graphs(model, *xs, fullgraph=True):
    """The graphs Dynamo hands its backend for model(x) of each x, and the outputs."""
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=fullgraph)
    outs = [compiled(x) for x in xs]
    torch._dynamo.reset()
    return graphs, outs


def _traced_calls(graphs):
    return [n for gm in graphs for n in gm.graph.nodes if n.op == "call_function" and n.target in TRACED]


@pytest.mark.parametrize("written", [False, True])
def test_dynamo_traces_each_member_as_the_op_in_one_graph(monkeypatch, written):
    """The traced form on a GPU, with the CPU standing in for CUDA (member_call's device test):
    three member ops on one tensor in one graph, no group state touched, outputs the plain layers'."""
    model, g, _ = _grouped(monkeypatch, written=written)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        graphs, (got, too_many) = _dynamo_graphs(model, x, torch.randn(17, 16, dtype=torch.bfloat16))
    calls = _traced_calls(graphs[:1])
    assert sorted(n.args[5] for n in calls) == [0, 1, 2] and len({n.args[0] for n in calls}) == 1
    assert all(n.args[4] == [written] * 3 for n in calls)
    assert g.launches == 0 and g._state is None and not g.quiet
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))  # eager on the CPU: each member's torch form
    assert too_many.shape == (17, 16)
    assert not _traced_calls(graphs[-1:])  # 17 rows: the members' own forms


def test_dynamo_leaves_members_alone_when_a_gradient_is_wanted(monkeypatch):
    model, _g, members = _grouped(monkeypatch, dt=torch.float32)
    graphs, (y,) = _dynamo_graphs(model, torch.randn(2, 16), fullgraph=False)
    y.sum().backward()
    assert graphs and not _traced_calls(graphs)
    assert members[0].weight.grad is not None


def test_inductor_compiles_a_groups_members_to_one_launch_where_kept(monkeypatch):
    """Inductor end to end on the CPU, the decomposition told to keep the ops (as for CUDA tensors
    in graphs): one tunedb::siblings call in the generated code, no member op left, the outputs
    each member's own (the CPU launch: each member's torch form)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setattr(siblings_compile, "_kept", lambda *args: True)
    x, ws, bs = _operands(bias=True)

    def fn(x, w0, w1, w2, b0, b1, b2):
        q, k, v = _three(torch.relu(x), [w0, w1, w2], [b0, b1, b2], written=(True, True, True))
        return q.sum(-1) + k.sum(-1) * v.sum(-1)

    torch._dynamo.reset()
    with inductor_config.patch(post_grad_custom_pre_pass=None):  # the keeping decomposition installs the pass
        assert ops_compile.register_compile_decompositions()
        got, code = run_and_get_code(torch.compile(fn, dynamic=False, fullgraph=True), x, *ws, *bs)
    torch._dynamo.reset()
    source = "\n".join(code)
    assert source.count("torch.ops.tunedb.siblings.default(") == 1, source
    assert "torch.ops.tunedb.sibling.default(" not in source
    q, k, v = _want(torch.relu(x), ws, bs)
    torch.testing.assert_close(got, q.sum(-1) + k.sum(-1) * v.sum(-1))


def test_inductor_compiles_each_member_alone_without_graphs(monkeypatch):
    from torch._inductor.utils import run_and_get_code

    assert ops_compile.register_compile_decompositions()
    x, ws, bs = _operands(bias=False)

    def fn(x, w0, w1, w2):
        q, k, v = _three(x, [w0, w1, w2], [None] * 3, ("none",) * 3, written=(False, True, False))
        return q.sum(-1) + k.sum(-1) + v.sum(-1)

    torch._dynamo.reset()
    got, code = run_and_get_code(torch.compile(fn, dynamic=False, fullgraph=True), x, *ws)
    torch._dynamo.reset()
    source = "\n".join(code)
    # CPU tensors: the members' own forms, a served member's tuned op decomposed in turn (F.linear)
    assert "torch.ops.tunedb." not in source, source
    torch.testing.assert_close(got, sum(y.sum(-1) for y in _want(x, ws, bs, ("none",) * 3)))


def test_dynamo_leaves_members_alone_under_autocast(monkeypatch):
    model, _g, _ = _grouped(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        graphs, _ = _dynamo_graphs(model, torch.randn(2, 16, dtype=torch.bfloat16), fullgraph=False)
    assert graphs and not _traced_calls(graphs)


def test_dynamo_traces_members_as_before_when_turned_off(monkeypatch):
    model, _g, _ = _grouped(monkeypatch, opted_in=False)
    with torch.no_grad():
        graphs, _ = _dynamo_graphs(model, torch.randn(2, 16, dtype=torch.bfloat16))
    assert graphs and not _traced_calls(graphs)
    # the trace reads no other member's weight through the group (no guard on it)
    assert not [n for n in graphs[0].graph.nodes if n.op == "placeholder" and "siblings" in n.name]
