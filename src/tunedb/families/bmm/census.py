"""The bmm family's census rule: every dispatched matrix product that is not a linear layer.

aten bmm / baddbmm (mm / addmm / _addmm_activation are 2-D: products the run time does not
serve) whose second operand is not one weight shared by the batch (families.gemm.census_rules.is_gemm_product decides for both families, so
each call has one owner): attention's q @ k^T and softmax(scores) @ v under eager attention,
x @ y of two activations, a stack of distinct weights. The key is the product's: an addmm /
baddbmm's added input and scales are not part of it (the product is the work). Works on meta
tensors (shapes and strides only).
"""
from __future__ import annotations

from typing import Any

from tunedb.families.bmm.keys import layout_of, make_signature
from tunedb.families.contract import CensusRule
from tunedb.records import Signature

PACKETS = ("mm", "addmm", "bmm", "baddbmm", "_addmm_activation")


def _record(recorder: Any, packet: Any, args: tuple, kwargs: dict) -> list[tuple[Signature, int]]:
    from tunedb.families.gemm.census_rules import dt_of, is_gemm_product, operands

    if getattr(recorder, "in_attention", 0):
        return []  # nn.MultiheadAttention's attention: one SDPA kernel on a GPU (census/recorder.py)
    a, b = operands(packet, args)
    if is_gemm_product(recorder, packet, b):
        return []
    dt = dt_of(a.dtype)
    # 3-D only: the run time serves products of 3-D or more (serving.servable); a 2-D mm of two
    # activations, or F.linear over a computed weight (weight_norm), would be measured, never served
    if dt not in ("half", "fp32") or a.dim() != 3 or b.dim() != 3:
        return []
    batch = int(a.shape[0])
    rows, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    if min(batch, rows, k, n) < 1:
        return []
    return [(make_signature(batch, n, k, dt, layout_of(a, b)), rows)]


def rules() -> tuple[CensusRule, ...]:
    return (CensusRule(PACKETS, _record),)
