"""Census rules of the quantized families: which dispatched calls become which signatures.

A rule names an operator (its qualified name, as ``func.overloadpacket._qualified_op_name``
gives it inside a TorchDispatchMode) and turns one call's (args, kwargs) into (Signature, M),
or None when the call is not one the families serve. Duck-typed on .shape / .dtype / .numel():
works on meta tensors, imports no torch.

- ``aten::_scaled_mm(a [M, K], b [K, N], scale_a, scale_b, bias, scale_result, out_dtype, ...)``
  with float8_e4m3fn operands and a bf16 output: scaled_mm_fp8|op=scaled_mm, the scale mode
  from scale_b (one value: tensor; [1, N]: row) or scale_a ([M, ceil(K/128)]: block). Other
  outputs (fp8 with a static scale_result, fp16, fp32) are not served: None.
- ``aten::_int_mm(a [M, K], b [K, N])``: scaled_mm|op=scaled_mm|dt=int8 with out=bf16. The
  epilogue that scales the int32 product is separate ops the call does not show; bf16 is the
  output quantized models use (torchao's int8 dynamic-activation path), and a census only needs
  the key the tuned op would be called with.
- the families' own ops (``tunedb::scaled_mm_int8``, ``_fp8``, and the ``_quant`` forms): their
  signature as the op computes it.
Quantized weights are often buffers, not Parameters, so no rule asks whether an operand is a
weight: a product of two 8-bit operands is a quantized linear layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tunedb.families.scaled_mm.configs import FP8_FAMILY, INT8_FAMILY, SCALE_BLOCK
from tunedb.families.scaled_mm.keys import make_signature, signature_of
from tunedb.errors import SignatureError
from tunedb.records import Signature

Key = tuple[Signature, int]


@dataclass(frozen=True)
class CensusRule:
    """Calls of operator `op` (qualified name) become `key(args, kwargs)` of family `family`."""

    op: str
    family: str
    key: Callable[[tuple, dict], "Key | None"]


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


def _own(op: str, out_index: int | None, scale_index: int | None) -> Callable[[tuple, dict], Key | None]:
    def key(args: tuple, kwargs: dict) -> Key | None:
        x, w, sx, sw = args[:4]
        scale = _arg(args, kwargs, scale_index, "scale", "") if scale_index is not None else ""
        out = _arg(args, kwargs, out_index, "out_dtype") if out_index is not None else None
        if op == "scaled_mm_quant":
            out = "torch.int8" if str(x.dtype) == "torch.int8" else "torch.float8_e4m3fn"
        try:
            return signature_of(op, x, w, sx, sw, out or "torch.bfloat16", scale or None)
        except SignatureError:
            return None

    return key


def rules() -> tuple[CensusRule, ...]:
    return (
        CensusRule("aten::_scaled_mm", FP8_FAMILY, scaled_mm_key),
        CensusRule("aten::_int_mm", INT8_FAMILY, int_mm_key),
        CensusRule("tunedb::scaled_mm_int8", INT8_FAMILY, _own("scaled_mm", 4, None)),
        CensusRule("tunedb::scaled_mm_int8_quant", INT8_FAMILY, _own("scaled_mm_quant", None, None)),
        CensusRule("tunedb::scaled_mm_fp8", FP8_FAMILY, _own("scaled_mm", 5, 4)),
        CensusRule("tunedb::scaled_mm_fp8_quant", FP8_FAMILY, _own("scaled_mm_quant", None, 4)),
    )
