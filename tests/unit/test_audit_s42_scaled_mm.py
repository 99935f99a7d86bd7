"""Audit (session 42) of the quantized GEMM families on the CPU: the public ops over odd shapes,
layouts and dtypes against exact / fp32 references, clear errors, shape inference, compile; the
census CLI's --quantization flag; optimize() of torchao-quantized models (skipped without torchao)
returning what torchao's own path returns for activation dtypes the op does not serve."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.scaled_mm import ops

GEN = torch.Generator().manual_seed(42)


def _i8(*shape):
    return torch.randint(-128, 128, shape, generator=GEN, dtype=torch.int8)


def _f8(*shape):
    return (torch.randn(*shape, generator=GEN) * 4).to(torch.float8_e4m3fn)


def _scale(*shape):
    return torch.rand(*shape, generator=GEN) + 0.01


def _exact_int8(x, w, sx, sw):
    """The documented epilogue: the exact integer product, * x_scale[row], * w_scale[col], in fp32."""
    acc = x.reshape(-1, x.shape[-1]).to(torch.int64) @ w.to(torch.int64).t()
    return (acc.to(torch.float32) * sx.reshape(-1, 1)) * sw.reshape(1, -1)


@pytest.mark.parametrize("m, n, k", [(1, 17, 33), (5, 48, 160), (16, 130, 200), (3, 1, 1)])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16])
def test_int8_is_the_exact_product_scaled_in_order_rounded_once(m, n, k, out):
    x, w, sx, sw = _i8(m, k), _i8(n, k), _scale(m), _scale(n)
    y = ops.scaled_mm_int8(x, w, sx, sw, out)
    assert y.dtype == out and y.shape == (m, n)
    assert torch.equal(y, _exact_int8(x, w, sx, sw).to(out))


def test_int8_transposed_operands_strided_scales_and_3d_activations():
    x, w = _i8(40, 7).t(), _i8(40, 24).t()  # both non-contiguous views
    sx, sw = _scale(14)[::2], _scale(24, 1)
    assert not x.is_contiguous() and not w.is_contiguous() and not sx.is_contiguous()
    assert torch.equal(ops.scaled_mm_int8(x, w, sx, sw), _exact_int8(x, w, sx, sw).bfloat16())
    x3, s3 = _i8(2, 3, 24), _scale(2, 3, 1)  # the `_quant` ops' [..., 1] scale layout
    w3, sw3 = _i8(17, 24), _scale(1, 17)     # torch._scaled_mm's [1, N]
    y = ops.scaled_mm_int8(x3, w3, s3, sw3)
    assert y.shape == (2, 3, 17)
    assert torch.equal(y.reshape(6, 17), _exact_int8(x3, w3, s3, sw3).bfloat16())


@pytest.mark.parametrize("scale", ["tensor", "row", "block"])
@pytest.mark.parametrize("m, n, k", [(1, 17, 33), (7, 130, 200), (4, 256, 384)])
def test_fp8_is_the_fp32_product_of_the_dequantized_operands(scale, m, n, k):
    x, w = _f8(m, k), _f8(n, k)
    kb, nb = -(-k // 128), -(-n // 128)
    sx, sw = {"tensor": (_scale(()), _scale(1)), "row": (_scale(m, 1), _scale(n)),
              "block": (_scale(m, kb), _scale(nb, kb))}[scale]
    if scale == "block":
        xd = x.float() * sx.repeat_interleave(128, 1)[:, :k]
        wd = w.float() * sw.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    else:
        xd, wd = x.float() * sx.reshape(-1, 1), w.float() * sw.reshape(-1, 1)
    ref = xd @ wd.t()
    y = ops.scaled_mm_fp8(x, w, sx, sw, scale)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    tol = (ref.bfloat16().float() - ref).abs().max() + 1e-5 * ref.abs().max()
    assert (y.float() - ref).abs().max() <= tol
    if scale != "tensor" or n > 1:  # the mode inferred from w_scale is the same call
        assert torch.equal(ops.scaled_mm_fp8(x, w, sx, sw), y)


def test_fp8_matches_torch_scaled_mm_on_the_cpu():
    """What the user gets without tunedb: torch._scaled_mm (per-tensor and row-wise)."""
    x, w, sx, sw = _f8(9, 64), _f8(48, 64), _scale(9, 1), _scale(48, 1)
    try:
        ref = torch._scaled_mm(x, w.t(), sx, sw.t(), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        pytest.skip("this torch has no CPU torch._scaled_mm")
    assert torch.equal(ops.scaled_mm_fp8(x, w, sx, sw), ref)
    a, b = torch.tensor(0.3), torch.tensor(0.7)
    assert torch.equal(ops.scaled_mm_fp8(x, w, a, b), torch._scaled_mm(x, w.t(), a, b, out_dtype=torch.bfloat16))


def test_empty_batches_give_empty_outputs_of_every_op():
    assert ops.scaled_mm_int8(_i8(0, 32), _i8(16, 32), _scale(0), _scale(16)).shape == (0, 16)
    assert ops.scaled_mm_int8(_i8(2, 0, 32), _i8(16, 32), _scale(2, 0, 1), _scale(16)).shape == (2, 0, 16)
    assert ops.scaled_mm_fp8(_f8(0, 200), _f8(130, 200), _scale(0, 2), _scale(2, 2)).shape == (0, 130)
    assert ops.scaled_mm_fp8(_f8(0, 64), _f8(32, 64), _scale(1), _scale(1)).shape == (0, 32)
    q, s = ops.scaled_mm_int8_quant(_i8(0, 64), _i8(32, 64), _scale(0), _scale(32))
    assert (q.shape, q.dtype, s.shape) == ((0, 32), torch.int8, (0, 1))
    q, s = ops.scaled_mm_fp8_quant(_f8(0, 64), _f8(32, 64), _scale(0, 1), _scale(32))
    assert (q.shape, q.dtype, s.shape) == ((0, 32), torch.float8_e4m3fn, (0, 1))


def test_an_unserved_output_dtype_names_what_the_op_allows():
    """fp32 out used to list int8 and fp8 among the choices of a GEMM's output."""
    with pytest.raises(SignatureError, match=r"torch\.float32 is not served by scaled_mm op=scaled_mm; "
                                             r"use one of torch\.bfloat16, torch\.float16$"):
        ops.scaled_mm_int8(_i8(3, 32), _i8(16, 32), _scale(3), _scale(16), torch.float32)
    with pytest.raises(SignatureError, match=r"torch\.float32 is not served by scaled_mm_fp8 op=scaled_mm; "
                                             r"use one of torch\.bfloat16$"):
        ops.scaled_mm_fp8(_f8(3, 32), _f8(16, 32), _scale(3), _scale(16), out_dtype=torch.float32)


@pytest.mark.parametrize("call, match", [
    (lambda: ops.scaled_mm_int8(_i8(3, 32), _i8(16, 32), _scale(4), _scale(16)),
     r"x_scale has shape \[4\] but scale=row at M=3, N=16, K=32 needs one of \[\[3\], \[3, 1\]\]"),
    (lambda: ops.scaled_mm_int8(_i8(3, 32), _i8(16, 32), _scale(3).half(), _scale(16)),
     r"x_scale must be torch.float32, got torch.float16"),
    (lambda: ops.scaled_mm_fp8(_f8(3, 200), _f8(130, 200), _scale(3, 1), _scale(2, 2), "block"),
     r"x_scale has shape \[3, 1\] but scale=block .* needs one of \[\[3, 2\]\]"),
    (lambda: ops.scaled_mm_fp8(_f8(3, 32), _f8(16, 32), _scale(3), _scale(16), "rows"),
     r"scale='rows' not allowed; scaled_mm_fp8 takes tensor, row, block"),
    (lambda: ops.scaled_mm_fp8(_f8(3, 32), _f8(16, 32), _scale(3), _scale(5, 7)),
     r"cannot tell the scale mode from w_scale of shape \[5, 7\]"),
    (lambda: ops.scaled_mm_int8(_i8(3, 32), _i8(16, 32), _scale(3).to("meta"), _scale(16)),
     r"one device; got x on cpu, weight on cpu, x_scale on meta"),
    (lambda: ops.scaled_mm_int8(_i8(3, 32), _f8(16, 32), _scale(3), _scale(16)),
     r"x is torch.int8 but weight is torch.float8_e4m3fn"),
    (lambda: ops.scaled_mm_fp8(_f8(3, 32).to(torch.float8_e5m2), _f8(16, 32).to(torch.float8_e5m2),
                               _scale(3), _scale(16)),
     r"must be torch.int8 or torch.float8_e4m3fn, got torch.float8_e5m2"),
    (lambda: ops.scaled_mm_int8(_i8(3, 32), _i8(16, 31), _scale(3), _scale(16)),
     r"x has K=32 but weight \[N, K\] has K=31"),
])
def test_bad_inputs_name_the_value_and_what_is_allowed(call, match):
    with pytest.raises(SignatureError, match=match):
        call()


def test_meta_and_fake_tensors_infer_shapes_and_check_scales():
    from torch._subclasses.fake_tensor import FakeTensorMode

    y = ops.scaled_mm_fp8(_f8(2, 3, 200).to("meta"), _f8(130, 200).to("meta"),
                          _scale(2, 3, 2).to("meta"), _scale(2, 2).to("meta"))
    assert (y.device.type, y.shape, y.dtype) == ("meta", (2, 3, 130), torch.bfloat16)
    q, s = ops.scaled_mm_int8_quant(_i8(2, 5, 64).to("meta"), _i8(48, 64).to("meta"),
                                    _scale(2, 5, 1).to("meta"), _scale(48).to("meta"))
    assert (q.shape, q.dtype, s.shape) == ((2, 5, 48), torch.int8, (2, 5, 1))
    with FakeTensorMode():
        x, w = torch.empty(7, 40, dtype=torch.int8), torch.empty(24, 40, dtype=torch.int8)
        assert ops.scaled_mm_int8(x, w, torch.empty(7), torch.empty(24), torch.float16).dtype == torch.float16
        with pytest.raises(SignatureError, match="x_scale has shape"):
            ops.scaled_mm_int8(x, w, torch.empty(8), torch.empty(24))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_calls_equal_eager_over_dynamic_m(backend):
    torch._dynamo.reset()

    def f(x, w, sx, sw):
        return ops.scaled_mm_int8(x, w, sx, sw, torch.float16) * 2

    c = torch.compile(f, backend=backend, dynamic=True, fullgraph=True)
    w, sw = _i8(24, 40), _scale(24)
    for m in (0, 1, 17):
        x, sx = _i8(m, 40), _scale(m)
        assert torch.equal(c(x, w, sx, sw), f(x, w, sx, sw))

    def g(x, w, sx, sw):
        return ops.scaled_mm_fp8_quant(x, w, sx, sw, "block")

    cg = torch.compile(g, backend=backend, fullgraph=True)
    args = (_f8(3, 2, 200), _f8(130, 200), _scale(3, 2, 2), _scale(2, 2))
    (q, s), (q2, s2) = cg(*args), g(*args)
    assert torch.equal(q.float(), q2.float()) and torch.equal(s, s2) and q.shape == (3, 2, 130)


def test_requires_grad_inputs_give_the_same_values_and_a_gradient():
    x, w, sx, sw = _f8(5, 64), _f8(32, 64), _scale(5, 1), _scale(32, 1)
    with torch.no_grad():
        plain = ops.scaled_mm_fp8(x, w, sx, sw)
    sxg = sx.clone().requires_grad_()
    y = ops.scaled_mm_fp8(x, w, sxg, sw)
    assert torch.equal(y.detach(), plain)
    y.float().sum().backward()
    assert sxg.grad is not None and sxg.grad.shape == (5, 1) and sxg.grad.abs().sum() > 0


def test_census_cli_refuses_an_unknown_scheme_and_lists_the_schemes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "tunedb", "census", "llama-3.2-3b", "--quantization", "fp8",
                        "--out", str(tmp_path / "c.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "invalid choice: 'fp8' (choose from 'fp8-rowwise', 'fp8-block', 'int8')" in r.stderr
    assert not (tmp_path / "c.json").exists()


def test_optimize_leaves_a_model_without_torchao_weights_alone():
    import tunedb

    from audit_scaled_mm_models_s42 import TwoLinear

    model = TwoLinear().to(torch.bfloat16)
    out = tunedb.optimize(model, families=["scaled_mm", "scaled_mm_fp8"])
    assert type(out.up) is torch.nn.Linear and type(out.down) is torch.nn.Linear


# --- torchao (optional; CI has none) --------------------------------------------------------

@pytest.fixture
def torchao_quantized():
    pytest.importorskip("torchao")
    import tunedb
    from tunedb.families.scaled_mm import torchao_bridge as tb

    from audit_scaled_mm_models_s42 import TwoLinear

    def build(scheme, dtype=torch.bfloat16):
        torch.manual_seed(0)
        model = TwoLinear().to(dtype)
        tb.quantize_model(model, scheme, "cpu")
        reference = copy.deepcopy(model)  # torchao's own path
        return tunedb.optimize(model, families="all"), reference

    return build


@pytest.mark.parametrize("scheme, xdtype", [("fp8-rowwise", torch.float32), ("fp8-rowwise", torch.float16),
                                            ("int8", torch.float32)])
def test_an_activation_dtype_the_op_does_not_serve_runs_torchaos_path(torchao_quantized, scheme, xdtype):
    """Before: an fp32 / fp16 activation into an fp8 layer came back bf16 (torchao returns the
    activation's dtype), an fp32 one into an int8 layer raised SignatureError (torchao runs it)."""
    from tunedb.families.scaled_mm.patching import quantized_linear_class

    model, reference = torchao_quantized(scheme)
    assert isinstance(model.up, quantized_linear_class())
    x = torch.randn(2, 3, 256, dtype=xdtype)
    with torch.no_grad():
        y, ref = model(x), reference(x)
    assert y.dtype == ref.dtype == xdtype and torch.equal(y, ref)


def test_int8_fp16_activation_with_a_bf16_bias_returns_fp16(torchao_quantized):
    """The served path: y (fp16) + a bf16 bias promoted to fp32; torchao returns the activation's dtype."""
    model, reference = torchao_quantized("int8")
    x = torch.randn(4, 256, dtype=torch.float16)
    with torch.no_grad():
        y, ref = model(x), reference(x)
    assert y.dtype == ref.dtype == torch.float16
    assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 0.03


@pytest.mark.parametrize("scheme", ["fp8-rowwise", "int8"])
def test_served_bf16_layers_stay_close_to_torchaos_output(torchao_quantized, scheme):
    """bf16 activations run tunedb's op: close to torchao's output (the activation quantizer's
    scale is computed differently: see the audit report), same shape and dtype, odd M included."""
    model, reference = torchao_quantized(scheme)
    for shape in [(0, 256), (256,), (1, 256), (3, 5, 256)]:
        x = torch.randn(*shape, dtype=torch.bfloat16)
        with torch.no_grad():
            y = model(x)
            if not x.numel():  # torchao 0.18's int8 quantizer fails on an empty batch
                assert y.shape == (0, 128) and y.dtype == torch.bfloat16
                continue
            ref = reference(x)
        assert y.shape == ref.shape and y.dtype == ref.dtype
        # two layers, each activation quantized with a slightly different scale than torchao's
        assert ((y.float() - ref.float()).norm() / ref.float().norm()).item() < 0.06
