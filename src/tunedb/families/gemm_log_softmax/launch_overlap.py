"""The triton_overlap lane's launch (configs_overlap.py says the design, kernels_overlap.py holds
the kernel): the workspaces (partial statistics [M, T] twice, lse [M], and 2R int32 counters
zeroed for each call), the grid (one CTA an SM, at most one a tile; one program under the
interpreter, which runs programs one after another) and the lag. Imports torch lazily.

Each call zeroes its own counters (one memset beside the kernel): two calls on two streams never
share them, and a call captured in a CUDA graph replays the memset with it.
"""
from __future__ import annotations

from typing import Any

from tunedb.records import Config

MAX_SPINS = 1 << 16  # polls of ready flags a CTA may spend over all its waits (0.3-1 us each)
# before its fix-ups give up and write NaN: never a hang
STAT_BLOCK = 16  # partials the row block's combine reads a row per step (64: the kernel spills)
FIX_COLS = 64  # columns a fix-up step holds at a time (a whole 128 x 256 tile in fp32 spills)


def lag(grid: int, tiles_per_block: int) -> int:
    """Tiles between a tile's write and its fix-up: the grid (the tiles in flight) plus a row
    block (>= T: every wait is on earlier tiles only), so the block is normally complete by then."""
    return grid + tiles_per_block


def overlap_arm(config: Config, x: Any, weight: Any, bias: Any = None, out: Any = None,
                vec: int | None = None, grid: int | None = None, max_spins: int = MAX_SPINS) -> Any:
    """y = log_softmax(x @ W^T + b) in one persistent launch. `vec` None: launch.row_vec's hint
    over the output; `grid` None: one CTA an SM; `max_spins`: a CTA's poll budget (tests pass
    other grids and budgets)."""
    import torch

    from tunedb.families.gemm_log_softmax import kernels_overlap as ko
    from tunedb.families.gemm_log_softmax.launch import row_vec
    from tunedb.families.gemm_log_softmax.launch_rowfix import _interpreting, _sms

    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = x2.shape[0]
    y = out.view(m, n) if out is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out if out is not None else y.view(*lead, n)
    bm, bn, bk = config.param("block")
    t = -(-n // bn)
    r = -(-m // bm)
    pmax = torch.empty((m, t), dtype=torch.float32, device=x.device)
    psum = torch.empty((m, t), dtype=torch.float32, device=x.device)
    lse = torch.empty((m,), dtype=torch.float32, device=x.device)
    cnt = torch.zeros((2 * r,), dtype=torch.int32, device=x.device)
    b = bias if bias is not None else w  # a placeholder pointer: HAS_BIAS=False never reads it
    vec = row_vec(n, y) if vec is None else vec
    if grid is None:
        grid = 1 if _interpreting() else _sms(x.device)
    g = max(1, min(grid, r * t))
    ko._overlap_kernel[(g,)](x2, w, b, y, pmax, psum, lse, cnt, m, n, k, t, r, lag(g, t),
                             x2.stride(0), w.stride(0), y.stride(0),
                             HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, TB=STAT_BLOCK, FC=min(bn, FIX_COLS),
                             MAX_SPINS=max_spins, VEC=vec,
                             num_warps=config.param("warps"), num_stages=config.param("stages"))
    return out if out is not None else y.view(*lead, n)
