"""Quantized-GEMM signatures: the static key of a call (from tensors or meta tensors), its work,
and the scale-layout rules every entry point checks.

    scaled_mm|op=scaled_mm|dt=int8|N=4096|K=4096|out=bf16
    scaled_mm|op=scaled_mm_quant|dt=int8|N=4096|K=4096|out=int8
    scaled_mm_fp8|op=scaled_mm|dt=fp8|N=4096|K=4096|scale=row|out=bf16
    scaled_mm_fp8|op=scaled_mm_quant|dt=fp8|N=4096|K=4096|scale=block|out=fp8

The size axis is M (rows of x). Duck-typed on `.shape` / `.dtype`: no torch import.
"""
from __future__ import annotations

import math
from typing import Any

from tunedb.errors import SignatureError
from tunedb.families.key_rules import check_one_device, check_tensors, size
from tunedb.families.scaled_mm.configs import (FP8_FAMILY, INT8_FAMILY, OPS, OUTS, SCALE_BLOCK, SCALES,
                                               sig_reason)
from tunedb.records import Signature

_OPERAND = {"torch.int8": "int8", "torch.float8_e4m3fn": "fp8"}
_OUT_OF_TORCH = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.int8": "int8",
                 "torch.float8_e4m3fn": "fp8"}
OUT_BYTES = {"bf16": 2, "fp16": 2, "int8": 1, "fp8": 1}


def family_of_dt(dt: str) -> str:
    return INT8_FAMILY if dt == "int8" else FP8_FAMILY


def make_signature(family: str, op: str, n: int, k: int, out: str, scale: str = "row") -> Signature:
    if family not in (INT8_FAMILY, FP8_FAMILY):
        raise SignatureError(f"unknown quantized family {family!r}; use {INT8_FAMILY} or {FP8_FAMILY}")
    if family == INT8_FAMILY:
        if scale != "row":
            raise SignatureError(f"int8 scaled_mm takes scale='row' only (per token x per channel), got {scale!r}")
        sig = Signature.make(family, op, "int8", N=n, K=k, out=out)
    else:
        sig = Signature.make(family, op, "fp8", N=n, K=k, scale=scale, out=out)
    why = sig_reason(sig)
    if why:
        raise SignatureError(f"bad signature {sig.format()!r}: {why}")
    return sig


def operand_dt(dtype: Any) -> str:
    dt = _OPERAND.get(str(dtype))
    if dt is None:
        raise SignatureError(f"quantized GEMM operands must be torch.int8 or torch.float8_e4m3fn, got {dtype}")
    return dt


def out_name(dtype: Any, family: str | None = None, op: str | None = None) -> str:
    """The key's out name of a torch dtype. With the family and op, an unserved dtype's error
    lists what that op allows (the whole table named int8 / fp8 as choices for a GEMM output)."""
    name = _OUT_OF_TORCH.get(str(dtype))
    if name is None:
        names = {v: k for k, v in _OUT_OF_TORCH.items()}
        allowed = [names[o] for o in OUTS[(family, op)]] if (family, op) in OUTS else list(_OUT_OF_TORCH)
        what = f"{family} op={op}" if (family, op) in OUTS else "the quantized GEMMs"
        raise SignatureError(f"output dtype {dtype} is not served by {what}; use one of {', '.join(allowed)}")
    return name


def scale_shapes(scale: str, m: int, n: int, k: int) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """The accepted shapes of (x_scale, w_scale) for a scale mode (fp32 always)."""
    if scale == "tensor":
        return ((), (1,), (1, 1)), ((), (1,), (1, 1))
    if scale == "row":
        # [1, N]: the weight scale as torch._scaled_mm's scale_b takes it (vLLM's w_scale.t())
        return ((m,), (m, 1)), ((n,), (n, 1), (1, n))
    kb, nb = -(-k // SCALE_BLOCK), -(-n // SCALE_BLOCK)
    return ((m, kb),), ((nb, kb),)


def infer_scale(w_scale: Any, n: int, k: int, x_scale: Any = None) -> str:
    """The fp8 scale mode a call's weight scale implies (the weight's, not the activation's:
    it does not depend on M, so M=1 is not ambiguous): one value (tensor), one per output
    channel (row) or one per 128x128 block (block). One exception: at N, K <= 128 a block
    weight scale is [1, 1] too, and then an activation scale of more than one value (which a
    per-tensor call cannot have) says block."""
    shape = tuple(w_scale.shape)
    block = (-(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK))
    xs = tuple(x_scale.shape) if x_scale is not None else None
    # a 0-d scale is only ever per tensor; [1] / [1, 1] are per tensor too unless N = 1, where they
    # are per channel (the same numbers either way): then the activation's scale tells (one
    # value: per tensor)
    one = math.prod(shape) == 1 and len(shape) <= 2
    if shape == () or (one and (n > 1 or (xs is not None and math.prod(xs) == 1 and len(xs) <= 2))):
        # a block scale is [1, 1] too at N, K <= 128: an activation scale [M, KB] of other than one
        # value (M > 1, or no row at all) is a per-tensor call's never
        if shape == block and xs is not None and len(xs) == 2 and xs[1] == block[1] and math.prod(xs) != 1:
            return "block"
        return "tensor"
    if shape == block == (1, n) and xs is not None and len(xs) == 2 and xs[1] == block[1] > 1:
        # [1, N] is a row-wise weight scale and, at N <= 128 with N = ceil(K/128), a block one:
        # the activation's [M, ceil(K/128)] (a row-wise call's is [M] or [M, 1]) says block
        return "block"
    if shape in ((n,), (n, 1), (1, n)):
        return "row"
    if shape == (-(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK)):
        return "block"
    raise SignatureError(f"cannot tell the scale mode from w_scale of shape {list(shape)} (N={n}, K={k}): "
                         f"use [] (tensor), [N], [N, 1] or [1, N] (row) or [ceil(N/128), ceil(K/128)] (block)")


def check_scales(sig: Signature, m: int, x_scale: Any, w_scale: Any) -> None:
    """SignatureError naming the bad scale, its shape/dtype and what the mode allows."""
    scale = sig.get("scale", "row")
    xs_ok, ws_ok = scale_shapes(scale, m, sig.get("N"), sig.get("K"))
    for name, t, ok in (("x_scale", x_scale, xs_ok), ("w_scale", w_scale, ws_ok)):
        if t is None:
            raise SignatureError(f"{sig.family} {name} is missing (scale={scale})")
        if str(t.dtype) != "torch.float32":
            raise SignatureError(f"{name} must be torch.float32, got {t.dtype}")
        if tuple(t.shape) not in ok:
            raise SignatureError(f"{name} has shape {list(t.shape)} but scale={scale} at M={m}, "
                                 f"N={sig.get('N')}, K={sig.get('K')} needs one of {[list(s) for s in ok]}")


def signature_of(op: str, x: Any, weight: Any, x_scale: Any, w_scale: Any, out_dtype: Any,
                 scale: str | None = None) -> tuple[Signature, int]:
    """(Signature, M) of y = (x @ weight.T) scaled; x [..., K], weight [N, K] (int8 or fp8)."""
    if op not in OPS:
        raise SignatureError(f"unknown quantized GEMM op {op!r}; ops are {', '.join(OPS)}")
    for name, t in (("x", x), ("weight", weight), ("x_scale", x_scale), ("w_scale", w_scale)):
        if getattr(t, "shape", None) is None:  # None or a number: named (duck-typed: anything with a shape is read)
            check_tensors("scaled_mm", **{name: t})
    check_one_device("scaled_mm", x=x, weight=weight, x_scale=x_scale, w_scale=w_scale)
    xs, wsh = tuple(x.shape), tuple(weight.shape)
    if len(xs) < 1 or len(wsh) != 2:
        raise SignatureError(f"scaled_mm needs x [..., K] and weight [N, K]; got x {list(xs)}, weight {list(wsh)}")
    n, k = wsh
    if xs[-1] != k:
        raise SignatureError(f"scaled_mm x has K={xs[-1]} but weight [N, K] has K={k}")
    dt = operand_dt(x.dtype)
    if operand_dt(weight.dtype) != dt:
        raise SignatureError(f"scaled_mm x is {x.dtype} but weight is {weight.dtype}; they must match")
    m = size(math.prod(xs[:-1]))
    family = family_of_dt(dt)
    if family == INT8_FAMILY:
        scale = "row"
    elif scale is None:
        scale = infer_scale(w_scale, int(n), int(k), x_scale)
    if scale not in SCALES[family]:
        raise SignatureError(f"scale={scale!r} not allowed; {family} takes {', '.join(SCALES[family])}")
    out = out_name(out_dtype, family, op)
    sig = make_signature(family, op, int(n), int(k), out, scale)
    check_scales(sig, m, x_scale, w_scale)
    return sig, m


def work(sig: Signature, m: int) -> tuple[float, float]:
    """(2*M*N*K flops, bytes of x + W (one byte each) + scales + y (+ the row scales of a quant))."""
    n, k = sig.get("N"), sig.get("K")
    scale = sig.get("scale", "row")
    xs, ws = scale_shapes(scale, m, n, k)
    scales = (math.prod(xs[0]) + math.prod(ws[0])) * 4
    moved = m * k + n * k + scales + m * n * OUT_BYTES[sig.get("out")]
    if sig.op == "scaled_mm_quant":
        moved += m * 4
    return 2.0 * m * n * k, float(moved)
