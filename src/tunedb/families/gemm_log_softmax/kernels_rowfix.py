"""Triton kernels of the triton_rowfix lane (configs_rowfix.py says the design): phase 1 writes
each tile's logits (output dtype) and its rows' (max, sum of exp) of those rounded logits; phase
2 combines each row's partials into its log-sum-exp and subtracts it in place, one (row, column
chunk) a program. Launched as two kernels (`_tiles_kernel`, `_fix_kernel`; the second may run
under programmatic dependent launch) or as one persistent kernel (`_one_kernel`) with a grid
barrier between the phases. No torch import: launch_rowfix.py passes tensors.

Phase 2 reads what other CTAs wrote: in the one-launch kernel after an acquire on the barrier's
counter, in the fix-up kernel after the previous kernel completed (or gdc_wait); its loads use
`.cg` (L2, never a stale L1 line).
"""
from __future__ import annotations

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+ (the validity predicate refuses pdl configs elsewhere)
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass

from tunedb.families.gemm_log_softmax.kernels import _logit_tile

# M and T vary per call and feed only index arithmetic: one compile serves every M (N and the
# strides stay specialised: their divisibility by 16 lets loads and stores vectorise)
NO_SPECIALIZE = ("M", "T")


@triton.jit
def _tile_phase(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, tile, M, N, K, T,
                stride_xm, stride_wn, stride_ym,
                HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """One tile: logits stored rounded, statistics of the rounded values (as torch's pair
    normalises the logits it rounded). Tiles of one N slice are consecutive (W read once)."""
    num_m = tl.cdiv(M, BM)
    pid_m = tile % num_m
    pid_n = tile // num_m
    acc, offs_m, offs_n, m_ok, n_ok = _logit_tile(x_ptr, w_ptr, b_ptr, pid_m, pid_n, M, N, K,
                                                  stride_xm, stride_wn, HAS_BIAS, BM, BN, BK)
    logits = acc.to(y_ptr.dtype.element_ty)  # columns past N stay -inf: out of max and sum
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, logits, mask=m_ok[:, None] & n_ok[None, :])
    r = logits.to(tl.float32)
    t_max = tl.max(r, axis=1)
    t_sum = tl.sum(tl.exp(r - t_max[:, None]), axis=1)
    stat = offs_m.to(tl.int64) * T + pid_n
    tl.store(pmax_ptr + stat, t_max, mask=m_ok)
    tl.store(psum_ptr + stat, t_sum, mask=m_ok)


@triton.jit
def _fix_phase(y_ptr, pmax_ptr, psum_ptr, item, M, N, T, stride_ym, ready,
               FN: tl.constexpr, TB: tl.constexpr):
    """One (row, FN-column chunk): the row's lse from its T partials (TB at a time), then
    y -= lse in place. The chunk's load is issued before the partials' (independent: the two
    latencies overlap). `ready` false (a grid barrier that timed out): the chunk is written NaN,
    a loud wrong answer rather than a plausible one."""
    num_c = tl.cdiv(N, FN)
    row = item // num_c
    cols = (item % num_c) * FN + tl.arange(0, FN)
    ok = cols < N
    ptrs = y_ptr + row.to(tl.int64) * stride_ym + cols
    v = tl.load(ptrs, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    offs_t = tl.arange(0, TB)
    base = row.to(tl.int64) * T
    run_max = tl.max(tl.full((TB,), float("-inf"), tl.float32), axis=0)
    run_sum = tl.sum(tl.zeros((TB,), tl.float32), axis=0)
    for t0 in range(0, T, TB):
        t_ok = (t0 + offs_t) < T
        pm = tl.load(pmax_ptr + base + t0 + offs_t, mask=t_ok, other=float("-inf"), cache_modifier=".cg")
        ps = tl.load(psum_ptr + base + t0 + offs_t, mask=t_ok, other=0.0, cache_modifier=".cg")
        new_max = tl.maximum(run_max, tl.max(pm, axis=0))  # finite: every tile has a column < N
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(ps * tl.exp(pm - new_max), axis=0)
        run_max = new_max
    lse = tl.where(ready, run_max + tl.log(run_sum), float("nan"))
    tl.store(ptrs, (v - lse).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _tiles_kernel(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, M, N, K, T,
                  stride_xm, stride_wn, stride_ym,
                  HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  GDC: tl.constexpr, VEC: tl.constexpr = 1):
    """Phase 1, one tile a program. GDC: let a PDL-launched fix-up's CTAs be scheduled as soon as
    every tile has started (they wait at gdc_wait for this kernel's completion and memory).
    VEC: as kernels._rows_kernel's (N and stride_ym multiples of VEC: vector stores at N=5000)."""
    if GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if VEC > 1:  # the same values, rewritten so that the compiler sees their divisibility
        N = (N // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    _tile_phase(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, tl.program_id(0), M, N, K, T,
                stride_xm, stride_wn, stride_ym, HAS_BIAS, BM, BN, BK)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _fix_kernel(y_ptr, pmax_ptr, psum_ptr, M, N, T, stride_ym,
                FN: tl.constexpr, TB: tl.constexpr, GDC: tl.constexpr, VEC: tl.constexpr = 1):
    """Phase 2, one (row, column chunk) a program. GDC: wait for the tiles kernel (PDL)."""
    if GDC:
        tl.extra.cuda.gdc_wait()
    if VEC > 1:
        N = (N // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    _fix_phase(y_ptr, pmax_ptr, psum_ptr, tl.program_id(0), M, N, T, stride_ym, True, FN, TB)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def _one_kernel(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, cnt_ptr, M, N, K, T,
                stride_xm, stride_wn, stride_ym,
                HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                FN: tl.constexpr, TB: tl.constexpr, MAX_SPINS: tl.constexpr, VEC: tl.constexpr = 1):
    """Both phases in one persistent launch of G CTAs (all resident: the predicate's check), a
    grid barrier between them. cnt_ptr[0] counts arrivals, cnt_ptr[1] departures; the last CTA
    to depart zeroes both, so the next launch (stream-ordered) finds them zero. The wait is
    bounded by MAX_SPINS polls: a CTA whose wait runs out writes its chunks NaN (a loud wrong
    answer the gate refuses), never a hang."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    if VEC > 1:
        N = (N // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    for tile in range(pid, tl.cdiv(M, BM) * T, G):
        _tile_phase(x_ptr, w_ptr, b_ptr, y_ptr, pmax_ptr, psum_ptr, tile, M, N, K, T,
                    stride_xm, stride_wn, stride_ym, HAS_BIAS, BM, BN, BK)
    tl.debug_barrier()  # every thread's stores issued before the release below publishes them
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel") + 1
    spins = 0
    while (arrived < G) & (spins < MAX_SPINS):
        arrived = tl.atomic_add(cnt_ptr, 0, sem="acquire")
        spins += 1
    tl.debug_barrier()
    ready = arrived >= G
    for item in range(pid, M * tl.cdiv(N, FN), G):
        _fix_phase(y_ptr, pmax_ptr, psum_ptr, item, M, N, T, stride_ym, ready, FN, TB)
    left = tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel")
    if left == G - 1:  # every CTA is past the barrier: reset for the next launch
        tl.atomic_xchg(cnt_ptr, 0)
        tl.atomic_xchg(cnt_ptr + 1, 0)
