"""The quantized GEMMs on the GPU: every lane (a sample of each Triton lane, the heuristic, the
torch arm where it runs) over odd and model shapes against the fp32 reference of the
dequantized operands; int8 bitwise equal across every arm and to the CPU path; the ops inside a
captured CUDA graph and under torch.compile."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.scaled_mm import arms, configs, ops  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
INT8, FP8 = families.get("scaled_mm"), families.get("scaled_mm_fp8")
TRITON_IDS = ("b16x64x128_w4_s4_g8", "b64x128x128_w4_s3_g8", "b128x128x64_w8_s4_g8", "b128x256x128_w8_s3_g8",
              "b32x64x64_w4_s3_g8", "sk2_b16x64x128_w4_s3", "sk4_b32x128x128_w4_s4", "sk8_b64x64x128_w4_s3",
              "tma_b128x256x128_w8_s3_g8", "tma_b64x128x128_w4_s4_g8", "tma_b128x128x64_w4_s4_g8",
              # the decode lane (M <= 16 only: arms_for drops it elsewhere)
              "dk1_n32x256_w4_s6_pdl", "dk4_n64x128_w4_s4", "dk8_n32x128_w4_s6_pdl", "dk32_n128x128_w8_s4")
ARMS = TRITON_IDS + ("heuristic", "torch")
# the _quant ops share the GEMM kernels (into fp32) and add the row quantizer: one config per lane
QUANT_ARMS = ("heuristic", "torch", "b64x128x128_w4_s3_g8", "sk4_b32x128x128_w4_s4", "tma_b64x128x128_w4_s4_g8",
              "dk8_n32x128_w4_s6_pdl")
# (M, N, K): odd (N=80, K=200: no 16-alignment, a partial 128 block), decode, prefill, deep K
SHAPES = [(1, 80, 200), (17, 80, 200), (333, 136, 520), (70, 80, 272), (1, 4096, 4096), (16, 6144, 4096), (17, 4096, 4096),
          (100, 4096, 14336), (1024, 28672, 4096), (2048, 4096, 4096)]


INT8_OUT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def arms_for(fam, sig, m):
    ids = QUANT_ARMS if sig.op == "scaled_mm_quant" else ARMS
    return [cid for cid in ids if fam.invalid_reason(fam.parse_config(cid), sig, m, SM90) is None]


def launch(fam, cid, sig, args, m):
    n = sig.get("N")
    if sig.op == "scaled_mm":
        out = torch.full((m, n), float("nan"), dtype=INT8_OUT.get(sig.get("out"), torch.bfloat16), device="cuda")
        y = fam.launch(fam.parse_config(cid), sig, *args, out=out)
        assert y.data_ptr() == out.data_ptr() and not torch.isnan(y).any(), f"{cid} {sig} M={m} left NaN"
        return y
    return fam.launch(fam.parse_config(cid), sig, *args)


def exact_int8_product(sig, x, w, sx, sw):
    """The int8 arms' fp32 product on the GPU: the integer product is exact in fp64 (|acc| < 2^53)
    and rounds to fp32 as the int32 accumulator does; then the epilogue's order."""
    acc = (x.reshape(-1, sig.get("K")).double() @ w.double().t()).float()
    return acc.mul_(sx.reshape(-1, 1)).mul_(sw.reshape(1, -1))


def int8_expected(sig, args):
    y = exact_int8_product(sig, *args)
    if sig.op == "scaled_mm_quant":
        return arms.quantize_rows(y, "int8")
    return y.to(INT8_OUT[sig.get("out")])


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("out", ["bf16", "fp16"])
def test_int8_every_arm_bitwise_equal(m, n, k, out):
    sig = INT8.make_signature("scaled_mm", n, k, out)
    args, _ = INT8.make_inputs(sig, m, "cuda", seed=m)
    want = int8_expected(sig, args)
    if m * n * k <= 1 << 27:  # the CPU path (the op's own) computes the same bits
        assert torch.equal(ops._cpu(sig, *(a.cpu() for a in args)).cuda(), want)
    ran = arms_for(INT8, sig, m)
    assert ("torch" in ran) == (m > 16 and n % 8 == 0 and k % 8 == 0)
    for cid in ran:
        y = launch(INT8, cid, sig, args, m)
        torch.cuda.synchronize()
        assert torch.equal(y, want), f"{cid} {sig} M={m}: not bitwise equal ({(y.float() - want.float()).abs().max()})"
    ref = INT8.reference(sig, *args, dtype=torch.float64)
    assert ((want.double() - ref).abs().max() / ref.abs().max()).item() < 2 ** -7


@pytest.mark.parametrize("m, n, k", SHAPES[:6])
def test_int8_quant_bitwise_equal(m, n, k):
    sig = INT8.make_signature("scaled_mm_quant", n, k, "int8")
    args, _ = INT8.make_inputs(sig, m, "cuda", seed=m)
    wq, ws = int8_expected(sig, args)
    for cid in arms_for(INT8, sig, m):
        q, s = launch(INT8, cid, sig, args, m)
        assert torch.equal(q, wq) and torch.equal(s, ws), f"{cid} {sig} M={m}"


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_fp8_every_arm_against_fp32_reference(m, n, k, scale):
    sig = FP8.make_signature("scaled_mm", n, k, "bf16", scale)
    args, _ = FP8.make_inputs(sig, m, "cuda", seed=m)
    ref = FP8.reference(sig, *args)
    peak = ref.abs().max()
    rounding = ((ref.to(torch.bfloat16).float() - ref).abs().max() / peak).item()
    ran = arms_for(FP8, sig, m)
    base = rounding
    if "torch" in ran:
        base = max(base, ((launch(FP8, "torch", sig, args, m).float() - ref).abs().max() / peak).item())
    for cid in ran:
        err = ((launch(FP8, cid, sig, args, m).float() - ref).abs().max() / peak).item()
        assert err <= 4 * base + 1e-4, f"{cid} {sig} M={m}: error {err:.3e} vs baseline {base:.3e}"


@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_fp8_quant_output_dequantizes_to_the_product(scale):
    for m, n, k in SHAPES[:5]:
        sig = FP8.make_signature("scaled_mm_quant", n, k, "fp8", scale)
        args, _ = FP8.make_inputs(sig, m, "cuda", seed=m)
        ref = arms.product(sig, *args)
        for cid in arms_for(FP8, sig, m):
            q, s = launch(FP8, cid, sig, args, m)
            assert q.dtype == torch.float8_e4m3fn and s.shape == (m, 1)
            # e4m3 keeps 3 mantissa bits: within 1/16 of each value plus the row's smallest step
            bound = ref.abs() / 16 + s * 2 ** -6 + ref.abs().amax(dim=1, keepdim=True) * 1e-2
            assert ((q.float() * s - ref).abs() <= bound).all(), f"{cid} {sig} M={m}"


def _graph_matches_eager(fn, args, fresh):
    static = [a.clone() for a in args]
    fn(*static)  # compile/load outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    for src, dst in zip(fresh, static):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    want = fn(*fresh)
    outs = out if isinstance(out, tuple) else (out,)
    wants = want if isinstance(want, tuple) else (want,)
    assert all(same_bits(o, w) for o, w in zip(outs, wants))


def same_bits(a, b):
    """torch.equal, through a byte view for float8 (which has no CUDA comparison kernels)."""
    if "float8" in str(a.dtype):
        return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


@pytest.mark.parametrize("m", [1, 16, 17, 256])
def test_ops_in_a_captured_graph(m):
    for fam, fn, kw in ((INT8, ops.scaled_mm_int8, dict(op="scaled_mm", out="bf16")),
                        (INT8, ops.scaled_mm_int8_quant, dict(op="scaled_mm_quant", out="int8")),
                        (FP8, ops.scaled_mm_fp8, dict(op="scaled_mm", out="bf16", scale="row")),
                        (FP8, ops.scaled_mm_fp8, dict(op="scaled_mm", out="bf16", scale="block")),
                        (FP8, ops.scaled_mm_fp8_quant, dict(op="scaled_mm_quant", out="fp8", scale="tensor"))):
        sig = fam.make_signature(kw["op"], 4096, 4096, kw["out"], kw.get("scale", "row"))
        args, _ = fam.make_inputs(sig, m, "cuda", seed=1)
        fresh, _ = fam.make_inputs(sig, m, "cuda", seed=2)
        _graph_matches_eager(fn, args, fresh)


def test_ops_under_torch_compile():
    sig = FP8.make_signature("scaled_mm", 4096, 4096, "bf16", "row")
    args, _ = FP8.make_inputs(sig, 64, "cuda", seed=3)

    def f(x, w, sx, sw):
        return ops.scaled_mm_fp8(x, w, sx, sw).float().relu()

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(*args), f(*args))
    isig = INT8.make_signature("scaled_mm", 4096, 4096, "bf16")
    iargs, _ = INT8.make_inputs(isig, 64, "cuda", seed=3)
    g = torch.compile(lambda *a: ops.scaled_mm_int8(*a) + 1, fullgraph=True)
    assert torch.equal(g(*iargs), ops.scaled_mm_int8(*iargs) + 1)


@pytest.mark.parametrize("m", [1, 64])
def test_a_learnable_scale_gets_its_gradient_on_the_gpu(m):
    """A scale requiring grad takes the torch form (the served arm has no backward): the value
    within the arms' own agreement, the gradient exact against fp64."""
    sig = INT8.make_signature("scaled_mm", 4096, 4096, "bf16")
    (x, w, sx, sw), _ = INT8.make_inputs(sig, m, "cuda", seed=4)
    with torch.no_grad():
        served = ops.scaled_mm_int8(x, w, sx, sw)
    ws = sw.reshape(-1).clone().requires_grad_()
    y = ops.scaled_mm_int8(x, w, sx, ws)
    assert torch.equal(y.detach(), served)  # int8: the torch form computes the arms' bits
    y.float().sum().backward()
    acc = x.double() @ w.double().t()
    expect = (acc * sx.double().reshape(-1, 1)).sum(0)
    assert torch.allclose(ws.grad.double(), expect, rtol=1e-4, atol=1e-5 * expect.abs().max().item())
    fsig = FP8.make_signature("scaled_mm", 4096, 4096, "bf16", "row")
    (xf, wf, sxf, swf), _ = FP8.make_inputs(fsig, m, "cuda", seed=4)
    xs = sxf.clone().requires_grad_()
    yf = ops.scaled_mm_fp8(xf, wf, xs, swf)
    ref = FP8.reference(fsig, xf, wf, sxf, swf)
    assert (yf.float() - ref).abs().max() <= (ref.to(torch.bfloat16).float() - ref).abs().max() + 1e-3
    yf.float().sum().backward()
    rows = (xf.double() @ (wf.double() * swf.double().reshape(-1, 1)).t()).sum(1, keepdim=True)
    assert torch.allclose(xs.grad.double(), rows, rtol=1e-3, atol=1e-4 * rows.abs().max().item())


def test_triton_compile_set_runs_on_the_model_shape():
    """Every config of the tuned compile set (the heuristic's tiles) on a Llama-like shape."""
    sig = FP8.make_signature("scaled_mm", 6144, 4096, "bf16", "block")
    args, _ = FP8.make_inputs(sig, 200, "cuda", seed=4)
    ref = FP8.reference(sig, *args)
    for cfg in configs.compile_set("sm90", [], mode="tuned"):
        if cfg.is_sentinel or FP8.invalid_reason(cfg, sig, 200, SM90):
            continue
        err = ((FP8.launch(cfg, sig, *args).float() - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, f"{cfg.id}: {err}"


@pytest.mark.parametrize("fam_name, scale", [("scaled_mm_fp8", "row"), ("scaled_mm_fp8", "block"), ("scaled_mm", "row")])
def test_the_build_gate_verifies_quant_arms(fam_name, scale):
    """The build's gate (poisoned float8/int8 q, compared through an fp32 upcast or bit for bit)
    passes every served lane of the `_quant` op, and fails a q written one column off."""
    from tunedb.measure.arms import Arm, problem_for
    from tunedb.measure.gate import gate_arms

    fam = families.get(fam_name)
    sig = fam.make_signature("scaled_mm_quant", 4096, 4096, "fp8" if fam.dt == "fp8" else "int8", scale)
    m = 64
    problem = problem_for(fam, sig, m, arms_for(fam, sig, m))
    good = problem.baseline

    def rolled(args, kwargs, out):
        run = good.make(args, kwargs, out)
        return lambda: (run(), out.copy_(torch.roll(out.float(), 1, dims=1).to(out.dtype)))

    import dataclasses

    problem = dataclasses.replace(problem, arms=problem.arms + (Arm("rolled", rolled),))
    args, kwargs = problem.make_inputs("cuda", 0)
    res = gate_arms(problem, args, kwargs, problem.make_out, sync=torch.cuda.synchronize)
    assert res.pop("rolled").status.name == "INCORRECT"
    bad = {cid: r for cid, r in res.items() if not r.status.ok}
    assert not bad, bad


@pytest.mark.parametrize("cid", ["dk8_n32x128_w4_s6_pdl", "dk32_n128x128_w8_s4", "dk1_n32x256_w4_s6_pdl"])
@pytest.mark.parametrize("m", [1, 16])
def test_decode_lane_back_to_back_in_a_graph(cid, m):
    """Back-to-back decode calls (PDL lets each start while the previous drains; every call shares
    the launcher's workspace and counters) inside one captured graph: each output bitwise equal to
    its own eager result, so the counters are reset before the next call reads them."""
    sig = INT8.make_signature("scaled_mm", 4096, 4096, "bf16")
    inputs = [INT8.make_inputs(sig, m, "cuda", seed=10 + i)[0] for i in range(4)]
    want = [int8_expected(sig, a) for a in inputs]
    run = INT8.launcher(INT8.parse_config(cid), sig)
    for a in inputs:
        run(*a, None)  # compile and allocate outside the capture
    outs = [torch.full((m, 4096), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in inputs]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a, o in zip(inputs, outs):
            run(*a, o)
    for _ in range(3):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for i, (o, w) in enumerate(zip(outs, want)):
            assert torch.equal(o, w), f"{cid} M={m} call {i}: not bitwise equal after a replay"


def test_the_eager_entry_point_skips_the_dispatcher_only_where_nothing_needs_it():
    from torch.utils._python_dispatch import TorchDispatchMode

    from tunedb.runtime import grad_form

    sig = INT8.make_signature("scaled_mm", 256, 256, "bf16")
    args, _ = INT8.make_inputs(sig, 4, "cuda", seed=5)
    assert grad_form.direct(args) and not grad_form.direct(tuple(a.cpu() for a in args))
    sx = args[2].clone().requires_grad_()
    assert not grad_form.direct((args[0], args[1], sx, args[3]))
    with torch.no_grad():
        assert grad_form.direct((args[0], args[1], sx, args[3]))

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            return func(*a, **(kw or {}))

    with Mode():
        assert not grad_form.direct(args)
    with torch.no_grad():
        direct = ops.scaled_mm_int8(*args)
        assert torch.equal(direct, torch.ops.tunedb.scaled_mm_int8(*args, None))
