"""The eager host path of a tuned GEMM call: the memoised fast path of ops.gemm / gemm_act and
TunedLinear.forward, the launcher's frameless `direct` call, and TunedLinear's Parameter reads.

The fast path only runs for CUDA tensors; here each entry point's own source is compiled with
`.is_cuda` read as `.is_cpu` (as bench/host_path.py times it), so the code tested is the code
shipped, on CPU tensors, against a fake bound launcher in the launch table's call memo."""
from __future__ import annotations

import inspect
import textwrap

import pytest
import torch
import torch.nn.functional as F

from runtime_fakes import gemm  # noqa: F401  (fixture)
from tunedb.families.gemm import launch, ops, patching
from tunedb.records import Config, Signature
from tunedb.runtime import host_bound, launch_table

# the rules under test act on swapped layers (a model no table measured is left as written)
pytestmark = pytest.mark.usefixtures("swap_unmeasured")


def _as_cpu(fn, module, **extra):
    ns = dict(vars(module), **extra)
    # the code object's source: inspect follows a function's __wrapped__ (TunedLinear.forward's
    # points at the forward torch.jit.script compiles), the code object is the eager body itself
    source = inspect.getsource(fn.__code__)
    exec(compile(textwrap.dedent(source).replace(".is_cuda", ".is_cpu"), "<as cpu>", "exec"), ns)
    return ns[fn.__name__]


class _Fake:
    """A bound launcher for the memo: counts calls, records which path ran."""

    def __init__(self, direct: bool) -> None:
        self.counter = launch_table.Count()
        self.ran: list[str] = []
        self.direct = self._direct if direct else None
        self.eager = None  # launch_table.Bound's: no eager fallback (host_bound)

    def call(self, x, weight, bias, out):
        self.ran.append("call")
        return F.linear(x, weight, bias) + 1

    def _direct(self, x, weight, bias=None):
        self.ran.append("direct")
        return F.linear(x, weight, bias) + 1


@pytest.fixture
def cpu_entry(monkeypatch):
    gemm_ = _as_cpu(ops.gemm, ops)
    gemm_act = _as_cpu(ops.gemm_act, ops)
    forward = _as_cpu(patching.TunedLinear.forward, patching)
    monkeypatch.setattr(patching.TunedLinear, "forward", forward)
    launch_table.sync()  # this epoch started: a later sync must not empty the memo under the test
    saved = dict(launch_table._calls)
    launch_table._calls.clear()
    yield gemm_, gemm_act
    launch_table._calls.clear()
    launch_table._calls.update(saved)


@pytest.fixture
def memo_forward(monkeypatch):
    """TunedLinear.forward's own source with CUDA read as CPU and the current stream's handle
    faked (yields the one-item list holding it: 0 the default stream, else a side stream), an
    empty launch-table memo and no gradient."""
    stream = [0]
    forward = _as_cpu(patching.TunedLinear.forward, patching, _raw_stream=lambda device: stream[0])
    monkeypatch.setattr(patching.TunedLinear, "forward", forward)
    monkeypatch.setattr(patching, "_raw_stream", lambda device: stream[0])  # _memo_ok's
    launch_table.sync()
    saved = dict(launch_table._calls)
    launch_table._calls.clear()
    torch.set_grad_enabled(False)
    try:
        yield stream
    finally:
        torch.set_grad_enabled(True)
        launch_table._calls.clear()
        launch_table._calls.update(saved)


def _key(op, act, x, w, b):
    return (op, act, x.shape, x.dtype, w.shape, w.dtype,
            None if b is None else (b.shape, b.dtype, b.is_contiguous()))


@pytest.mark.parametrize("bias,act", [(False, "none"), (True, "none"), (False, "silu"), (True, "gelu")])
def test_tuned_linear_and_the_entry_points_share_one_memo_key(cpu_entry, bias, act):
    gemm_, gemm_act = cpu_entry
    torch.set_grad_enabled(False)
    try:
        lin = torch.nn.Linear(8, 4, bias=bias)
        layer = patching.TunedLinear(lin, act)
        x = torch.randn(3, 8)
        op = "gemm" if not bias and act == "none" else "gemm_act"
        fake = _Fake(direct=True)
        launch_table._calls[_key(op, act, x, lin.weight, lin.bias)] = fake
        want = F.linear(x, lin.weight, lin.bias) + 1
        torch.testing.assert_close(layer(x), want)
        got = gemm_(x, lin.weight) if op == "gemm" else gemm_act(x, lin.weight, lin.bias, act)
        torch.testing.assert_close(got, want)
        assert fake.counter.calls == 2 and fake.ran == ["direct", "direct"]
        fake.direct = None  # a launcher without a direct form: its own call, out=None
        layer(x)
        assert fake.ran[-1] == "call" and fake.counter.calls == 3
    finally:
        torch.set_grad_enabled(True)


def test_the_fast_path_steps_aside_for_grad_autocast_and_dispatch_modes(cpu_entry):
    from torch.utils._python_dispatch import TorchDispatchMode

    lin = torch.nn.Linear(8, 4, bias=False)
    layer = patching.TunedLinear(lin)
    x = torch.randn(2, 8)
    fake = _Fake(direct=True)
    launch_table._calls[_key("gemm", "none", x, lin.weight, None)] = fake
    plain = F.linear(x, lin.weight)

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    y = layer(x)  # grad enabled and the weight wants one: autograd's path, the true result
    assert y.requires_grad and fake.counter.calls == 0
    torch.testing.assert_close(y, plain)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert layer(x).dtype == torch.bfloat16  # what F.linear computes under autocast
        with Seen():
            torch.testing.assert_close(layer(x), plain)
        assert fake.counter.calls == 0
        layer(x)
        assert fake.counter.calls == 1  # and nothing else in the way: the memo serves


def test_tuned_linear_reads_what_module_attribute_access_would():
    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    x = torch.randn(2, 8)
    layer = patching.TunedLinear(torch.nn.Linear(8, 4))
    with torch.no_grad():
        # a Parameter put straight into _parameters (accelerate's device placement does)
        new = torch.nn.Parameter(torch.randn(4, 8))
        layer._parameters["weight"] = new
        torch.testing.assert_close(layer(x), F.linear(x, new, layer.bias))
        parametrize.register_parametrization(layer, "weight", Double())  # a property now
        assert "weight" not in layer._parameters
        torch.testing.assert_close(layer(x), F.linear(x, 2 * new, layer.bias))
        no_bias = patching.TunedLinear(torch.nn.Linear(8, 4, bias=False))
        assert no_bias.bias is None
        torch.testing.assert_close(no_bias(x), F.linear(x, no_bias.weight))


def test_the_torch_arm_without_activation_names_f_linear_as_its_direct_form():
    plain = Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32")
    acted = Signature.parse("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=silu|bias=1")
    run = launch.launcher(Config.sentinel("torch"), plain)
    assert launch_table.direct_of(run) is F.linear
    assert launch_table.direct_of(launch.launcher(Config.sentinel("torch"), acted)) is None
    x, w = torch.randn(3, 32, dtype=torch.bfloat16), torch.randn(64, 32, dtype=torch.bfloat16)
    torch.testing.assert_close(launch_table.direct_of(run)(x, w), run(x, w, None, None), rtol=0, atol=0)
    both = host_bound.graph_only(run, run)  # capture must reach the tuned launcher: no direct form
    assert launch_table.direct_of(both) is None


def _stale(x, weight, bias=None):
    raise AssertionError("the failed launcher's direct form ran")


def test_a_bound_takes_its_launchers_direct_form_and_loses_it_with_a_fallback(gemm, monkeypatch):
    from tunedb import database, families
    from tunedb.errors import TunedbWarning
    from tunedb.records import Entry, Region
    from tunedb.runtime import selector

    real = families.get("gemm").real

    def launcher(config, sig):  # the real torch arm (F.linear direct form), a failing tile
        if config.id == "torch":
            return real.launcher(config, sig)

        def fail(*args):
            raise RuntimeError("out of resources: shared memory")
        fail.direct = _stale  # a direct form the replacement must not inherit
        return fail

    monkeypatch.setattr(gemm, "launcher", launcher)
    x, w = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(64, 32, dtype=torch.bfloat16)
    bound = launch_table.launcher("gemm", x, w, None, "none", 4)
    assert bound.config.id == "torch" and bound.direct is F.linear
    cfg = gemm.parse_config("b32x64x128_w4_s3_g8")
    database.write_entries("user", "gemm", "sm90", [Entry(bound.signature, (Region(None, cfg.id),))], [cfg])
    selector.reload()
    tile = launch_table.launcher("gemm", x, w, None, "none", 4)
    assert tile.config.id == cfg.id and tile.direct is _stale
    with pytest.warns(TunedbWarning, match="failed on its first call"):
        launch_table.first_launch(tile, x, w, None)
    assert tile.config.id == "torch" and tile.direct is F.linear  # the torch arm's own, re-read


@pytest.mark.parametrize("bias", [False, True])
def test_a_size_the_bound_gives_torch_eagerly_is_answered_by_f_linear_from_the_layer_memo(memo_forward, bias):
    """eager_sizes.py through TunedLinear.forward's own source (CUDA read as CPU, the stream handle
    faked): the first eager call of a bound whose eager arm is torch goes through the launcher
    (which primes the pick), later ones on a default stream are F.linear's, counted on the bound;
    a side stream (a capture), a dispatch mode, a new launch-table generation or another weight
    Parameter goes back to the launcher; an activation layer never keeps a memo."""
    from torch.utils._python_dispatch import TorchDispatchMode

    stream = memo_forward
    lin = torch.nn.Linear(8, 4, bias=bias)
    layer = patching.TunedLinear(lin)
    x = torch.randn(3, 8)
    op = "gemm" if not bias else "gemm_act"
    fake = _Fake(direct=False)
    fake.eager = "torch"
    launch_table._calls[_key(op, "none", x, lin.weight, lin.bias)] = fake
    plain = F.linear(x, lin.weight, lin.bias)
    torch.testing.assert_close(layer(x), plain + 1)  # the launcher's call (the fake marks it)
    assert fake.ran == ["call"]
    for _ in range(2):
        assert torch.equal(layer(x), plain)  # F.linear's bits, from the memo
    assert fake.ran == ["call"] and fake.counter.calls == 3
    stream[0] = 7  # a side stream: what a capture runs on
    layer(x)
    assert fake.ran == ["call", "call"]
    stream[0] = 0

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    counted = fake.counter.calls
    with Watch():
        assert torch.equal(layer(x), plain)
    # a mode keeps the entry points' path (the op through the dispatcher, which runs the torch
    # arm here), neither the memo nor the bound: nothing counted on it
    assert fake.counter.calls == counted == 4 and fake.ran == ["call", "call"]
    launch_table.generation[0] += 1
    layer(x)
    assert fake.ran[-1] == "call" and len(fake.ran) == 3  # a new generation: the launcher again
    if bias:  # the bias set to None: another call key (gemm, not gemm_act), never this memo entry
        kept, layer.bias = layer.bias, None
        counted = fake.counter.calls
        layer(x)
        assert fake.counter.calls == counted
        layer.bias = kept
    layer.weight = torch.nn.Parameter(lin.weight.detach().clone())
    launch_table._calls[_key(op, "none", x, layer.weight, lin.bias)] = fake
    layer(x)
    assert len(fake.ran) == 4  # another weight Parameter: the launcher again, then remembered
    assert torch.equal(layer(x), F.linear(x, layer.weight, lin.bias)) and len(fake.ran) == 4
    act = patching.TunedLinear(torch.nn.Linear(8, 4), "silu")
    launch_table._calls[_key("gemm_act", "silu", x, act.weight, act.bias)] = fake
    act(x)
    act(x)
    assert "_eager_sizes" not in act.__dict__


class _TorchArm(_Fake):
    """A bound whose config is the torch arm: its `direct` is F.linear itself."""

    def __init__(self) -> None:
        super().__init__(direct=False)
        self.direct = F.linear


@pytest.mark.usefixtures("memo_forward")
def test_a_torch_arm_size_is_remembered_and_a_sibling_member_only_for_a_size_its_group_declines(monkeypatch):
    """The memo (eager_sizes.py) also holds sizes whose config is the torch arm (F.linear itself,
    no launcher frame): after the first eager call the layer answers from it, counted on the
    bound. A sibling member remembers a size only once its group declined that size eagerly on a
    default stream (quiet): a size its group may launch for stays on the group's path."""
    from tunedb.families.gemm import siblings

    layer = patching.TunedLinear(torch.nn.Linear(8, 4, bias=False))
    x = torch.randn(3, 8)
    arm = _TorchArm()
    launch_table._calls[_key("gemm", "none", x, layer.weight, None)] = arm
    for _ in range(3):
        assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert arm.counter.calls == 3 and set(layer.__dict__["_eager_sizes"].bounds) == {(x.shape, x.dtype, True)}
    calls = []
    monkeypatch.setattr(launch_table, "known", lambda key: calls.append(key))  # the memo answers first
    monkeypatch.setattr(patching, "_known", lambda key: calls.append(key))
    layer(x)
    assert calls == [] and arm.counter.calls == 4

    member = patching.TunedLinear(torch.nn.Linear(8, 4, bias=False))
    group = siblings.SiblingGroup([member, patching.TunedLinear(torch.nn.Linear(8, 4, bias=False))])
    member.__dict__["_siblings"] = (group, 0)
    monkeypatch.setattr(group, "call", lambda index, x: None)  # the group declines (a CPU tensor)
    monkeypatch.setattr(patching, "_known", launch_table.known)
    launch_table._calls[_key("gemm", "none", x, member.weight, None)] = arm
    member(x)
    assert "_eager_sizes" not in member.__dict__  # not quiet: the group may still want the size
    group.quiet.add((x.numel(), x.dtype))
    member(x)
    assert set(member.__dict__["_eager_sizes"].bounds) == {(x.shape, x.dtype, True)}


@pytest.mark.parametrize("served", ["eager torch", "torch config", "tuned"])
def test_a_fused_pair_the_torch_arm_serves_eagerly_runs_as_plain_from_its_second_call(monkeypatch, memo_forward, served):
    """A Linear fused with the activation after it, whose fused key the torch arm serves eagerly
    (F.linear then the activation: the plain model's two kernels), answers its later eager calls
    on a default stream from its memo with F.linear, and its slot applies the model's activation
    (session 58: the fused eager path cost the host more than the plain pair, bench/eager_bisect.py);
    a capture's side stream still takes the fused launcher, and a key a tuned kernel serves eagerly
    stays fused."""
    from types import SimpleNamespace

    stream = memo_forward
    import tunedb
    from tunedb.families.gemm import fused_pair

    seq = tunedb.optimize(torch.nn.Sequential(torch.nn.Linear(8, 4, bias=False), torch.nn.SiLU()), families="all")
    lin = seq[0]
    assert type(seq[1]) is fused_pair.FusedActivation and lin.act == "silu"
    x = torch.randn(3, 8)
    fake = _Fake(direct=False)
    fake.config = SimpleNamespace(id="torch" if served == "torch config" else "b16x64x64_w4_s3")
    fake.eager = "torch" if served == "eager torch" else None
    launch_table._calls[_key("gemm_act", "silu", x, lin.weight, None)] = fake
    plain = F.silu(F.linear(x, lin.weight))
    fused = F.linear(x, lin.weight) + 1  # the fake launcher's output, passed through by the slot
    assert torch.equal(seq(x), fused) and fake.ran == ["call"]
    outs = [seq(x) for _ in range(2)]
    if served == "tuned":
        assert all(torch.equal(o, fused) for o in outs) and fake.ran == ["call"] * 3
        assert "_eager_sizes" not in lin.__dict__
        return
    assert all(torch.equal(o, plain) for o in outs)  # F.linear, then the slot's SiLU
    assert fake.ran == ["call"] and fake.counter.calls == 3
    stream[0] = 7  # a side stream (a capture): the fused launcher again
    assert torch.equal(seq(x), fused) and fake.ran == ["call", "call"]
    stream[0] = 0
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight))  # called alone: no SiLU in it
    torch.testing.assert_close(seq[1](x), F.silu(x))  # the slot called alone applies its module
    pair = lin.__dict__["_tunedb_fused"]
    fused_pair.decided(pair, True)  # a fused decision its slot never took (the parent raised between)
    asked = []
    monkeypatch.setattr(type(pair), "fused_here", lambda self: asked.append(1))
    assert torch.equal(seq(x), plain) and asked == []  # the memo answers first: no frame walk
