"""Triton kernel of the triton_overlap lane (configs_overlap.py says the grammar, docs/glsm_gap.md
the design): ONE persistent launch in which the GEMM tiles and the log-sum-exp fix-up overlap.

Tiles are walked row block by row block (tile t: rows block t // T, columns block t % T, T tiles
a row block). Each tile stores its logits rounded to the output dtype and its rows' (max, sum of
exp) of those rounded values into partials [M, T]; the tile that completes a row block (its
acq_rel increment of the block's counter returns T - 1) combines the block's partials into
lse[rows] and raises the block's ready flag (release). After its tile t, a CTA fixes tile
u = t - LAG in place (y -= lse): written LAG tiles ago, it is still in L2, so the fix-up's read
and write mostly stay out of HBM, and it runs while other CTAs compute. CTAs past the last tile
drain the remaining fix-ups.

LAG >= T makes every wait one on earlier tiles only; with the whole grid resident (one CTA an SM)
nothing can wait forever. The waits are still bounded: MAX_SPINS polls a CTA over all its waits;
a fix-up whose wait ran out writes NaN, or leaves the tile's logits unnormalised when the tile's
own write came after it (loudly wrong: off by the row's lse; the gate refuses it), never a hang. Loads of what other CTAs
wrote use `.cg` (L2, never a stale L1 line). No torch import: launch_overlap.py passes tensors.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tunedb.families.gemm_log_softmax.kernels import _logit_tile

# M, T, R (row blocks) and LAG vary per call and feed only index arithmetic: one compile serves
# every M (N and the strides stay specialised where they divide by 16)
NO_SPECIALIZE = ("M", "T", "R", "LAG")


@triton.jit
def _block_lse(pmax_ptr, psum_ptr, lse_ptr, offs_m, m_ok, T, TB: tl.constexpr):
    """The row block's log-sum-exps from its rows' T partials (TB at a time), stored to lse."""
    offs_t = tl.arange(0, TB)
    run_max = tl.full(offs_m.shape, float("-inf"), tl.float32)
    run_sum = tl.zeros(offs_m.shape, tl.float32)
    base = offs_m.to(tl.int64) * T
    for t0 in range(0, T, TB):
        ok = m_ok[:, None] & ((t0 + offs_t) < T)[None, :]
        idx = base[:, None] + t0 + offs_t[None, :]
        pm = tl.load(pmax_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg")
        ps = tl.load(psum_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg")
        new_max = tl.maximum(run_max, tl.max(pm, axis=1))
        safe = tl.where(new_max == float("-inf"), 0.0, new_max)  # rows past M: keep them finite
        run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(ps * tl.exp(pm - safe[:, None]), axis=1)
        run_max = new_max
    lse = tl.where(m_ok, run_max + tl.log(tl.where(m_ok, run_sum, 1.0)), 0.0)
    tl.store(lse_ptr + offs_m, lse, mask=m_ok)


@triton.jit
def _tile_step(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, lse_ptr, cnt_ptr, tile, M, N, K, T,
               stride_xm, stride_wn, stride_ym,
               HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               TB: tl.constexpr):
    """One GEMM tile: rounded logits stored, their statistics stored, the row block's counter
    raised; the block's last tile also writes the block's lse and raises its ready flag."""
    rb = tile // T
    nt = tile % T
    acc, offs_m, offs_n, m_ok, n_ok = _logit_tile(x_ptr, w_ptr, b_ptr, rb, nt, M, N, K,
                                                  stride_xm, stride_wn, HAS_BIAS, BM, BN, BK)
    logits = acc.to(y_ptr.dtype.element_ty)  # columns past N stay -inf: out of max and sum
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, logits, mask=m_ok[:, None] & n_ok[None, :])
    r = logits.to(tl.float32)
    t_max = tl.max(r, axis=1)
    t_sum = tl.sum(tl.exp(r - t_max[:, None]), axis=1)
    stat = offs_m.to(tl.int64) * T + nt
    tl.store(pmax_ptr + stat, t_max, mask=m_ok)
    tl.store(psum_ptr + stat, t_sum, mask=m_ok)
    tl.debug_barrier()  # every thread's stores issued before the release below publishes them
    done = tl.atomic_add(cnt_ptr + rb, 1, sem="acq_rel")
    if done == T - 1:  # the block's last tile: every partial of its rows is visible
        tl.debug_barrier()  # no thread reads the partials before the acquire above completed
        _block_lse(pmax_ptr, psum_ptr, lse_ptr, offs_m, m_ok, T, TB)
        tl.debug_barrier()
        tl.atomic_xchg(cnt_ptr + tl.cdiv(M, BM) + rb, 1, sem="release")


@triton.jit
def _fix_step(y_ptr, lse_ptr, cnt_ptr, u, M, N, T, stride_ym, budget,
              BM: tl.constexpr, BN: tl.constexpr, FC: tl.constexpr):
    """Fix tile u in place (y -= lse of its rows) once its row block's lse is ready, FC columns
    at a time (a whole 128 x 256 tile in fp32 would be 128 more registers a thread). `budget`:
    the polls this CTA has left (one budget for all its waits: a fault that leaves every flag
    down costs one bounded wait, not one a tile); returns what is left."""
    rb = u // T
    nt = u % T
    flag = cnt_ptr + tl.cdiv(M, BM) + rb
    ready = tl.atomic_add(flag, 0, sem="acquire")
    while (ready == 0) & (budget > 0):
        ready = tl.atomic_add(flag, 0, sem="acquire")
        budget -= 1
    tl.debug_barrier()
    offs_m = rb * BM + tl.arange(0, BM)
    m_ok = offs_m < M
    lse = tl.load(lse_ptr + offs_m, mask=m_ok, other=0.0, cache_modifier=".cg")
    lse = tl.where(ready != 0, lse, float("nan"))
    row_ptrs = y_ptr + offs_m.to(tl.int64) * stride_ym
    for c0 in tl.static_range(0, BN, FC):
        offs_n = nt * BN + c0 + tl.arange(0, FC)
        ok = m_ok[:, None] & (offs_n < N)[None, :]
        ptrs = row_ptrs[:, None] + offs_n[None, :]
        v = tl.load(ptrs, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(ptrs, (v - lse[:, None]).to(y_ptr.dtype.element_ty), mask=ok)
    return budget


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _overlap_kernel(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, lse_ptr, cnt_ptr,
                    M, N, K, T, R, LAG, stride_xm, stride_wn, stride_ym,
                    HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    TB: tl.constexpr, FC: tl.constexpr, MAX_SPINS: tl.constexpr, VEC: tl.constexpr = 1):
    """G persistent CTAs over R x T tiles; cnt_ptr: R block counters then R ready flags, zero at
    launch. VEC: as kernels._rows_kernel's (N and stride_ym multiples of VEC: vector accesses
    at N = 5000)."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    if VEC > 1:  # the same values, rewritten so that the compiler sees their divisibility
        N = (N // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    total = R * T
    budget = pid * 0 + MAX_SPINS  # an i32 the loops carry (a constexpr would not change type)
    for t in range(pid, total, G):
        _tile_step(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, lse_ptr, cnt_ptr, t, M, N, K, T,
                   stride_xm, stride_wn, stride_ym, HAS_BIAS, BM, BN, BK, TB)
        if t >= LAG:
            budget = _fix_step(y_ptr, lse_ptr, cnt_ptr, t - LAG, M, N, T, stride_ym, budget, BM, BN, FC)
    # the drain: the fix-ups of the last LAG tiles, in the CTAs that would have had tiles t >= total
    first = pid + tl.cdiv(tl.maximum(total - pid, 0), G) * G
    for t in range(first, total + LAG, G):
        if t >= LAG:
            budget = _fix_step(y_ptr, lse_ptr, cnt_ptr, t - LAG, M, N, T, stride_ym, budget, BM, BN, FC)
