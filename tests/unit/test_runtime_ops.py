"""The tunedb:: custom ops on CPU: registration, fake kernels under torch.compile, autograd, errors."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from tunedb.errors import SignatureError
from tunedb.families.gemm import ops, ops_compile

ACTS = {
    "none": lambda y: y,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def _inputs(lead=(3, 5), k=16, n=8, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*lead, k, generator=g, dtype=dtype).requires_grad_(grad)
    w = torch.randn(n, k, generator=g, dtype=dtype).requires_grad_(grad)
    b = torch.randn(n, generator=g, dtype=dtype).requires_grad_(grad)
    return x, w, b


def test_import_tunedb_does_not_register_or_import_torch():
    code = ("import sys, tunedb; assert 'torch' not in sys.modules, 'torch imported';"
            "assert 'tunedb.families.gemm.ops' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pure_runtime_modules_import_without_torch():
    code = ("import sys; import tunedb.runtime.autotuner, tunedb.runtime.prewarm, tunedb.runtime.report;"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_ops_are_registered_under_the_tunedb_namespace():
    assert torch.ops.tunedb.gemm.default._schema.name == "tunedb::gemm"
    schema = str(torch.ops.tunedb.gemm_act.default._schema)
    assert "Tensor? bias" in schema and "str act" in schema


@pytest.mark.parametrize("act", list(ACTS))
def test_cpu_runs_the_torch_arm(act):
    x, w, b = _inputs()
    assert torch.equal(ops.gemm_act(x, w, b, act), ACTS[act](F.linear(x, w, b)))
    assert torch.equal(torch.ops.tunedb.gemm_act(x, w, None, act), ACTS[act](F.linear(x, w)))
    assert torch.equal(ops.gemm(x, w), F.linear(x, w))


def test_bf16_on_cpu_and_empty_batch():
    x, w, b = _inputs(dtype=torch.bfloat16)
    assert torch.equal(ops.gemm_act(x, w, b, "silu"), F.silu(F.linear(x, w, b)))
    empty = torch.empty(0, 16)
    assert ops.gemm(empty, torch.randn(8, 16)).shape == (0, 8)


def test_opcheck_schema_fake_and_autograd():
    x, w, b = _inputs(grad=True)
    torch.library.opcheck(torch.ops.tunedb.gemm_act.default, (x, w, b, "gelu"))
    torch.library.opcheck(torch.ops.tunedb.gemm_act.default, (x, w, None, "silu"))
    torch.library.opcheck(torch.ops.tunedb.gemm.default, (x, w))


@pytest.mark.parametrize("act", list(ACTS))
def test_gradients_match_linear_plus_activation(act):
    x, w, b = _inputs(grad=True)
    ops.gemm_act(x, w, b, act).square().sum().backward()
    got = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    ACTS[act](F.linear(x, w, b)).square().sum().backward()
    for mine, ref in zip(got, (x.grad, w.grad, b.grad)):
        torch.testing.assert_close(mine, ref)


def test_bad_inputs_name_the_value_and_what_is_allowed():
    x, w, b = _inputs()
    with pytest.raises(SignatureError, match="act='tanh'.*allowed: none, gelu, gelu_tanh, relu, silu"):
        ops.gemm_act(x, w, b, "tanh")
    with pytest.raises(ValueError, match="K=16"):
        ops.gemm(torch.randn(2, 3), w)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        ops.gemm_act(x, w, torch.randn(3), "none")
    with pytest.raises(ValueError, match="dtype"):
        ops.gemm(x.half(), w)
    with pytest.raises(ValueError, match="bias dtype torch.float16 differs from x dtype torch.float32"):
        ops.gemm_act(x, w, b.half(), "none")


def test_torch_compile_traces_the_ops_without_graph_breaks():
    x, w, b = _inputs()

    def fn(x, w, b):
        return ops.gemm_act(x, w, b, "gelu") + ops.gemm(x, w)

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, w, b), fn(x, w, b))
        x2 = torch.randn(7, 16)  # another M reuses the dynamic graph
        torch.testing.assert_close(compiled(x2, w, b), fn(x2, w, b))


def test_torch_compile_backward_through_the_op():
    x, w, b = _inputs(grad=True)
    compiled = torch.compile(lambda x, w, b: ops.gemm_act(x, w, b, "relu").sum(),
                             backend="aot_eager", fullgraph=True)
    compiled(x, w, b).backward()
    ref_x = x.detach().clone().requires_grad_(True)
    F.relu(F.linear(ref_x, w.detach(), b.detach())).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)


def _seen_mode():
    """A dispatch mode that lists the ops it sees (a debugging mode, as FlopCounterMode is)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    return Seen()


def test_dispatch_modes_and_grad_still_see_the_tuned_op():
    """The Autograd kernel's fast path (plain tensors, no grad: straight to the implementation)
    must not hide the op from a dispatch mode (FakeTensor, tracing, debug modes) or from autograd."""
    x, w, b = _inputs()
    with torch.no_grad(), _seen_mode() as seen:
        torch.ops.tunedb.gemm_act.default(x, w, b, "silu")
        torch.ops.tunedb.gemm.default(x, w)
    assert seen.ops[:1] == ["tunedb.gemm_act.default"] and "tunedb.gemm.default" in seen.ops
    bias = b.clone().requires_grad_(True)  # only the bias needs a gradient
    torch.ops.tunedb.gemm_act.default(x, w, bias, "relu").sum().backward()
    ref = b.clone().requires_grad_(True)
    F.relu(F.linear(x, w, ref)).sum().backward()
    torch.testing.assert_close(bias.grad, ref.grad)


def test_entry_points_under_a_dispatch_mode_go_through_the_op():
    """A plain tensor under a mode (a debugging mode; make_fx's proxy mode) must reach the mode as
    tunedb's op, not run the eager path below it."""
    x, w, b = _inputs()
    with torch.no_grad(), _seen_mode() as seen:
        y = ops.gemm_act(x, w, b, "gelu")
        ops.gemm(x, w)
    assert seen.ops[0] == "tunedb.gemm_act.default" and "tunedb.gemm.default" in seen.ops
    torch.testing.assert_close(y, F.gelu(F.linear(x, w, b)))


def test_non_strict_export_keeps_a_lifted_constant_call_as_the_op():
    """Non-strict torch.export runs the module in Python: a tensor attribute that is neither a
    parameter nor a buffer (a lifted constant) reaches the entry point as a plain tensor, with
    Dynamo not tracing. Both calls must be exported as tunedb's op."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(1)
            self.w = torch.nn.Parameter(torch.randn(8, 16, generator=g))
            self.c = torch.randn(4, 16, generator=g)  # a plain attribute: a lifted constant

        def forward(self, x):
            return ops.gemm(x, self.w) + ops.gemm(self.c, self.w)

    m = M()
    x = torch.randn(4, 16)
    with torch.no_grad():  # (with grad the weight's requires_grad already routes the call)
        ep = torch.export.export(m, (x,), strict=False)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("tunedb.gemm.default") == 2, targets
    torch.testing.assert_close(ep.module()(x), F.linear(x, m.w) + F.linear(m.c, m.w))


def test_model_weights_take_the_direct_path_without_grad(monkeypatch):
    """A compiled graph calls the op with the model's nn.Parameter weights under no_grad: that
    must reach the implementation without building an autograd node (the host cost per call)."""
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16)

    def no_autograd(*args):
        raise AssertionError("took the autograd.Function path")

    monkeypatch.setattr(ops._TunedGemm, "apply", no_autograd)
    with torch.no_grad():
        y = torch.ops.tunedb.gemm_act.default(x, lin.weight, lin.bias, "gelu")
        torch.testing.assert_close(y, F.gelu(lin(x)))
        torch.ops.tunedb.gemm.default(x, lin.weight)
    with pytest.raises(AssertionError, match="autograd.Function"):  # grad needed: it must take it
        torch.ops.tunedb.gemm.default(x, lin.weight)


def test_meta_tensors_take_the_fake_kernel():
    x, w = torch.empty(2, 5, 16, device="meta"), torch.empty(8, 16, device="meta")
    with torch.no_grad():
        y = torch.ops.tunedb.gemm_act.default(x, w, None, "relu")
    assert y.device.type == "meta" and y.shape == (2, 5, 8)


# --- compile-time selection (Inductor's decomposition of the tuned ops) -----------------------

def _serve(sig_text: str, config_id: str) -> None:
    from tunedb import database
    from tunedb.runtime import selector
    from tunedb.families.gemm import FAMILY
    from tunedb.records import Entry, Region, Signature

    cfg = FAMILY.parse_config(config_id)
    database.write_entries("user", "gemm", "sm90", [Entry(Signature.parse(sig_text), (Region(256, cfg.id),))],
                           [] if cfg.is_sentinel else [cfg])
    selector.reload()


def test_inductor_decomposes_a_torch_served_shape_and_keeps_a_triton_one(tiers_dirs):
    """Static CUDA shapes: where the tiers serve the torch arm, the compiler gets F.linear + the
    activation (it fuses them like the plain model's); where they serve Triton, the op stays."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tunedb import settings
    from tunedb.runtime import launch_table

    _serve("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=gelu|bias=1", "torch")
    _serve("gemm|op=gemm_act|dt=bf16|N=96|K=32|act=silu|bias=0", "b64x64x64_w4_s3_g8")
    _serve("gemm|op=gemm_act|dt=bf16|N=48|K=32|act=relu|bias=1", "fused")
    with FakeTensorMode():
        x = torch.empty(4, 10, 32, device="cuda", dtype=torch.bfloat16)
        w64, b64 = (torch.empty(64, 32, device="cuda", dtype=torch.bfloat16),
                    torch.empty(64, device="cuda", dtype=torch.bfloat16))
        w96 = torch.empty(96, 32, device="cuda", dtype=torch.bfloat16)
        y = ops_compile._gemm_act_decomposition(x, w64, b64, "gelu")
        assert y is not NotImplemented and y.shape == (4, 10, 64)
        assert ops_compile._gemm_act_decomposition(x, w96, None, "silu") is NotImplemented
        w48, b48 = (torch.empty(48, 32, device="cuda", dtype=torch.bfloat16),
                    torch.empty(48, device="cuda", dtype=torch.bfloat16))
        assert ops_compile._gemm_act_decomposition(x, w48, b48, "relu").shape == (4, 10, 48)  # _addmm_activation
        served = {(key[2], b.m): (b.config.id, b.tier, b.calls) for key, b in launch_table.entries()}
        assert served == {(64, 40): ("torch", "user", 0), (96, 40): ("b64x64x64_w4_s3_g8", "user", 0),
                          (48, 40): ("fused", "user", 0)}
        with launch_table.overriding(lambda fam, sig, m: None):  # autotune()/pin: never decided here
            assert ops_compile._gemm_act_decomposition(x, w64, b64, "gelu") is NotImplemented
        with settings.override(CAPTURE=str(tiers_dirs / "capture.jsonl")):  # a census must see it
            launch_table.clear()
            assert ops_compile._gemm_act_decomposition(x, w64, b64, "gelu") is NotImplemented
        launch_table.clear()
        assert ops_compile._gemm_act_decomposition(x, w64, b64, "gelu") is not NotImplemented


def test_an_m1_triton_pick_goes_to_the_compiler_under_coordinate_descent(tiers_dirs):
    """At M=1 under coordinate_descent_tuning Inductor reduces an mm and fuses it with its
    neighbours; a Triton pick then decomposes to F.linear (+ bias, + activation) rather than stay
    an opaque call. Larger M, or no coordinate descent, keeps the op."""
    from torch._inductor import config as inductor_config
    from torch._subclasses.fake_tensor import FakeTensorMode

    _serve("gemm|op=gemm_act|dt=bf16|N=96|K=32|act=silu|bias=1", "b64x64x64_w4_s3_g8")
    _serve("gemm|op=gemm|dt=bf16|N=96|K=32", "b32x32x32_w4_s3_g8")
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        w, b = (torch.empty(96, 32, device="cuda", dtype=torch.bfloat16),
                torch.empty(96, device="cuda", dtype=torch.bfloat16))
        x1, x4 = (torch.empty(1, 1, 32, device="cuda", dtype=torch.bfloat16),
                  torch.empty(4, 32, device="cuda", dtype=torch.bfloat16))
        with inductor_config.patch(coordinate_descent_tuning=False):
            assert ops_compile._gemm_act_decomposition(x1, w, b, "silu") is NotImplemented
            assert ops_compile._gemm_decomposition(x1, w) is NotImplemented
        with inductor_config.patch(coordinate_descent_tuning=True):
            assert ops_compile._gemm_act_decomposition(x1, w, b, "silu").shape == (1, 1, 96)
            assert ops_compile._gemm_decomposition(x1, w).shape == (1, 1, 96)
            assert ops_compile._gemm_act_decomposition(x4, w, b, "silu") is NotImplemented
            # what the compiler is handed: an mm (which it reduces), the bias add, the activation
            graph = make_fx(lambda x, w, b: ops_compile._gemm_act_decomposition(x, w, b, "silu"))(x1, w, b)
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert {"aten.mm.default", "aten.add.Tensor", "aten.silu.default"} <= targets, targets
    assert not any("addmm" in t or "tunedb" in t for t in targets), targets


def test_a_pick_the_eager_rule_yields_goes_to_the_compiler_unless_it_captures_graphs(tiers_dirs, monkeypatch):
    """A Triton pick whose eager calls torch serves (a kernel shorter than its host time:
    model.eager_fallback) decomposes to F.linear in a compile without CUDA graphs, whose forward
    the host issues call by call; so does an epilogue pick whose bare product the rule yields
    (Inductor fuses the activation: one launch either way). Under mode="reduce-overhead"
    (triton.cudagraphs) the op stays, as does a pick the rule keeps."""
    from torch._inductor import config as inductor_config
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tunedb import settings
    from tunedb.runtime import host_bound

    asked = []

    def rule(family, sig, m, config, tier):  # the GPU's rule, on a CPU: short kernels at N=96
        asked.append(sig.format())
        return "torch" if sig.op == "gemm" and dict(sig.params)["N"] == 96 else None
    monkeypatch.setattr(host_bound, "eager_fallback", rule)
    _serve("gemm|op=gemm|dt=bf16|N=96|K=32", "b32x32x32_w4_s3_g8")
    _serve("gemm|op=gemm|dt=bf16|N=64|K=32", "b32x32x32_w4_s3_g8")
    _serve("gemm|op=gemm_act|dt=bf16|N=96|K=32|act=silu|bias=0", "b32x32x32_w4_s3_g8")
    with FakeTensorMode():
        x = torch.empty(4, 32, device="cuda", dtype=torch.bfloat16)
        w96, w64 = (torch.empty(n, 32, device="cuda", dtype=torch.bfloat16) for n in (96, 64))
        with inductor_config.patch({"triton.cudagraphs": False, "coordinate_descent_tuning": False}):
            y = ops_compile._gemm_decomposition(x, w96)
            assert y is not NotImplemented and y.shape == (4, 96)
            asked.clear()
            y = ops_compile._gemm_act_decomposition(x, w96, None, "silu")
            assert y is not NotImplemented and y.shape == (4, 96)
            assert "gemm|op=gemm|dt=bf16|N=96|K=32" in asked  # asked about the bare product
            assert ops_compile._gemm_decomposition(x, w64) is NotImplemented  # the rule keeps this pick
        with inductor_config.patch({"triton.cudagraphs": True, "coordinate_descent_tuning": False}):
            assert ops_compile._gemm_decomposition(x, w96) is NotImplemented
            assert ops_compile._gemm_act_decomposition(x, w96, None, "silu") is NotImplemented
        # a default-mode compile its user captures by hand (TUNEDB_COMPILED_GRAPHS=1): the picks stay
        with inductor_config.patch({"triton.cudagraphs": False, "coordinate_descent_tuning": False}), \
                settings.override(COMPILED_GRAPHS="1"):
            assert ops_compile._gemm_decomposition(x, w96) is NotImplemented


def test_inductor_compiles_cpu_calls_to_plain_aten():
    """On the CPU the op is the torch arm: Inductor's code calls no tunedb op and matches eager."""
    from torch._inductor.utils import run_and_get_code

    x, w, b = _inputs()

    def fn(x):
        return ops.gemm_act(x, w, b, "gelu") * 2 + ops.gemm(x, w)

    from torch._inductor import config as inductor_config
    from torch._inductor.decomposition import decompositions

    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(force_disable_caches=True):
        got, code = run_and_get_code(torch.compile(fn, dynamic=False, fullgraph=True), x)
    assert ops_compile.registered[0]  # by the fake kernel, during the trace
    assert torch.ops.tunedb.gemm_act.default in decompositions
    assert "ops.tunedb" not in "".join(code)
    torch.testing.assert_close(got, fn(x))
    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(force_disable_caches=True):  # a dynamic M too
        got, code = run_and_get_code(torch.compile(fn, dynamic=True, fullgraph=True), x)
    assert "ops.tunedb" not in "".join(code)
    torch.testing.assert_close(got, fn(x))


def test_compiled_calls_carry_the_selection_token_and_keep_their_choices(tiers_dirs):
    """The traced graph names the selection state its compile-time choices came from (so compile
    caches tell states apart); a tier change does not recompile (no guard: a compiled graph keeps
    its choices, and a changing tier cannot walk it into Dynamo's recompile limit), a new compile
    carries the new state's token, and an active override marks the token opaque."""
    from torch._dynamo.testing import CompileCounter

    from tunedb.runtime import launch_table

    x, w, b = _inputs()
    graphs = []
    counter = CompileCounter()

    def backend(gm, example_inputs):
        graphs.append([[a for a in n.args if isinstance(a, str)] for n in gm.graph.nodes
                       if n.op == "call_function" and "tunedb" in str(n.target)])
        return counter(gm, example_inputs)

    def fn(x):
        return ops.gemm_act(x, w, b, "gelu")

    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(fn, backend=backend, fullgraph=True)
        compiled(x)
        first = launch_table.compile_token()
        _serve("gemm|op=gemm_act|dt=fp32|N=8|K=16|act=gelu|bias=1", "torch")  # writes, reloads
        second = launch_table.compile_token()
        compiled(x)  # the same compiled code: no recompile on a tier change
        assert counter.frame_count == 1
        torch._dynamo.reset()
        torch.compile(fn, backend=backend, fullgraph=True)(x)
        with launch_table.overriding(lambda fam, sig, m: None):
            torch._dynamo.reset()
            torch.compile(fn, backend=backend, fullgraph=True)(x)
    assert first != second
    assert graphs == [[["gelu", first]], [["gelu", second]], [["gelu", second + "+opaque"]]]


def test_symbolic_and_empty_sizes_under_the_decomposition():
    """On CUDA a symbolic M (dynamic or data-dependent) keeps the op, before any size comparison;
    on the CPU (the torch arm whatever the sizes) it decomposes; an empty output (N = 0)
    decomposes to what eager returns."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    with FakeTensorMode(shape_env=env):
        u = env.create_unbacked_symint()
        w = torch.empty(64, 32, device="cuda", dtype=torch.bfloat16)
        assert ops_compile._gemm_decomposition(torch.empty(u, 32, device="cuda", dtype=torch.bfloat16), w) is NotImplemented
        cpu = ops_compile._gemm_decomposition(torch.empty(u, 32), torch.empty(64, 32))
        assert cpu is not NotImplemented and cpu.shape[1] == 64
        assert ops_compile._gemm_act_decomposition(torch.empty(4, 32), torch.empty(64, 32), None, "relu").shape == (4, 64)
    x = torch.randn(3, 32)
    y = ops_compile._gemm_act_decomposition(x, torch.empty(0, 32), None, "gelu")
    assert y.shape == (3, 0) and torch.equal(y, ops.gemm_act(x, torch.empty(0, 32), None, "gelu"))


def test_inductor_lowers_an_op_the_decomposition_keeps(monkeypatch):
    """Where the decomposition keeps the op (a Triton-served CUDA shape), Inductor must lower it
    to a call of the op: on the CPU, force that case and compile."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setattr(ops_compile, "_decompose", lambda *args: NotImplemented)
    x, w, b = _inputs(lead=(6,))

    def fn(x):
        return ops.gemm_act(x, w, b, "silu") * 3

    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(force_disable_caches=True):
        got, code = run_and_get_code(torch.compile(fn, dynamic=False, fullgraph=True), x)
    assert "ops.tunedb.gemm_act" in "".join(code)
    torch.testing.assert_close(got, fn(x))


def test_the_token_names_the_tiers_as_loaded_not_as_on_disk(tiers_dirs):
    """A tier file rewritten by another process mid-epoch changes nothing this epoch serves, so
    it must not change the token either; the next epoch (reload) sees it."""
    from tunedb import database
    from tunedb.runtime import selector
    from tunedb.records import Entry, Region, Signature
    from tunedb.runtime import launch_table

    _serve("gemm|op=gemm|dt=bf16|N=64|K=32", "torch")
    launch_table.clear()
    loaded = launch_table.compile_token()
    sig = Signature.parse("gemm|op=gemm|dt=bf16|N=96|K=32")
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(256, "torch"),))], [])
    launch_table.clear()  # forgets the token, not the epoch's loaded files
    assert launch_table.compile_token() == loaded
    selector.reload()
    assert launch_table.compile_token() != loaded


@pytest.mark.parametrize("mode,captures", [("default", False), ("reduce-overhead", True)])
def test_the_decomposition_sees_whether_the_compile_records_cuda_graphs(monkeypatch, mode, captures):
    """The eager rule's decomposition reads Inductor's triton.cudagraphs while the compiler
    decomposes: torch.compile(mode="reduce-overhead") patches it on for that compile, so a pick
    stays the tuned op there and yields to aten in a default-mode compile."""
    seen = []

    def decompose(*args):
        seen.append(ops_compile._compiler_captures())
        return NotImplemented
    monkeypatch.setattr(ops_compile, "_decompose", decompose)
    x, w, b = _inputs(lead=(6,))

    def fn(x):
        return ops.gemm_act(x, w, b, "silu") * 3

    from torch._inductor import config as inductor_config

    torch._dynamo.reset()
    with torch.no_grad(), warnings.catch_warnings(), inductor_config.patch(force_disable_caches=True):
        warnings.simplefilter("ignore")  # reduce-overhead on a CPU: cudagraphs skipped, said once
        got = torch.compile(fn, dynamic=False, fullgraph=True, mode=mode)(x)
    torch._dynamo.reset()
    assert seen and set(seen) == {captures}
    torch.testing.assert_close(got, fn(x))


def test_the_compile_token_names_the_settings_the_decomposition_reads(tiers_dirs):
    """A persistent compile cache is keyed on the graph before decomposition: the token it holds
    must change with the eager rule's settings and TUNEDB_COMPILED_GRAPHS, read per trace."""
    from tunedb import settings
    from tunedb.runtime import launch_table

    base = launch_table.compile_token()
    seen = {base}
    for change in ({"COMPILED_GRAPHS": "1"}, {"EAGER_KERNEL_US": "32"}, {"EAGER_FALLBACK": "0"}):
        with settings.override(**change):
            seen.add(launch_table.compile_token())
    assert len(seen) == 4
    with settings.override(COMPILED_GRAPHS="0"):  # '0' is 'auto'
        assert launch_table.compile_token() == base
    assert launch_table.compile_token() == base


def test_at_m1_under_coordinate_descent_a_yielded_pick_with_bias_is_still_an_mm(tiers_dirs, monkeypatch):
    """max-autotune-no-cudagraphs (coordinate descent, no graphs): an M=1 pick the eager rule
    yields is handed over as mm + bias add, the form Inductor reduces and fuses, not an addmm."""
    from torch._inductor import config as inductor_config
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from tunedb.runtime import host_bound

    monkeypatch.setattr(host_bound, "eager_fallback", lambda family, sig, m, config, tier: "torch")
    _serve("gemm|op=gemm_act|dt=bf16|N=96|K=32|act=none|bias=1", "b64x64x64_w4_s3_g8")
    with FakeTensorMode():
        w, b = (torch.empty(96, 32, device="cuda", dtype=torch.bfloat16),
                torch.empty(96, device="cuda", dtype=torch.bfloat16))
        x1 = torch.empty(1, 32, device="cuda", dtype=torch.bfloat16)
        with inductor_config.patch({"triton.cudagraphs": False, "coordinate_descent_tuning": True}):
            graph = make_fx(lambda x, w, b: ops_compile._gemm_act_decomposition(x, w, b, "none"))(x1, w, b)
    targets = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
    assert "aten.mm.default" in targets and not any("addmm" in t for t in targets), targets
