"""gemm_log_softmax signatures: the static key of a call (from tensors or meta tensors) and its work.

    gemm_log_softmax|op=gemm_log_softmax|dt=bf16|N=32000|K=512|bias=1

y = log_softmax(x @ weight.T + bias, dim=-1) for x [..., K], weight [N, K], bias [N] or None;
the size axis is M (the rows of x, every leading dimension flattened). The output has x's dtype
(bf16 in, bf16 out; fp16 in, fp16 out), as torch's linear then log_softmax gives it.
Duck-typed on `.shape` / `.dtype`: no torch import.
"""
from __future__ import annotations

import math
from typing import Any

from tunedb.errors import OperandMismatchError, SignatureError
from tunedb.families.key_rules import check_one_device, check_tensors
from tunedb.families.gemm_log_softmax.configs import DTYPES, FAMILY, OPS, sig_reason
from tunedb.records import Signature

_DT = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}


def make_signature(n: int, k: int, dt: str = "bf16", bias: int = 1, op: str = "gemm_log_softmax") -> Signature:
    if dt not in DTYPES:
        raise SignatureError(f"gemm_log_softmax dt={dt!r} is not served; allowed: {', '.join(DTYPES)}")
    sig = Signature.make(FAMILY, op, dt, N=int(n), K=int(k), bias=int(bias))
    why = sig_reason(sig)
    if why:
        raise SignatureError(f"bad signature {sig.format()!r}: {why}")
    return sig


def dt_of(dtype: Any) -> str:
    dt = _DT.get(str(dtype))
    if dt is None:
        raise SignatureError(f"gemm_log_softmax takes torch.bfloat16 or torch.float16 operands (tunedb."
                             f"gemm_log_softmax also float32 / float64: torch's form), got {dtype}")
    return dt


def signature_of(op: str, x: Any, weight: Any, bias: Any = None) -> tuple[Signature, int]:
    """(Signature, M) of log_softmax(x @ weight.T + bias, -1)."""
    n, k, dt = check_call(op, x, weight, bias)
    m = int(math.prod(tuple(x.shape)[:-1]))
    if m < 1:
        raise SignatureError(f"gemm_log_softmax needs at least one row (x {list(x.shape)})")
    return make_signature(n, k, dt, 0 if bias is None else 1, op), m


def check_call(op: str, x: Any, weight: Any, bias: Any = None, served_dtype: bool = True) -> tuple[int, int, str]:
    """(N, K, dt) of a call, SignatureError naming a bad shape or dtype: every check but the
    row count (an empty x has no key, but is a valid call; the fake kernel reads no M).
    served_dtype=False: any one float dtype (the entry point's torch form for fp32/fp64).
    Operands that do not fit together (a 0-d x, a K, dtype or bias that differs) raise
    OperandMismatchError, also the RuntimeError torch's linear raises for the same call: an
    optimize()d head's caller catching nn.Linear's error got a ValueError (s42 audit)."""
    if op not in OPS:
        raise SignatureError(f"unknown gemm_log_softmax op {op!r}; ops are {', '.join(OPS)}")
    check_tensors("gemm_log_softmax", ("bias",), x=x, weight=weight, bias=bias)
    check_one_device("gemm_log_softmax", x=x, weight=weight, bias=bias)
    xs, ws = tuple(x.shape), tuple(weight.shape)
    if len(xs) < 1 or len(ws) != 2:
        raise OperandMismatchError(f"gemm_log_softmax needs x [..., K] and weight [N, K]; got x {list(xs)}, "
                                   f"weight {list(ws)}")
    n, k = (int(d) for d in ws)
    if xs[-1] != k:
        raise OperandMismatchError(f"gemm_log_softmax x has K={xs[-1]} but weight [N, K] has K={k}")
    # the pair's dtype before the served one: x int64 on a bf16 weight is a mismatch, as torch says
    if str(weight.dtype) != str(x.dtype):
        raise OperandMismatchError(f"gemm_log_softmax x is {x.dtype} but weight is {weight.dtype}; they must match")
    dt = dt_of(x.dtype) if served_dtype else str(x.dtype).removeprefix("torch.")
    if bias is not None:
        if tuple(bias.shape) != (n,):
            raise OperandMismatchError(f"gemm_log_softmax bias has shape {list(bias.shape)}; expected [{n}] (N)")
        if str(bias.dtype) != str(x.dtype):
            raise OperandMismatchError(f"gemm_log_softmax bias is {bias.dtype} but x is {x.dtype}; they must match")
    return n, k, dt


def work(sig: Signature, m: int) -> tuple[float, float]:
    """(2*M*N*K flops, bytes of x + W (+ bias) + y, two bytes each): the fewest a fused kernel moves."""
    n, k = sig.get("N"), sig.get("K")
    return 2.0 * m * n * k, 2.0 * (m * k + n * k + m * n + n * sig.get("bias"))
