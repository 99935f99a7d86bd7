"""The triton_decode lane's prefetch twins (`_pf{P}` configs): each CTA asks L2 for its W slab first.

Same grid, split-K runs and in-kernel reduction as kernels_decode.py (a `dk` config's twin): grid
(cdiv(N, BN), SPLIT), each CTA a BN-row slab of W over a contiguous run of K tiles. Before anything
else the CTA issues `prefetch.global.L2::evict_last` (`_pfn{P}`: `prefetch.global.L2`, normal
priority) for every 128-byte line of the first P tiles of its run (BN rows x P * BK columns; rows
are K-contiguous, so a row's run is one contiguous segment); a prefetch is fire-and-forget (no
register, no wait), so the whole slab is in flight from the CTA's first cycles whatever num_stages
allows. Then the usual K loop reads W, now mostly L2 hits (Triton 3.6 pipelines it through cp.async,
num_stages deep).

Under PDL (`_pf{P}_pdl`) the order is: gdc_launch_dependents at the very start (the next kernel in
the stream may launch as soon as every CTA of this one has started), the prefetch, gdc_wait, then
every load of x and W and every store. Why that is safe:
- Every read of x (the previous kernel's output) and every write (y, the workspace, the counters)
  comes after gdc_wait, which returns only once the previous grid has completed and its memory is
  visible. W is only *prefetched* before the wait, and L2 is the GPU's point of coherence: a line
  prefetched before the previous kernel writes it is updated in L2 by that write, so (unlike the
  `_pdl` configs, which load W's first tile into registers before the wait) a `_pf` config stays
  correct even when the kernel right before it wrote the weight.
- A chain A -> B -> C of such kernels: B launches once all of A's CTAs have started; B's CTAs that
  find free slots prefetch while A runs, then block in gdc_wait until A completes. C launches once
  all of B's CTAs have started, so C can prefetch during A's tail only if B's whole grid became
  resident beside A; C's wait covers only B, but B cannot complete before its own wait returned, so
  C also runs after A completed (writes of A visible: A's completion flushed them). What cannot
  overlap: any load of x or store with the previous kernel (the waits), and a CTA of B that does
  not find a slot (smem, registers, the CTA limit) before A's CTAs exit: a grid that fills every
  slot leaves the next kernel nothing to prefetch with until it drains, so configs whose grid or
  shared memory fills only part of the SM (bench/decode_pf.py reports CTAs per SM) overlap more.
- Consecutive calls of one config share the launcher's workspace and counters: call i + 1 touches
  them only after its gdc_wait, i.e. after call i completed, and call i's last split leaves its
  counter (and the `_at` workspace) zero before it exits.
- The cascade: a successor that launches early triggers its own successor at once, so when the
  CTAs of several calls all fit on the SMs (a grid of one partial wave), several kernels can be
  resident and prefetching at the same time, past what L2 holds. `_pfw{P}_pdl` calls
  gdc_launch_dependents right after gdc_wait instead: kernel i + 1 launches only once kernel i
  passed its wait (kernel i - 1 completed), so one successor at most prefetches ahead.
- Without PDL (`_pf{P}`) the kernel has no grid dependency control: it is the same prefetch as a
  deep, register-free read-ahead of one kernel, launched in stream order.
What it costs: L2 capacity (60 MiB in two partitions; lines of the far partition may be held twice),
and with evict_last a priority that outlives the read (Triton's cp.async loads carry no eviction
hint to demote a line once consumed): such lines are evicted after normal ones, so they can crowd
out other data (a KV cache) until newer evict_last lines replace them; `_pfn` measures the normal
priority against it. Only CTAs resident before the previous kernel ends prefetch early; each holds
BN x P x BK x 2 bytes, so the early footprint is (resident CTAs) x that. P caps it: a 117 MB weight
(14336 x 4096) would not fit, and lines prefetched too early would be evicted (by the previous
kernel's stream or by later prefetches) before they are read, costing the bytes twice. The configs
the bench runs (configs_decode.pf_grid) use P = 1-8 tiles of 256 columns: 16-64 KB per CTA for the
many-CTA configs (a few MB to ~17 MB over a wave of 264 resident CTAs) and 256 KB for the one-wave
configs at 4096 x 4096 (128 CTAs: the whole 33.6 MB weight, which fits; at larger N those P = 8
configs can over-fill L2, which the bench shows as a loss there). A row whose run does not start on
a 128-byte line (K * 2 not a multiple of 128, or a sliced weight) has one line at its end left to
the loop. Under the Triton interpreter the prefetch and PDL are off (it runs no inline PTX and has
no grid dependency control).
Imports triton, never torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+ (the validity predicate refuses _pdl configs elsewhere)
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass

from tunedb.families.gemm.kernels_common import NO_SPECIALIZE
from tunedb.families.gemm.kernels_decode import DecodeSpec, finish_splitk

LINE = 64  # 2-byte elements per 128-byte L2 line
CHUNK = 1024  # prefetch addresses per step: 8 per thread at 4 warps (int64 registers)


@triton.jit
def slab_lines(pid_n, N, K, kt_lo, kt_hi, c, BN: tl.constexpr, BK: tl.constexpr, PF: tl.constexpr,
               CH: tl.constexpr):
    """Element offsets into W (and whether to fetch each) of lines c .. c + CH of this CTA's slab:
    row-major over (row, line), P * BK / 64 lines per row starting at the line holding the run's
    first element. Every fetched offset lies inside the row's prefetched segment or the line-aligned
    sliver before it (so inside W); an unfetched one is clamped to the row's first element."""
    LINES: tl.constexpr = PF * BK // 64
    idx = c + tl.arange(0, CH)
    row = idx // LINES
    line = idx % LINES
    r = ((pid_n * BN + row) % N).to(tl.int64)  # wrapped like the loop's loads: edge slabs stay in W
    start = r * K + kt_lo * BK
    end = r * K + tl.minimum(tl.minimum(kt_lo + PF, kt_hi) * BK, K)
    offs = start - start % 64 + line.to(tl.int64) * 64
    on = offs < end
    return tl.where(on, offs, start), on


@triton.jit
def _prefetch_l2(ptrs, on, LAST: tl.constexpr):
    # non-pure: the compiler must neither drop nor move it past the wait; its dummy result (0)
    # is folded into the run's first K tile below
    if LAST:
        z = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, on.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        z = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, on.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    return z


@triton.jit
def prefetch_slab(w_ptr, pid_n, N, K, kt_lo, kt_hi, BN: tl.constexpr, BK: tl.constexpr, PF: tl.constexpr,
                  CH: tl.constexpr, LAST: tl.constexpr):
    """Issue the slab's L2 prefetches; returns 0 (from the asm, so the prefetch stays live)."""
    LINES: tl.constexpr = PF * BK // 64
    zero = tl.zeros((CH,), dtype=tl.int32)
    for c in range(0, BN * LINES, CH):
        offs, on = slab_lines(pid_n, N, K, kt_lo, kt_hi, c, BN, BK, PF, CH)
        zero |= _prefetch_l2(w_ptr + offs, on, LAST)
    return tl.max(zero, axis=0)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def decode_pf_kernel(x_ptr, w_ptr, y_ptr, b_ptr, ws_ptr, cnt_ptr, M, N, K, HAS_BIAS, ACT,
                     BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
                     PF: tl.constexpr, CH: tl.constexpr, LAST: tl.constexpr, EARLY: tl.constexpr,
                     PDL: tl.constexpr):
    """y[M, N] = act(x[M, K] @ w[N, K]^T + b) for M <= 16; x, w, y contiguous. PF = 0: no prefetch."""
    BM: tl.constexpr = 16
    if PDL and EARLY:
        tl.extra.cuda.gdc_launch_dependents()  # first: the next kernel may start its own prefetch
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    k_tiles = tl.cdiv(K, BK)
    kt_lo = split * k_tiles // SPLIT
    kt_hi = (split + 1) * k_tiles // SPLIT
    if PF > 0:
        # the asm's 0 joins the run's start: the prefetch stays live, and W and x addresses
        # (kt_lo * BK) keep their alignment, so their loads stay 16-byte vectors
        kt_lo += prefetch_slab(w_ptr, pid_n, N, K, kt_lo, kt_hi, BN, BK, PF, CH, LAST)
    if PDL:
        # x is the previous kernel's output and everything below writes: only after it completes
        tl.extra.cuda.gdc_wait()
        if not EARLY:  # `_pfw`: one successor at a time prefetches ahead
            tl.extra.cuda.gdc_launch_dependents()
    cols = pid_n * BN + tl.arange(0, BN)
    cols_in = (cols % N).to(tl.int64)
    rows = tl.arange(0, BM)
    row_ok = rows < M
    offs_k = tl.arange(0, BK)
    w_ptrs = w_ptr + cols_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    x_ptrs = x_ptr + rows[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kt in range(kt_lo, kt_hi):
        k_left = K - kt * BK
        w = tl.load(w_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        x = tl.load(x_ptrs, mask=row_ok[:, None] & (offs_k[None, :] < k_left), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        w_ptrs += BK
        x_ptrs += BK
    finish_splitk(acc, y_ptr, b_ptr, ws_ptr, cnt_ptr, rows, cols, row_ok, pid_n, split, N, HAS_BIAS, ACT,
                  BM, BN, SPLIT, ATOMIC)


def chunk(bn: int, bk: int, pf: int) -> int:
    """Prefetch addresses per step: the slab's lines, at most CHUNK (both powers of two)."""
    return min(CHUNK, bn * pf * bk // LINE)


@dataclass(frozen=True)
class PrefetchSpec(DecodeSpec):
    """The prefetch kernel's launch: the decode kernel's (launch_pdl for `_pdl`, PDL off under the
    interpreter), and no prefetch under the interpreter."""

    @property
    def kernel(self) -> Any:
        return decode_pf_kernel

    def kwargs(self, interpret: bool = False) -> dict[str, Any]:
        kw = super().kwargs(interpret)
        if interpret:
            kw["PF"] = 0
        return kw


def spec(cfg) -> PrefetchSpec:
    _, bn, bk = cfg.param("block")
    split, atomic, pdl, pf = cfg.param("split_k"), bool(cfg.param("atomic")), bool(cfg.param("pdl")), cfg.param("pf")
    cx = (("BN", bn), ("BK", bk), ("SPLIT", split), ("ATOMIC", atomic), ("PF", pf), ("CH", chunk(bn, bk, pf)),
          ("LAST", not cfg.param("pf_normal")), ("EARLY", not cfg.param("pf_late")), ("PDL", pdl))
    return PrefetchSpec("decode_pf", cx, cfg.param("warps"), cfg.param("stages"), pdl=pdl)
