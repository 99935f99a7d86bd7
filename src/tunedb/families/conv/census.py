"""The conv family's census rule: aten::convolution calls (what nn.Conv1d / nn.Conv2d and
F.conv1d / F.conv2d dispatch to) become conv1d / conv2d signatures. Duck-typed on .shape /
.dtype / .stride(): works on meta tensors. Transposed convolutions, 3-D convolutions and dtypes
other than fp16 / bf16 are not this family's (no key). The activation that follows a conv2d is
a separate aten op the call does not show: the census keys act=none, and a fused act=relu call
is served by that entry (the family's serving_keys); `tunedb census --fused` runs optimize()'s
modules, whose ops record the fused key themselves (ops.py). Keys are dt=half, as GEMM's are.
"""
from __future__ import annotations

from typing import Any

from tunedb.errors import SignatureError
from tunedb.families.conv import keys
from tunedb.families.contract import CensusRule
from tunedb.records import Signature

Key = tuple[Signature, int]


def convolution_key(args: tuple, kwargs: dict) -> Key | None:
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding", "groups")
    a = dict(zip(names, args))
    a.update({k: v for k, v in kwargs.items() if k in names})
    x, w = a.get("input"), a.get("weight")
    if x is None or w is None or a.get("transposed"):
        return None
    rank = len(x.shape)
    if rank not in (3, 4) or str(x.dtype) not in ("torch.float16", "torch.bfloat16"):
        return None
    op = "conv1d" if rank == 3 else "conv2d"
    try:
        sig, m = keys.signature_of(op, x, w, a.get("bias"), a.get("stride", 1), a.get("padding", 0),
                                   a.get("dilation", 1), int(a.get("groups", 1)))
    except SignatureError:
        return None
    return sig.with_dt("half"), m  # the census's dt: one entry serves fp16 and bf16 (spec 000)


def _record(recorder: Any, packet: Any, args: tuple, kwargs: dict) -> list[Key]:
    key = convolution_key(args, kwargs)
    return [key] if key is not None else []


def rules() -> tuple[CensusRule, ...]:
    return (CensusRule(("convolution",), _record),)
