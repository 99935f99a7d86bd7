"""The quantized GEMM's launch path: one cached closure per (config, signature).

`run(x, weight, x_scale, w_scale, out=None)` returns y [..., N] for op=scaled_mm and (q [..., N],
s [..., 1]) for op=scaled_mm_quant (`out`: y, or q, or the (q, s) pair, written in place). The `_quant` op runs the scaled GEMM into an fp32 buffer and
quantizes it per row (row_quant_kernel): a row's scale needs the whole row, which spans tiles.
The `heuristic` sentinel picks its tile per M (configs.heuristic_config), memoised. A decode-lane
closure allocates its split-K workspace and counters once per device (the kernel leaves the
counters zero), so one closure serves one stream at a time, as the GEMM family's decode lane.
An inherently torch module (imported lazily by the family).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from tunedb.families.scaled_mm import arms, configs
from tunedb.families.scaled_mm.arms import QMAX, flat_scales, torch_dtype
from tunedb.records import Config, Signature

Launcher = Callable[..., Any]
_LAUNCHERS: dict[tuple[str, Signature], Launcher] = {}
_SMS: dict[int, int] = {}
SCALE_CODES = {"tensor": 0, "row": 1, "block": 2}
REDUCE_BM, REDUCE_BN, REDUCE_WARPS = 16, 256, 4
QUANT_BLOCK = 1024


def launcher(config: Config, sig: Signature) -> Launcher:
    key = (config.id, sig)
    fn = _LAUNCHERS.get(key)
    if fn is None:
        fn = _LAUNCHERS.setdefault(key, _build(config, sig))
    return fn


def launch(config: Config, sig: Signature, x: Any, weight: Any, x_scale: Any, w_scale: Any,
           out: Any = None) -> Any:
    return launcher(config, sig)(x, weight, x_scale, w_scale, out)


def num_sms(device: Any) -> int:
    if device.type != "cuda":
        return 132  # the interpreter: the H200's count, so CPU tests pick the device's tiles
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SMS[index]


def _build(config: Config, sig: Signature) -> Launcher:
    why = configs.sig_reason(sig)
    if why:
        raise ValueError(f"cannot launch {sig.format()!r}: {why}")
    if config.id in ("heuristic", "default"):
        return _heuristic(sig)
    if config.id == "torch":
        return arms.torch_arm(sig)
    if config.is_sentinel:
        raise ValueError(f"{sig.family} has no {config.id!r} arm; sentinels: {', '.join(configs.FAMILY_SENTINELS)}")
    return _triton(config, sig)


def _heuristic(sig: Signature) -> Launcher:
    by_m: dict[tuple[int, int], Launcher] = {}

    def run(x, weight, x_scale, w_scale, out=None):
        m = x.numel() // sig.get("K") if sig.get("K") else 0
        key = (m, num_sms(x.device))
        fn = by_m.get(key)
        if fn is None:
            fn = by_m[key] = launcher(configs.heuristic_config(sig, max(m, 1), key[1]), sig)
        return fn(x, weight, x_scale, w_scale, out)

    return run


def quant_out(out: Any, x: Any, n: int, q_dtype: Any) -> tuple[Any, Any]:
    """The `_quant` op's (q, s) buffers: new ones (out None), the caller's q tensor (what the
    measurement protocol passes) with a new s, or the caller's (q, s) pair; checked."""
    shape = (*x.shape[:-1], n)
    m = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if out is None:
        return (torch.empty(shape, dtype=q_dtype, device=x.device),
                torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device))
    if isinstance(out, torch.Tensor):
        q, s = out, torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    elif isinstance(out, (tuple, list)) and len(out) == 2:
        q, s = out
    else:
        raise ValueError(f"a _quant op's out must be a q tensor or a (q, s) pair, got {type(out).__name__}")
    if q.dtype != q_dtype or not q.is_contiguous() or q.numel() != m * n:
        raise ValueError(f"out q must be a contiguous {q_dtype} tensor of {m * n} elements, got {q.dtype} {list(q.shape)}")
    if s.dtype != torch.float32 or not s.is_contiguous() or s.numel() != m:
        raise ValueError(f"out s must be a contiguous torch.float32 tensor of {m} elements, got {s.dtype} {list(s.shape)}")
    return q, s


def _triton(config: Config, sig: Signature) -> Launcher:
    from tunedb.families.scaled_mm.kernels import (row_quant_kernel, scaled_mm_decode_kernel, scaled_mm_kernel,
                                                   scaled_mm_reduce_kernel, scaled_mm_tma_kernel)

    n, k = sig.get("N"), sig.get("K")
    bm, bn, bk = configs.blocks(config)
    split, group_m = config.param("split_k"), config.param("group_m")
    scale = SCALE_CODES[sig.get("scale", "row")]
    is_int = sig.dt == "int8"
    quant = sig.op == "scaled_mm_quant"
    out_name = sig.get("out")
    y_dtype = torch.float32 if quant else torch_dtype(out_name)
    operand = torch.int8 if is_int else torch.float8_e4m3fn
    # int8 partials stay int32 (exact) unless block scales scaled them already (fp8 only anyway)
    ws_dtype = torch.int32 if is_int and scale != 2 else torch.float32
    tma = config.lane == "triton_tma"
    if tma:
        from tunedb.families.gemm.launch import _scratch_allocator

        scratch = _scratch_allocator()  # Triton's allocator for the device-side descriptors
    kw = dict(SCALE=scale, INT=is_int, BM=bm, BN=bn, BK=bk, GROUP_M=group_m, SPLIT=split,
              num_warps=config.param("warps"), num_stages=config.param("stages"))
    decode = config.lane == "triton_decode"
    gemv = config.param("kernel") == "gemv"
    if decode:
        pdl = bool(config.param("pdl")) and not _interpreting()  # the interpreter has no PDL
        dkw = dict(SCALE=scale, INT=is_int, BN=bn, BK=bk, SPLIT=split, PDL=pdl,
                   num_warps=kw["num_warps"], num_stages=kw["num_stages"], **({"launch_pdl": True} if pdl else {}))
        if gemv:
            from tunedb.families.scaled_mm.configs_gemv import gemv_reason, rows_padded
            from tunedb.families.scaled_mm.kernels_gemv import scaled_mm_gemv_kernel

            dot = bool(config.param("dot"))
            dkw.update(DOT=dot, STAGES=kw["num_stages"])
        slabs = -(-n // bn)
        if split > -(-k // bk):  # a split without a K tile would count its neighbour's (the predicate)
            raise ValueError(f"{config.id} cannot serve K={k}: split_k={split} > {-(-k // bk)} K tiles of {bk}")
        scratch_bufs: dict[Any, tuple[Any, Any]] = {}  # per device: workspace, counters (left zero)

    def run(x, weight, x_scale, w_scale, out=None):
        if x.dtype != operand or weight.dtype != operand:
            raise ValueError(f"{sig.format()} takes {operand} operands, got x {x.dtype}, weight {weight.dtype}")
        x2 = x.reshape(-1, k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        w = weight if weight.is_contiguous() else weight.contiguous()
        m = x2.shape[0]
        sx, sw = flat_scales(sig, x_scale, w_scale)
        if out is not None and not quant:
            if not out.is_contiguous() or out.dtype != y_dtype or out.numel() != m * n:
                raise ValueError(f"out must be a contiguous {y_dtype} tensor of {m * n} elements, got "
                                 f"{out.dtype} {list(out.shape)} contiguous={out.is_contiguous()}")
            y = out
        else:
            y = torch.empty((*x.shape[:-1], n), dtype=y_dtype, device=x.device)
        if m and decode:
            if m > configs.DECODE_MAX_M:  # the predicate refuses it; so does the launch
                raise ValueError(f"{config.id} (triton_decode) serves M <= {configs.DECODE_MAX_M}, got M={m}")
            bufs = scratch_bufs.get(x.device)
            if bufs is None:
                bufs = (torch.zeros(slabs * split * configs.DECODE_MAX_M * bn if split > 1 else 1, dtype=ws_dtype,
                                    device=x.device),
                        torch.zeros(slabs, dtype=torch.int32, device=x.device))
                # buffers made inside a graph capture are zeroed only when the graph replays: they
                # stay that graph's, and the next eager call makes (and keeps) its own
                if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
                    scratch_bufs[x.device] = bufs
            if gemv:
                why = gemv_reason(config, m)
                if why:  # the predicate refuses it; so does the launch
                    raise ValueError(f"{config.id} cannot serve M={m}: {why}")
                scaled_mm_gemv_kernel[(slabs, split)](x2, w, y, sx, sw, bufs[0], bufs[1], m, n, k,
                                                      MP=rows_padded(m, dot), **dkw)
            else:
                scaled_mm_decode_kernel[(slabs, split)](x2, w, y, sx, sw, bufs[0], bufs[1], m, n, k, **dkw)
        elif m:
            tiles = -(-m // bm) * -(-n // bn)
            if tma:
                if x2.data_ptr() % 16:
                    x2 = x2.clone()  # descriptors need 16-byte-aligned bases
                if w.data_ptr() % 16:
                    w = w.clone()
                scratch()
                scaled_mm_tma_kernel[(min(tiles, num_sms(x.device) if x.is_cuda else 4),)](
                    x2, w, y, sx, sw, m, n, k, SCALE=scale, INT=is_int, BM=bm, BN=bn, BK=bk, GROUP_M=group_m,
                    num_warps=kw["num_warps"], num_stages=kw["num_stages"])
            elif split == 1:
                scaled_mm_kernel[(tiles, 1)](x2, w, y, sx, sw, m, n, k, PARTIAL=False, **kw)
            else:
                ws = torch.empty((split, m, n), dtype=ws_dtype, device=x.device)
                scaled_mm_kernel[(tiles, split)](x2, w, ws, sx, sw, m, n, k, PARTIAL=True, **kw)
                scaled_mm_reduce_kernel[(-(-m // REDUCE_BM), -(-n // REDUCE_BN))](
                    ws, y, sx, sw, m, n, SCALE=scale, SPLIT=split, BM=REDUCE_BM, BN=REDUCE_BN,
                    num_warps=REDUCE_WARPS)
        if not quant:
            return y
        q, s = quant_out(out, x, n, torch_dtype(out_name))
        if m:
            qmax = QMAX[out_name]
            row_quant_kernel[(m,)](y, q, s, m, n, QMAX=qmax, INV_QMAX=1.0 / qmax, INT=is_int,
                                   BLOCK=QUANT_BLOCK, num_warps=4)
        return out if isinstance(out, (tuple, list)) else (q, s)

    return run


def _interpreting() -> bool:
    from tunedb.families.gemm.launch import _interpreting as interpreting

    return interpreting()


def quantize_rows(x2: Any, out_name: str) -> tuple[Any, Any]:
    """(q [M, K] int8/e4m3, s [M, 1] fp32) of a contiguous [M, K] activation (bf16/fp16/fp32) in
    one kernel (row_quant_kernel, the `_quant` op's quantizer): s = amax/QMAX per row, q rounded
    to nearest even. What QuantizedLinear runs on CUDA for per-token scales, in place of the
    eight torch ops of the same arithmetic."""
    from tunedb.families.scaled_mm.kernels import row_quant_kernel

    m, k = x2.shape
    q = torch.empty((m, k), dtype=torch_dtype(out_name), device=x2.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x2.device)
    if m:
        qmax = QMAX[out_name]
        row_quant_kernel[(m,)](x2, q, s, m, k, QMAX=qmax, INV_QMAX=1.0 / qmax, INT=out_name == "int8",
                               BLOCK=QUANT_BLOCK, num_warps=4)
    return q, s
