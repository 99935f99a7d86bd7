"""Grouped-GEMM signatures: the static key of an MoE expert GEMM call and its work.

    group_gemm|op=group_gemm|dt=bf16|E=8|N=28672|K=4096|top_k=2|x=token     (gate/up projection)
    group_gemm|op=group_gemm|dt=bf16|E=8|N=4096|K=14336|top_k=2|x=slot      (down projection)

x=token: hidden states [M, K], each token's row feeds its top_k slots; x=slot: one row per
(token, slot) [M, top_k, K] (the activations between the two projections). The output is
[M, top_k, N], slot j of token t computed with expert topk_ids[t, j] (times topk_weights[t, j]
when weights are given). The size axis is M, the tokens. Duck-typed on .shape/.dtype: no torch.
"""
from __future__ import annotations

from typing import Any

from tunedb.errors import SignatureError
from tunedb.families.key_rules import check_one_device, check_tensors, size
from tunedb.families.group_gemm.configs import FAMILY, sig_reason
from tunedb.records import Signature

DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}  # str(torch dtype) -> dt


def make_signature(e: int, n: int, k: int, top_k: int, dt: str = "bf16", x: str = "token",
                   op: str = "group_gemm") -> Signature:
    sig = Signature.make(FAMILY, op, dt, E=int(e), N=int(n), K=int(k), top_k=int(top_k), x=x)
    why = sig_reason(sig)
    if why:
        raise SignatureError(f"bad signature {sig.format()!r}: {why}")
    return sig


def dt_name(dtype: Any) -> str:
    name = DTYPE_NAMES.get(str(dtype))
    if name is None:
        raise SignatureError(f"group_gemm takes torch.bfloat16 or torch.float16 operands, got {dtype}")
    return name


_STRIDED: list[Any] = []  # torch.strided, bound on first use (importing the keys imports no torch)


def _strided() -> Any:
    import torch

    _STRIDED.append(torch.strided)
    return torch.strided


def signature_of(op: str, x: Any, weight: Any, topk_ids: Any, topk_weights: Any = None,
                 allow_empty: bool = False) -> tuple[Signature, int]:
    """(Signature, M) of y[t, j] = x[t or (t, j)] @ weight[topk_ids[t, j]].T. allow_empty: M = 0
    passes every other check (a call without tokens is valid, and has no key to serve)."""
    if op != "group_gemm":
        raise SignatureError(f"unknown group_gemm op {op!r}; ops are group_gemm")
    check_tensors("group_gemm", ("topk_weights",), x=x, weight=weight, topk_ids=topk_ids, topk_weights=topk_weights)
    check_one_device("group_gemm", x=x, weight=weight, topk_ids=topk_ids, topk_weights=topk_weights)
    dense = _STRIDED[0] if _STRIDED else _strided()
    if (x.layout is not dense or weight.layout is not dense or topk_ids.layout is not dense
            or (topk_weights is not None and topk_weights.layout is not dense)):
        for name, t in (("x", x), ("weight", weight), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if t is not None and t.layout is not dense:  # every arm reads dense rows
                raise SignatureError(f"group_gemm's {name} must be a dense (strided) tensor, got layout "
                                     f"{t.layout}: pass {name}.to_dense()")
    ws, ids = tuple(weight.shape), tuple(topk_ids.shape)
    if len(ws) != 3:
        raise SignatureError(f"group_gemm weight must be [E, N, K], got {list(ws)}")
    if len(ids) != 2:
        raise SignatureError(f"group_gemm topk_ids must be [M, top_k], got {list(ids)}")
    e, n, k = (int(d) for d in ws)
    m, top_k = size(ids[0]), int(ids[1])
    xs = tuple(x.shape)
    if xs == (m, k):
        form = "token"
    elif xs == (m, top_k, k):
        form = "slot"
    else:
        raise SignatureError(f"group_gemm x must be [M, K] = {[m, k]} or [M, top_k, K] = {[m, top_k, k]}, "
                             f"got {list(xs)}")
    if str(topk_ids.dtype) not in ("torch.int32", "torch.int64"):
        raise SignatureError(f"group_gemm topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights is not None and tuple(topk_weights.shape) != (m, top_k):
        raise SignatureError(f"group_gemm topk_weights must be [M, top_k] = {[m, top_k]}, "
                             f"got {list(topk_weights.shape)}")
    if topk_weights is not None and (not topk_weights.is_floating_point() or topk_weights.is_complex()):
        raise SignatureError(f"group_gemm topk_weights must be a real floating dtype (float32, bfloat16, "
                             f"float16 or float64), got {topk_weights.dtype}")
    dt = dt_name(x.dtype)
    if dt_name(weight.dtype) != dt:
        raise SignatureError(f"group_gemm x is {x.dtype} but weight is {weight.dtype}; they must match")
    if m < 1 and not (allow_empty and m == 0):
        raise SignatureError(f"group_gemm needs at least one token, got M={m}")
    sig = make_signature(e, n, k, top_k, dt, form)
    check_ids(topk_ids, e)
    return sig, m


_CHECK_CUDA: list[Any] = [None, False]  # (database epoch, TUNEDB_CHECK_INPUTS then)


def check_ids(topk_ids: Any, e: int) -> None:
    """SignatureError naming the first expert id outside 0..E-1. An out-of-range id reads another
    expert's (or no) memory in every arm: garbage on the CPU, an illegal address on the GPU.
    CPU ids are checked every call (free); CUDA ids only under TUNEDB_CHECK_INPUTS=1, since
    reading a value back costs a device sync (and cannot run inside a CUDA graph capture);
    meta ids hold no values, nor do a compiler's traced or fake ones."""
    if topk_ids.is_meta or topk_ids.numel() == 0:
        return
    if topk_ids.is_cuda:  # the every-call path: the setting's memo first (is_cuda is cheaper than .device)
        from tunedb.runtime import launch_table

        epoch = launch_table._selector_epoch()
        if _CHECK_CUDA[0] != epoch:  # a setting read costs ~20 us: once per epoch, not per call
            from tunedb import settings

            _CHECK_CUDA[:] = [epoch, settings.check_inputs()]
        if not _CHECK_CUDA[1]:
            return
    import torch

    if torch.compiler.is_compiling():  # traced values are symbolic: the compiled call checks nothing
        return
    from torch._guards import detect_fake_mode

    if detect_fake_mode(topk_ids) is not None:  # fake propagation (AOT dispatch, a FakeTensorMode)
        return
    if topk_ids.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    lo, hi = (int(v) for v in topk_ids.aminmax())
    if lo < 0 or hi >= e:
        bad = lo if lo < 0 else hi
        where = [int(i) for i in ((topk_ids == bad).nonzero()[0])]
        raise SignatureError(f"group_gemm topk_ids holds expert id {bad} at {where}; ids must be in "
                             f"0..{e - 1} (the weight's E={e} experts)")


def work(sig: Signature, m: int) -> tuple[float, float]:
    """(2 * M * top_k * N * K flops, bytes of x + the experts' weights that can be hit + y)."""
    e, n, k, top_k = (sig.get(f) for f in ("E", "N", "K", "top_k"))
    slots = m * top_k
    hit = min(e, slots)
    rows = m if sig.get("x") == "token" else slots
    return 2.0 * slots * n * k, float(2 * (rows * k + hit * n * k + slots * n) + 12 * slots)
