"""The tunedb::scaled_mm_* ops on the CPU: results against the reference, clear errors for bad
scales, fake kernels (meta tensors, torch.compile), selection's fallback to the heuristic where
torch._int_mm cannot run, and the family's problem factory."""
import pytest
import torch

from tunedb import families
from tunedb.errors import SignatureError
from tunedb.families.scaled_mm import arms, ops
from tunedb.records import ArchProfile, Config

INT8 = families.get("scaled_mm")
FP8 = families.get("scaled_mm_fp8")


def _inputs(fam, scale="row", m=5, n=48, k=160, op="scaled_mm", out="bf16", seed=0):
    sig = fam.make_signature(op, n, k, out, scale)
    args, kwargs = fam.make_inputs(sig, m, "cpu", seed)
    assert kwargs == {}
    return sig, args


def test_make_inputs_layouts_and_nonzero():
    for scale, xs, ws in (("tensor", (1,), (1,)), ("row", (5, 1), (48, 1)), ("block", (5, 2), (1, 2))):
        sig, (x, w, sx, sw) = _inputs(FP8, scale)
        assert (x.dtype, w.dtype, sx.dtype) == (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float32)
        assert (tuple(x.shape), tuple(w.shape), tuple(sx.shape), tuple(sw.shape)) == ((5, 160), (48, 160), xs, ws)
        assert x.float().abs().sum() > 0 and (sx > 0).all() and (sw > 0).all()
    _, (x, w, sx, sw) = _inputs(INT8)
    assert x.dtype == torch.int8 and x.abs().max() == 127 and w.abs().max() == 127
    # the quantization is faithful: dequantized operands reproduce the fp32 data's product
    a, b = _inputs(FP8, "block", seed=3)[1], _inputs(FP8, "block", seed=3)[1]
    assert all(torch.equal(p.float(), q.float()) for p, q in zip(a, b))


@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
def test_fp8_op_matches_reference(scale):
    sig, args = _inputs(FP8, scale)
    y = ops.scaled_mm_fp8(*args)
    ref = FP8.reference(sig, *args)
    assert y.dtype == torch.bfloat16 and y.shape == (5, 48)
    assert (y.float() - ref).abs().max() <= (ref.to(torch.bfloat16).float() - ref).abs().max() + 1e-6
    assert torch.equal(ops.scaled_mm_fp8(*args, scale=scale), y)


def test_int8_op_is_exact_then_rounded_once():
    sig, (x, w, sx, sw) = _inputs(INT8)
    y = ops.scaled_mm_int8(x, w, sx, sw)
    exact = (x.double() @ w.double().t()) * sx.double() * sw.double().reshape(1, -1)
    assert y.dtype == torch.bfloat16
    assert (y.double() - exact).abs().max() <= exact.abs().max() * 2 ** -8
    assert ops.scaled_mm_int8(x, w, sx, sw, torch.float16).dtype == torch.float16


def test_a_learnable_scale_gets_its_gradient_and_its_tangent():
    """Below autograd the op dropped the gradient of a scale requiring grad (with a warning only);
    the torch form runs where one is wanted: the gradient is exact, the value the same."""
    from torch.func import jvp

    _, (x, w, sx, sw) = _inputs(INT8)
    sw = sw.reshape(-1).clone().requires_grad_()
    y = ops.scaled_mm_int8(x, w, sx, sw, torch.float16)
    g = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y.backward(g.to(y.dtype))
    acc = x.double() @ w.double().t()
    expect = ((acc * sx.double()) * g.to(torch.float16).double()).sum(0)
    # fp32 sums of five signed terms: relative to the largest, not to each (one may cancel to ~0)
    assert sw.grad is not None and torch.allclose(sw.grad.double(), expect, rtol=1e-5,
                                                  atol=1e-5 * expect.abs().max().item())
    with torch.no_grad():
        assert torch.equal(ops.scaled_mm_int8(x, w, sx, sw, torch.float16), y.detach())
    _, (xf, wf, sxf, swf) = _inputs(FP8, "row")
    t = torch.rand_like(sxf)
    _, dy = jvp(lambda s_: ops.scaled_mm_fp8(xf, wf, s_, swf), (sxf,), (t,))
    rows = (xf.float() @ (wf.float() * swf.reshape(-1, 1)).t())
    assert torch.allclose(dy.float(), (rows * t).to(torch.bfloat16).float(), rtol=2e-2, atol=1e-2)


def test_quant_ops_return_rows_and_scales():
    sig, args = _inputs(INT8, op="scaled_mm_quant", out="int8")
    q, s = ops.scaled_mm_int8_quant(*args)
    y = ops.cpu_product(sig, *args)
    assert q.dtype == torch.int8 and s.shape == (5, 1) and q.abs().amax(dim=1).eq(127).all()
    assert ((q.float() * s - y).abs() <= s / 2 * (1 + 1e-5)).all()  # within half a quantum
    sig, args = _inputs(FP8, "row", op="scaled_mm_quant", out="fp8")
    q, s = ops.scaled_mm_fp8_quant(*args)
    ref = arms.product(sig, *args)
    assert q.dtype == torch.float8_e4m3fn and (q.float() * s - ref).abs().max() <= ref.abs().max() / 16
    # the gate's reference for the quant op is q itself (the protocol's out), here the same bits
    assert torch.equal(FP8.reference(sig, *args), q.float())


def test_bad_scales_raise_clear_errors_through_the_op():
    _, (x, w, sx, sw) = _inputs(INT8)
    with pytest.raises(SignatureError, match=r"w_scale has shape \[47, 1\] but scale=row"):
        ops.scaled_mm_int8(x, w, sx, sw[:47])
    with pytest.raises(SignatureError, match="must be torch.float32"):
        ops.scaled_mm_int8(x, w, sx.half(), sw)
    with pytest.raises(SignatureError, match="scaled_mm_fp8 takes fp8 operands, got torch.int8"):
        ops.scaled_mm_fp8(x, w, sx, sw)
    _, (x8, w8, sx8, sw8) = _inputs(FP8, "block")
    with pytest.raises(SignatureError, match=r"x_scale has shape \[5, 1\]"):
        ops.scaled_mm_fp8(x8, w8, sx8[:, :1], sw8)
    with pytest.raises(SignatureError, match="out='fp16' not allowed"):
        ops.scaled_mm_fp8(x8, w8, sx8, sw8, out_dtype=torch.float16)


def test_fake_kernels_give_shapes_on_meta():
    x = torch.empty((2, 3, 256), dtype=torch.float8_e4m3fn, device="meta")
    w = torch.empty((384, 256), dtype=torch.float8_e4m3fn, device="meta")
    sx = torch.empty((6, 2), device="meta")
    sw = torch.empty((3, 2), device="meta")
    y = ops.scaled_mm_fp8(x, w, sx, sw)
    assert y.shape == (2, 3, 384) and y.dtype == torch.bfloat16 and y.device.type == "meta"
    q, s = ops.scaled_mm_fp8_quant(x, w, sx, sw, "block")
    assert (q.shape, q.dtype, s.shape) == ((2, 3, 384), torch.float8_e4m3fn, (2, 3, 1))
    with pytest.raises(SignatureError):
        ops.scaled_mm_fp8(x, w, sx[:, :1], sw)


def test_torch_compile_keeps_the_op_and_its_result():
    sig, args = _inputs(INT8, m=9)

    def f(x, w, sx, sw):
        return ops.scaled_mm_int8(x, w, sx, sw) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(*args), f(*args))


def test_selection_falls_back_to_the_heuristic_where_int_mm_refuses(monkeypatch):
    from tunedb.runtime import selector
    from tunedb.runtime.selector import Resolution

    sig = INT8.make_signature("scaled_mm", 64, 64, "bf16")
    profile = selector.shipped_profile("sm90")
    monkeypatch.setattr(selector, "resolve", lambda fam, s, m: Resolution(Config.sentinel("torch"), "user"))
    monkeypatch.setattr(selector, "current_arch", lambda: ("sm90", profile))
    assert ops.chosen("scaled_mm", sig, 16).id == "heuristic"
    assert ops.chosen("scaled_mm", sig, 17).id == "torch"
    monkeypatch.setattr(selector, "resolve", lambda fam, s, m: Resolution(Config.sentinel("heuristic"), "default"))
    assert ops.chosen("scaled_mm", sig, 4096).id == "heuristic"


def test_default_tier_resolves_to_the_heuristic_sentinel():
    from tunedb.runtime import selector

    # a width no shipped table measured (the sm90 tables cover the Llama-3-8B widths)
    sig = FP8.make_signature("scaled_mm", 3072, 2048, "bf16", "row")
    res = selector.resolve("scaled_mm_fp8", sig, 1)
    # the sentinel, resolved per call's M by the op (a concrete tile would be one tile for all M)
    assert (res.config.id, res.tier) == ("heuristic", "default") and res.config.is_sentinel
    assert ops.chosen("scaled_mm_fp8", sig, 1).id == "heuristic"
    profile = selector.shipped_profile("sm90")
    # row-wise: the sentinel's rule names the vendor op at every M (configs.vendor_heuristic)
    assert FP8.heuristic(sig, 1, profile).id == FP8.heuristic(sig, 4096, profile).id == "torch"
    block = FP8.make_signature("scaled_mm", 3072, 2048, "bf16", "block")  # no vendor arm: a tile per M
    assert FP8.heuristic(block, 1, profile).id != FP8.heuristic(block, 4096, profile).id
    assert isinstance(selector.shipped_profile("sm90"), ArchProfile)


def test_launch_writes_into_out_and_make_out_fits_every_arm():
    from tunedb.families import contract

    for fam, scale, op, out in ((INT8, "row", "scaled_mm", "fp16"), (FP8, "row", "scaled_mm_quant", "fp8"),
                                (INT8, "row", "scaled_mm_quant", "int8")):
        sig, args = _inputs(fam, scale, m=20, n=48, k=160, op=op, out=out)
        ref = fam.reference(sig, *args)
        made = contract.hook(fam, "make_out")(sig, args, {}, ref)
        assert made.dtype == arms.torch_dtype(out) and made.shape == (20, 48)
        fam.launch(fam.parse_config("torch"), sig, *args, out=made)
        want = ops._cpu(sig, *args)
        if op == "scaled_mm":
            assert torch.equal(made, want)
        elif fam is INT8:
            pair = (torch.empty((20, 48), dtype=torch.int8), torch.empty((20, 1)))
            assert fam.launch(fam.parse_config("torch"), sig, *args, out=pair) is pair
            assert torch.equal(made, want[0]) and torch.equal(pair[0], want[0]) and torch.equal(pair[1], want[1])
    from tunedb.families.scaled_mm.launch import quant_out

    with pytest.raises(ValueError, match="a q tensor or a \\(q, s\\) pair"):
        quant_out(3, torch.empty(2, 4), 5, torch.int8)
    with pytest.raises(ValueError, match="out q must be a contiguous torch.int8"):
        quant_out(torch.empty(10), torch.empty(2, 4), 5, torch.int8)


def test_the_exact_gate_accepts_every_int8_arm_and_fails_one_flipped_bit():
    from tunedb.measure.gate import judge

    for op, out in (("scaled_mm", "bf16"), ("scaled_mm_quant", "int8")):
        sig, args = _inputs(INT8, m=24, op=op, out=out)
        ref = INT8.reference(sig, *args)
        assert INT8.verify(sig).kind == "exact"
        y = INT8.launch(INT8.parse_config("torch"), sig, *args)
        y = y[0] if op == "scaled_mm_quant" else y
        assert judge(y, ref, 0.0, kind="exact").status.ok
        flipped = y.clone()
        flipped.view(torch.int8 if out == "int8" else torch.int16).view(-1)[7] ^= 1
        bad = judge(flipped, ref, 0.0, kind="exact")
        assert not bad.status.ok and "1 of" in bad.detail
