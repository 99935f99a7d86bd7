"""A probe for issue 20's fp8 row-wise GEMM at M <= 16: x on the tensor-core MMA's M side.

The `scaled_mm_fp8` family's GEMV (`gv..._mma`, families/scaled_mm/kernels_gemv.py) puts the
weight slab on the MMA's M side (w [BN, BK] @ x^T [BK, 16], a warpgroup MMA from 64 rows). For
bf16 sibling projections the other orientation, tl.dot(x [16, BK], w^T [BK, BN]) with x's rows
past M masked, won at every group measured (session 37 call 2, bench/siblings_gemv.py), and the
fp8 lane still moves only 64-76% of 4.3 TB/s at 58.7 MB where a pure read of the same bytes
moves 86-89% (session 16). This module is that orientation for fp8 e4m3 x e4m3 -> bf16 with
per-token x per-channel scales, so `bench/decode_gemv_fp8.py --xm` can time it beside the family's
configs in one run. A probe, not a lane: it joins the family (ids, the validity predicate, the
table) only if it wins there.

    y[M, N] = (x_q[M, K] @ w_q[N, K]^T) * sx[M] * sw[N]      in bf16, fp32 accumulation

One program streams BN rows of w in [BN, BK] tiles (K-contiguous, 16-byte vectors), pipelined
STAGES deep; x (M <= 16 rows, zero-filled past M) is re-read from L2 with each tile; the scales
are applied once after the loop. Imports triton; torch only inside the launcher.
"""
from __future__ import annotations

from typing import Any, Callable

import triton
import triton.language as tl

# (BN, BK, warps, stages): 4096 rows are 256 / 128 / 64 / 32 programs at BN = 16 / 32 / 64 / 128
TILES = ((16, 256, 1, 5), (16, 512, 1, 4), (32, 256, 2, 5), (32, 512, 2, 4), (64, 256, 4, 4), (64, 128, 4, 6),
         (128, 128, 4, 4), (128, 256, 8, 3))
MAX_M = 16


@triton.jit
def xm_kernel(x_ptr, w_ptr, sx_ptr, sw_ptr, y_ptr, M, N, K, BN: tl.constexpr, BK: tl.constexpr,
              STAGES: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    row_ok = rows < N
    rows_in = tl.where(row_ok, rows, 0).to(tl.int64)
    ms = tl.arange(0, 16)
    m_ok = ms < M
    offs_k = tl.arange(0, BK)
    w_ptrs = w_ptr + rows_in[:, None] * K + offs_k[None, :]
    x_ptrs = x_ptr + ms[:, None].to(tl.int64) * K + offs_k[None, :]
    acc = tl.zeros((16, BN), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        k_ok = offs_k < K - k0
        w = tl.load(w_ptrs + k0, mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
        xv = tl.load(x_ptrs + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(xv, tl.trans(w), acc)
    sx = tl.load(sx_ptr + ms, mask=m_ok, other=0.0)
    sw = tl.load(sw_ptr + rows_in, mask=row_ok, other=0.0)
    y = acc * sx[:, None] * sw[None, :]
    tl.store(y_ptr + ms[:, None].to(tl.int64) * N + rows[None, :], y.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & row_ok[None, :])


def tile_id(tile: tuple[int, int, int, int]) -> str:
    bn, bk, warps, stages = tile
    return f"xm_n{bn}x{bk}_w{warps}_s{stages}"


def launcher(tile: tuple[int, int, int, int], interpret: bool = False) -> Callable[..., Any]:
    """run(x, w, sx, sw, bias=None) -> y [M, N] bf16, the family launcher's signature (x fp8 [M, K]
    with M <= 16, w fp8 [N, K], sx [M, 1] and sw [N, 1] fp32, all contiguous; no bias)."""
    bn, bk, warps, stages = tile

    def run(x: Any, w: Any, sx: Any, sw: Any, bias: Any = None) -> Any:
        import torch

        if bias is not None:
            raise ValueError("the xm probe takes no bias")
        m, k = x.shape
        n = w.shape[0]
        if not 1 <= m <= MAX_M or w.shape[1] != k:
            raise ValueError(f"the xm probe takes 1 to {MAX_M} rows of x and w [N, {k}], got x {list(x.shape)}, "
                             f"w {list(w.shape)}")
        y = torch.empty(m, n, device=x.device, dtype=torch.bfloat16)
        kw = {} if interpret else {"num_warps": warps, "num_stages": stages}
        xm_kernel[(triton.cdiv(n, bn),)](x, w, sx, sw, y, m, n, k, BN=bn, BK=min(bk, max(16, triton.next_power_of_2(k))),
                                         STAGES=stages, **kw)
        return y

    return run
