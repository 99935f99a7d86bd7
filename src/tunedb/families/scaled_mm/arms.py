"""The quantized GEMM's torch side: the vendor arms (torch._int_mm + a scale epilogue,
torch._scaled_mm), the row quantizer in torch (the `_quant` op's epilogue, same bits as the
Triton one), the fp32/fp64 reference on dequantized operands, and random quantized inputs.
Imports torch lazily (an inherently torch module, imported by the family only when launching).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from tunedb.families.scaled_mm.configs import INT8_FAMILY, SCALE_BLOCK, torch_reason
from tunedb.records import Signature

QMAX = {"int8": 127.0, "fp8": 448.0}


def torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8,
            "fp8": torch.float8_e4m3fn, "fp32": torch.float32}[name]


def quantize_rows(y32: Any, out: str) -> tuple[Any, Any]:
    """(q [M, N], s [M, 1]) with y32 ~ q * s: s = amax(|row|) / QMAX, q = round(y32 / s)
    clamped to the type's range. Tensor-by-tensor IEEE division (torch's scalar / tensor is a
    reciprocal times the scalar, which the Triton kernel would not reproduce)."""
    import torch

    qmax = QMAX[out]
    amax = y32.abs().amax(dim=1).clamp_min(1e-12)
    inv = torch.full_like(amax, qmax).div_(amax)
    v = y32 * inv[:, None]
    if out == "int8":
        v = v.round()  # half to even, as the kernel
    q = v.clamp_(-qmax, qmax).to(torch_dtype(out))
    return q, (amax * (1.0 / qmax)).unsqueeze(1)


def flat_scales(sig: Signature, x_scale: Any, w_scale: Any) -> tuple[Any, Any]:
    """Contiguous fp32 scales as the kernels read them: [1] / [M] / [M, KB] and [1] / [N] / [NB, KB]."""
    if sig.get("scale", "row") == "block":
        return x_scale.contiguous(), w_scale.contiguous()
    return x_scale.reshape(-1).contiguous(), w_scale.reshape(-1).contiguous()


def torch_arm(sig: Signature) -> Callable[..., Any]:
    """`run(x, weight, x_scale, w_scale, out)`: the framework's own kernels. int8: torch._int_mm
    (int32 out), then (acc * x_scale) * w_scale in fp32 and one rounding, as the Triton
    epilogue; fp8: torch._scaled_mm with its per-tensor or row-wise scales (fast accumulation
    off: the Triton lanes accumulate fully too). The `_quant` op quantizes the fp32 product
    (int8, fp8 per-tensor) or the bf16 one (fp8 row-wise: cuBLASLt's row-wise scaling writes
    bf16 only) per row after."""
    import torch

    why = torch_reason(sig, None)
    if why:
        raise ValueError(f"the torch arm cannot serve {sig.format()!r}: {why}")
    n, k, out_name = sig.get("N"), sig.get("K"), sig.get("out")
    quant = sig.op == "scaled_mm_quant"
    out_dt = torch_dtype("fp32" if quant else out_name)
    if sig.family == INT8_FAMILY:
        def product(x2, w, sx, sw):
            y = torch._int_mm(x2, w.t()).to(torch.float32)
            return y.mul_(sx.reshape(-1, 1)).mul_(sw.reshape(1, -1))
    else:
        row = sig.get("scale") == "row"
        mm_dt = torch.bfloat16 if row else out_dt

        def product(x2, w, sx, sw):
            if row:
                return torch._scaled_mm(x2, w.t(), sx.reshape(-1, 1), sw.reshape(1, -1), out_dtype=mm_dt)
            return torch._scaled_mm(x2, w.t(), sx.reshape(()), sw.reshape(()), out_dtype=mm_dt)

    def run(x, weight, x_scale, w_scale, out=None):
        from tunedb.families.scaled_mm.launch import quant_out

        x2 = x.reshape(-1, k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()  # both vendor ops want a row-major activation
        y = product(x2, weight, x_scale, w_scale)
        if quant:
            q, s = quantize_rows(y.float(), out_name)
            if out is None:
                return q.view(*x.shape[:-1], n), s.view(*x.shape[:-1], 1)
            q_out, s_out = quant_out(out, x, n, q.dtype)
            q_out.view(-1, n).copy_(q)
            s_out.view(-1, 1).copy_(s)
            return out if isinstance(out, (tuple, list)) else (q_out, s_out)
        if y.dtype != out_dt:
            y = y.to(out_dt)
        if out is not None:
            out.view(-1, n).copy_(y)
            return out
        return y.view(*x.shape[:-1], n)

    return run


def dequantize(sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any, dtype: Any) -> tuple[Any, Any]:
    """The operands as `dtype` values: q * scale, broadcast per the scale mode."""
    k = sig.get("K")
    x2 = x.reshape(-1, k).to(dtype)
    w = weight.to(dtype)
    if sig.get("scale", "row") == "block":
        sx = x_scale.to(dtype).repeat_interleave(SCALE_BLOCK, dim=1)[:, :k]
        sw = w_scale.to(dtype).repeat_interleave(SCALE_BLOCK, dim=0).repeat_interleave(SCALE_BLOCK, dim=1)
        return x2 * sx, w * sw[: w.shape[0], :k]
    if sig.get("scale", "row") == "tensor":
        return x2 * x_scale.to(dtype).reshape(()), w * w_scale.to(dtype).reshape(())
    return x2 * x_scale.to(dtype).reshape(-1, 1), w * w_scale.to(dtype).reshape(-1, 1)


def product(sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any, dtype: Any = None) -> Any:
    """The unquantized product [..., N] of the dequantized operands, in fp32 (or `dtype`)."""
    import torch

    dtype = dtype or torch.float32
    xd, wd = dequantize(sig, x, weight, x_scale, w_scale, dtype)
    return (xd @ wd.t()).view(*x.shape[:-1], sig.get("N"))


def exact_int8(sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any) -> Any:
    """The int8 arms' fp32 epilogue value [M, N]: the integer product (exact in fp64, |acc| < 2^53,
    and rounded to fp32 as an int32 accumulator converts), times x_scale, times w_scale."""
    import torch

    acc = (x.reshape(-1, sig.get("K")).to(torch.float64) @ weight.to(torch.float64).t()).to(torch.float32)
    return acc.mul_(x_scale.reshape(-1, 1)).mul_(w_scale.reshape(1, -1))


def reference(sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any, dtype: Any = None) -> Any:
    """What the numerical gate compares an arm's output with (`out` of launch: y, or q for _quant).

    fp8 (verify: tolerance): the product of the dequantized operands in fp32 (`dtype`: e.g.
    fp64); for _quant, that product's row quantization (q, as fp32 values). int8 (verify: exact):
    the bits every arm computes, the exact product scaled in the epilogue's order and rounded
    once (q for _quant); with `dtype` given, the dequantized product in that dtype instead."""
    shape = (*x.shape[:-1], sig.get("N"))
    if sig.dt == "int8" and dtype is None:
        y = exact_int8(sig, x, weight, x_scale, w_scale)
        if sig.op == "scaled_mm_quant":
            return quantize_rows(y, "int8")[0].view(shape)
        return y.to(torch_dtype(sig.get("out"))).view(shape)
    y = product(sig, x, weight, x_scale, w_scale, dtype)
    if sig.op == "scaled_mm_quant":
        return quantize_rows(y.reshape(-1, sig.get("N")).float(), sig.get("out"))[0].float().view(shape)
    return y


def quantize_like(t32: Any, dt: str, scale: str, per: str) -> tuple[Any, Any]:
    """(q, scale) of an fp32 matrix in the family's layout: per="act" (rows are tokens) or
    "weight" (rows are output channels). tensor: [1]; row: [rows, 1]; block: [rows, KB] for an
    activation, [ceil(rows/128), KB] for a weight."""
    import torch

    qmax = QMAX[dt]
    rows, k = t32.shape
    if scale == "tensor":
        s = (t32.abs().amax() / qmax).clamp_min(1e-12).reshape(1)
        full = s.expand(rows, k)
    elif scale == "row":
        s = (t32.abs().amax(dim=1, keepdim=True) / qmax).clamp_min(1e-12)
        full = s.expand(rows, k)
    else:
        kb = math.ceil(k / SCALE_BLOCK)
        pad_k = kb * SCALE_BLOCK - k
        padded = torch.nn.functional.pad(t32, (0, pad_k))
        if per == "act":
            s = (padded.view(rows, kb, SCALE_BLOCK).abs().amax(dim=2) / qmax).clamp_min(1e-12)
            full = s.repeat_interleave(SCALE_BLOCK, dim=1)[:, :k]
        else:
            nb = math.ceil(rows / SCALE_BLOCK)
            padded = torch.nn.functional.pad(padded, (0, 0, 0, nb * SCALE_BLOCK - rows))
            blocks = padded.view(nb, SCALE_BLOCK, kb, SCALE_BLOCK).abs().amax(dim=(1, 3))
            s = (blocks / qmax).clamp_min(1e-12)
            full = s.repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)[:rows, :k]
    v = (t32 / full).clamp(-qmax, qmax)
    if dt == "int8":
        v = v.round()
    return v.to(torch_dtype(dt)).contiguous(), s.contiguous()


def make_inputs(sig: Signature, m: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """((x [M, K], weight [N, K], x_scale, w_scale), {}): normal data quantized per the scale
    mode (never all zeros), outputs of order one."""
    import torch

    n, k = sig.get("N"), sig.get("K")
    scale = sig.get("scale", "row")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    x32 = torch.randn((m, k), generator=gen, device=device)
    w32 = torch.randn((n, k), generator=gen, device=device) * k ** -0.5
    x, sx = quantize_like(x32, sig.dt, scale, "act")
    w, sw = quantize_like(w32, sig.dt, scale, "weight")
    return (x, w, sx, sw), {}
