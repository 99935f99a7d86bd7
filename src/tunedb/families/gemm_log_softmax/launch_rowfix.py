"""The triton_rowfix lane's launch (configs_rowfix.py says the design; kernels_rowfix.py holds the
kernels): the partial-statistics workspace, the fix-up's chunking, the two-kernel sequence (the
second under PDL for `pdl`) or the one persistent kernel (`one{P}`: P CTAs an SM, its barrier
counters allocated once per device and left zero by every launch). Imports torch lazily.

One launch of a `one{P}` config at a time per device: two streams running it concurrently would
share the counters (as the gemm family's triton_decode lane shares its own).
"""
from __future__ import annotations

from typing import Any

from tunedb.families.gemm_log_softmax.configs_rowfix import per_sm
from tunedb.records import Config

MAX_SPINS = 1 << 14  # polls of the barrier's counter (0.3-1 us each: 5-16 ms) before giving up: never a hang
_COUNTERS: dict[Any, Any] = {}
_SMS: dict[Any, int] = {}


def fix_chunk(n: int) -> int:
    """Columns a fix-up program takes: 2048 for short rows (more programs at N=5000), else 4096."""
    return 2048 if n <= 8192 else 4096


def stat_block(t: int) -> int:
    """Partials a fix-up program reads per step: a row's T in one step when T <= 1024 (two
    sizes only: each is a compile of the fix-up)."""
    return 256 if t <= 256 else 1024


def _interpreting() -> bool:
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # an older Triton: its env var
        import os

        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _sms(device: Any) -> int:
    if device not in _SMS:
        import torch

        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device]


def _counters(device: Any) -> Any:
    """The barrier's two counters on `device`, allocated once (every launch leaves them zero). A
    first call inside a CUDA graph capture gets its own zeroed pair, not cached: memory taken
    during a capture belongs to that graph's pool and may be reused once the graph is freed."""
    import torch

    cnt = _COUNTERS.get(device)
    if cnt is None:
        cnt = torch.zeros(2, dtype=torch.int32, device=device)
        if not (cnt.is_cuda and torch.cuda.is_current_stream_capturing()):
            _COUNTERS[device] = cnt
    return cnt


def rowfix_arm(config: Config, x: Any, weight: Any, bias: Any = None, out: Any = None,
               vec: int | None = None) -> Any:
    """`vec` None: launch.row_vec's divisibility hint over the output; 1: the kernels as before
    the hint (the bench's old arm)."""
    import torch

    from tunedb.families.gemm_log_softmax.launch import row_vec

    from tunedb.families.gemm_log_softmax import kernels_rowfix as kr

    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = x2.shape[0]
    y = out.view(m, n) if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm, bn, bk = config.param("block")
    t = -(-n // bn)
    pmax = torch.empty((m, t), dtype=torch.float32, device=x.device)
    psum = torch.empty((m, t), dtype=torch.float32, device=x.device)
    b = bias if bias is not None else w  # a placeholder pointer: HAS_BIAS=False never reads it
    fn, tb = fix_chunk(n), stat_block(t)
    vec = row_vec(n, y) if vec is None else vec
    tiles, items = -(-m // bm) * t, m * (-(-n // fn))
    warps, stages = config.param("warps"), config.param("stages")
    interp = _interpreting()
    p = per_sm(config)
    if p:
        cnt = _counters(x.device)
        # under the interpreter programs run one after another: one program is the whole grid
        g = 1 if interp else min(max(tiles, items), p * _sms(x.device))
        kr._one_kernel[(g,)](x2, w, b, y, pmax, psum, cnt, m, n, k, t, x2.stride(0), w.stride(0), y.stride(0),
                             HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, FN=fn, TB=tb, MAX_SPINS=MAX_SPINS,
                             VEC=vec, num_warps=warps, num_stages=stages)
    else:
        gdc = config.param("launch") == "pdl" and not interp
        kr._tiles_kernel[(tiles,)](x2, w, b, y, pmax, psum, m, n, k, t, x2.stride(0), w.stride(0), y.stride(0),
                                   HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, GDC=gdc,
                                   VEC=vec, num_warps=warps, num_stages=stages)
        extra = {"launch_pdl": True} if gdc else {}
        kr._fix_kernel[(items,)](y, pmax, psum, m, n, t, y.stride(0), FN=fn, TB=tb, GDC=gdc, VEC=vec, num_warps=4,
                                 **extra)
    return out if out is not None else y.view(*lead, n)
