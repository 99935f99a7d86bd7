"""The GEMM family's census rules: which aten matrix products become which gemm signatures.

Recorded keys:
- mm/addmm with a weight-like second operand: ``gemm|op=gemm|dt=..|N=<out>|K=<in>``, M = rows;
  bmm/baddbmm with an expanded weight as second operand: op=gemm with M = batch * rows.
- aten._addmm_activation (a linear with its activation fused, e.g. torch's own fused paths): the one
  place the recorder sees an activation: ``gemm|op=gemm_act|dt=..|N=..|K=..|act=relu/gelu_tanh|bias=1``.
- every other product (attention scores, attention @ V, a stack of distinct weights) is not a
  GEMM key: the `bmm` family's rule records it (families/bmm/census.py), with the predicate
  `is_gemm_product` below deciding for both families, so each call has one owner.

A product of a weight stored [in, out], and in a census of the optimized model any product
outside a TunedLinear, is keyed ``gemm|op=unpatched|...|src=conv1d/call``: seen, never served
(see UNPATCHED below).

dt is ``half`` for fp16 and bf16 (one key serves both), ``fp32``, ``int8`` or ``fp8``. Whether an
operand is a weight is the recorder's to say (census/recorder.py). torch is imported lazily.
"""
from __future__ import annotations

from typing import Any

from tunedb.census import unpatched
from tunedb.families.contract import CensusRule
from tunedb.records import Signature


def dt_of(dtype: Any) -> str | None:
    import torch

    if dtype in (torch.float16, torch.bfloat16):
        return "half"
    if dtype == torch.float32:
        return "fp32"
    if dtype == torch.int8:
        return "int8"
    if "float8" in str(dtype):
        return "fp8"
    return None


def operands(packet: Any, args: tuple) -> tuple[Any, Any]:
    """(a, b) of a product packet: the bias-taking forms carry it first."""
    import torch

    aten = torch.ops.aten
    biased = packet in (aten.addmm, aten.baddbmm, aten._addmm_activation)
    return (args[1], args[2]) if biased else (args[0], args[1])


def is_gemm_product(recorder: Any, packet: Any, b: Any) -> bool:
    """Whether a product is this family's (a linear layer): its second operand is one weight
    shared by the batch (a Linear on 3-D input lowers to a bmm of an expanded weight). A stack
    of distinct weights (MoE experts) and a product of activations are not."""
    return bool(recorder.is_weight(b) and (b.dim() == 2 or b.shape[0] == 1 or b.stride(0) == 0))


# A product no TunedLinear makes, which therefore never reaches the GEMM family's ops: the key
# records that it was seen, and no family serves it, so a build measures nothing for it and the
# plan claims no gain (docs/unseen_shapes.md, "Seen, not patched"). src says why:
# - conv1d: the weight is stored [in, out] (transformers' Conv1D: GPT-2, GPT-J's ancestors); the
#   kernels read an [out, in] weight, and serving it would copy the weight on every call;
# - call: a product of an [out, in] weight outside an nn.Linear optimize() swaps (F.linear in a
#   forward, nn.MultiheadAttention's packed in-projection, a hooked or subclassed Linear).
#   Seen only where the census runs the optimized model (fused); an aten-level census cannot
#   tell these from nn.Linear calls and keys them as gemm points, as it always did.
UNPATCHED = unpatched.UNPATCHED


def _in_out(b: Any) -> bool:
    """Whether a weight operand is stored [in, out] (row-major K x N), not an [out, in] weight
    read transposed (nn.Linear's, whose transposed view has stride 1 along K)."""
    return b.dim() >= 2 and b.shape[-1] > 1 and b.stride(-1) == 1 and b.shape[-2] > 1


def _record(recorder: Any, packet: Any, args: tuple, kwargs: dict) -> list[tuple[Signature, int]]:
    import torch

    aten = torch.ops.aten
    a, b = operands(packet, args)
    if not is_gemm_product(recorder, packet, b):
        return []
    dt = dt_of(a.dtype)
    if dt is None:
        return []
    if a.dim() == 2:
        rows, k = a.shape
        batch, n = 1, b.shape[-1]
    else:
        batch, rows, k = a.shape
        n = b.shape[-1]
    rows, k, n, batch = int(rows), int(k), int(n), int(batch)
    if rows < 1 or n < 1 or k < 1 or batch < 1:
        return []
    # an fp32 product in a patched model is a TunedLinear's own torch call (the family serves
    # fp16/bf16 only): it keeps its gemm key, which the plan lists as unserved for its dtype
    src = "conv1d" if _in_out(b) else "call" if getattr(recorder, "patched", False) and dt == "half" else None
    if src is not None:
        return [(Signature.make("gemm", UNPATCHED, dt, N=n, K=k, src=src), rows * batch)]
    if packet is aten._addmm_activation:
        use_gelu = args[5] if len(args) > 5 else kwargs.get("use_gelu", False)
        sig = Signature.make("gemm", "gemm_act", dt, N=n, K=k, act="gelu_tanh" if use_gelu else "relu", bias=1)
        return [(sig, rows)]
    return [(Signature.make("gemm", "gemm", dt, N=n, K=k), rows * batch)]


def rules() -> tuple[CensusRule, ...]:
    return (CensusRule(("mm", "addmm", "bmm", "baddbmm", "_addmm_activation"), _record),)
