"""Census rules of the quantized families (families.contract.CensusRule): which dispatched aten
calls become which signatures. Duck-typed on .shape / .dtype / .numel(): works on meta tensors.

- ``aten::_scaled_mm(a [M, K], b [K, N], scale_a, scale_b, bias, scale_result, out_dtype, ...)``
  with float8_e4m3fn operands and a bf16 output: scaled_mm_fp8|op=scaled_mm, the scale mode
  from the scales (one value each: tensor; [M, 1] and [1, N]: row; scale_a [M, ceil(K/128)]:
  block). Other outputs (fp8 with a static scale_result, fp16, fp32) are not served: no key.
- ``aten::_int_mm(a [M, K], b [K, N])``: scaled_mm|op=scaled_mm|dt=int8 with out=bf16. The
  epilogue that scales the int32 product is separate ops the call does not show; bf16 is the
  output quantized models use (torchao's int8 dynamic-activation path), and a census only needs
  the key the tuned op would be called with.
Quantized weights are often buffers, not Parameters, so no rule asks whether an operand is a
weight: a product of two 8-bit operands is a quantized linear layer. The families' own ops
(tunedb::scaled_mm_*) are not aten ops; the recorder keys only aten packets.
"""
from __future__ import annotations

from typing import Any

from tunedb.families.scaled_mm.configs import FP8_FAMILY, INT8_FAMILY, SCALE_BLOCK
from tunedb.families.contract import CensusRule
from tunedb.families.scaled_mm.keys import make_signature
from tunedb.records import Signature

Key = tuple[Signature, int]


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def scaled_mm_key(args: tuple, kwargs: dict) -> Key | None:
    a, b = args[0], args[1]
    scale_a, scale_b = _arg(args, kwargs, 2, "scale_a"), _arg(args, kwargs, 3, "scale_b")
    out_dtype = _arg(args, kwargs, 6, "out_dtype")
    if str(a.dtype) != "torch.float8_e4m3fn" or str(b.dtype) != "torch.float8_e4m3fn":
        return None
    if str(out_dtype) != "torch.bfloat16" or scale_a is None or scale_b is None or len(a.shape) != 2:
        return None
    m, k = (int(d) for d in a.shape)
    n = int(b.shape[1])
    if scale_b.numel() == 1 and scale_a.numel() == 1:
        scale = "tensor"
    elif tuple(scale_b.shape) == (1, n) and tuple(scale_a.shape) == (m, 1):
        scale = "row"
    elif tuple(scale_a.shape) == (m, -(-k // SCALE_BLOCK)):
        scale = "block"
    else:
        return None
    if m < 1:
        return None
    return make_signature(FP8_FAMILY, "scaled_mm", n, k, "bf16", scale), m


def int_mm_key(args: tuple, kwargs: dict) -> Key | None:
    a, b = args[0], args[1]
    if str(a.dtype) != "torch.int8" or str(b.dtype) != "torch.int8" or len(a.shape) != 2:
        return None
    m, k = (int(d) for d in a.shape)
    if m < 1:
        return None
    return make_signature(INT8_FAMILY, "scaled_mm", int(b.shape[1]), k, "bf16"), m


def _scaled_mm_record(recorder: Any, packet: Any, args: tuple, kwargs: dict) -> list[Key]:
    key = scaled_mm_key(args, kwargs)
    return [key] if key is not None else []


def _int_mm_record(recorder: Any, packet: Any, args: tuple, kwargs: dict) -> list[Key]:
    key = int_mm_key(args, kwargs)
    return [key] if key is not None else []


def rules(family: str) -> tuple[CensusRule, ...]:
    if family == INT8_FAMILY:
        return (CensusRule(("_int_mm",), _int_mm_record),)
    return (CensusRule(("_scaled_mm",), _scaled_mm_record),)
