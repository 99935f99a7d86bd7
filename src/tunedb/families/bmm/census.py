"""The bmm family's census rule: every dispatched matrix product that is not a linear layer.

aten mm / addmm / bmm / baddbmm / _addmm_activation whose second operand is not one weight
shared by the batch (families.gemm.census_rules.is_gemm_product decides for both families, so
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
    if dt not in ("half", "fp32") or a.dim() != b.dim() or a.dim() not in (2, 3):
        return []
    batch = int(a.shape[0]) if a.dim() == 3 else 1
    rows, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
    if min(batch, rows, k, n) < 1:
        return []
    return [(make_signature(batch, n, k, dt, layout_of(a, b)), rows)]


def rules() -> tuple[CensusRule, ...]:
    return (CensusRule(PACKETS, _record),)
