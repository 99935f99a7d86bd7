"""The GEMM decode lane's bf16/fp16 GEMV kernel (`gv` configs, M <= 16): y = act(x @ W^T + b)
with W [N, K] row-major as nn.Linear stores it, fp32 accumulation, y in x's dtype.

Why a third decode kernel: at M <= 16 the call is a weight stream. The `dk` kernel's slabs are
32-128 rows wide, so at N = 4096 its grid is 32-128 CTAs per split and it needs split-K to fill
the SMs; it reached 74.1% of 4.3 TB/s at 4096x4096 (BENCHMARKS.md, s11 B) where a pure read of
the same bytes reaches 99.8%. The fp8/int8 GEMV (scaled_mm/kernels_gemv.py, same design, one-byte
weights) moved 1.19-1.21x the bytes/s of that lane at M=1. Here, for two-byte weights:
- W streamed as [BN, BK] slabs of K-contiguous bytes (16-byte vector loads: 8 elements), its N
  rows wrapped (row % N) so no W load is masked in N; only the K tail is masked.
- FMA path (DOT false, M <= 4): each weight converted to fp32 in registers and multiplied by the
  M activation rows, summed over the tile's K inside each thread then across lanes: no padding of
  M to a 16-row tensor-core tile, so slabs of 4-16 rows are fine and an unsplit grid at N = 4096
  already holds 256-1024 CTAs (several per SM, several 16-byte loads in flight per thread).
  Summed every tile, the reduction (5 shuffles a row and a shared-memory step when warps split K)
  is about half the loop's instructions at sm90 (~590 PTX lines a 16x512 tile at 4 warps: ~2.4
  instructions a cycle per SM to keep up with 4.3 TB/s); LATE (`_lr`) instead accumulates the
  [BN, BK] products in registers and sums once after the loop (the same register bound).
- mma path (DOT true, any M <= 16): one tensor-core dot per K tile against x padded to 16 rows
  (rows past M masked: zero-filled, not read), BN >= 16.
- Bytes in flight from the start: the first W tile is loaded before the K loop and its product
  taken after it, so the loop's pipeline prologue (STAGES - 1 tiles by cp.async; `tl.range` with
  an explicit num_stages pipelines the loads of a loop with or without a dot) is requested while
  it is in flight: a CTA starts with STAGES tiles requested.
- Split-K (SPLIT > 1), deterministic: kernels_decode.finish_splitk, the `dk` kernel's own finish
  (partials in ws[slab, split, MP, BN], an acq_rel counter per slab, the last split sums them in
  split order 0..SPLIT-1 and applies the epilogue, counters left zero): same inputs, same bits.
- PDL (`_pdl` twins, launch_pdl on sm90, Triton 3.4+): the first W tile is loaded before
  gdc_wait; x, the bias and every store come after it. As for the `dk` `_pdl` configs, this
  assumes the kernel just before it did not write the weight: the run time serves a `_pdl`
  config only inside a CUDA-graph capture and for an nn.Parameter weight (launch_gemv.py).
- PRE (`_p{PRE}`): the first tile is PRE K tiles wide, so with PDL that many of a CTA's tiles
  are requested before gdc_wait (session 34, bench/gv_prefetch.py: back to back in a graph, M=1,
  one W tile before the wait moved 59% / 78% of 4.3 TB/s at 16.8 / 33.6 MB, four to eight 72% /
  81%; a pure read that loads half its bytes first 93% / 98%). Its product is taken after the
  loop (with `_lr` summed at once, outside the [BN, BK] accumulators).
Under the interpreter PDL is off (no grid dependency control). Imports triton, never torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+ (configs_gemv refuses _pdl configs elsewhere)
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass

from tunedb.families.gemm.kernels_common import NO_SPECIALIZE
from tunedb.families.gemm.kernels_decode import finish_splitk
from tunedb.records import Config


@triton.jit
def _fma_row(wf, x_ptr, R: tl.constexpr, M, K, kt, offs_k, k_ok, BK: tl.constexpr, LATE: tl.constexpr):
    """Row R (wrapped past M) of one K tile's product wf[n, k] * x[R, k]: summed over k -> [BN]
    fp32, or with LATE left [BN, BK] for the caller to accumulate and sum once after the loop.
    x's row is a 1-D vector in the layout of wf's K axis: no layout change of the W tile; the sum
    runs inside each thread's 16 bytes, then across lanes (shuffles) and warps (shared memory)."""
    row = (R % M).to(tl.int64)
    xr = tl.load(x_ptr + row * K + kt * BK + offs_k, mask=k_ok, other=0.0)
    prod = wf * xr.to(tl.float32)[None, :]
    if not LATE:
        prod = tl.sum(prod, axis=1)
    return prod


@triton.jit
def _fma_tile(w, x_ptr, a0, a1, a2, a3, M, K, kt, offs_k, k_ok, MP: tl.constexpr, BK: tl.constexpr,
              LATE: tl.constexpr):
    """a_r += row r's product for r < MP (MP <= 4: one accumulator per row, [BN] or with LATE
    [BN, BK])."""
    wf = w.to(tl.float32)
    a0 += _fma_row(wf, x_ptr, 0, M, K, kt, offs_k, k_ok, BK, LATE)
    if MP > 1:
        a1 += _fma_row(wf, x_ptr, 1, M, K, kt, offs_k, k_ok, BK, LATE)
    if MP > 2:
        a2 += _fma_row(wf, x_ptr, 2, M, K, kt, offs_k, k_ok, BK, LATE)
        a3 += _fma_row(wf, x_ptr, 3, M, K, kt, offs_k, k_ok, BK, LATE)
    return a0, a1, a2, a3


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def gemm_gemv_kernel(x_ptr, w_ptr, y_ptr, b_ptr, ws_ptr, cnt_ptr, M, N, K, HAS_BIAS, ACT,
                     BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, MP: tl.constexpr,
                     DOT: tl.constexpr, LATE: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr,
                     PRE: tl.constexpr = 1):
    """y[M, N] = act(x[M, K] @ w[N, K]^T + b), M <= MP (16 with DOT, <= 4 without); x, w, y
    contiguous; grid (cdiv(N, BN), SPLIT). The first PRE K tiles of the split are one wide tile."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)
    cols_in = (cols % N).to(tl.int64)  # wrapped: edge-slab W loads stay in bounds, unmasked in N
    rows = tl.arange(0, MP)
    row_ok = rows < M
    offs_k = tl.arange(0, BK)
    k_tiles = tl.cdiv(K, BK)
    kt_lo = split * k_tiles // SPLIT
    kt_hi = (split + 1) * k_tiles // SPLIT
    w_ptrs = w_ptr + cols_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    k_left = K - kt_lo * BK
    # the first tile is PRE tiles wide, masked to this split's own K range (a split shorter than
    # PRE tiles must not read its neighbour's)
    offs_p = tl.arange(0, PRE * BK)
    p_ok = offs_p < tl.minimum(k_left, (kt_hi - kt_lo) * BK)
    w0 = tl.load(w_ptr + cols_in[:, None] * K + (kt_lo * BK + offs_p)[None, :], mask=p_ok[None, :], other=0.0,
                 eviction_policy="evict_first")
    if PDL:
        # x and the bias are the previous kernels' outputs: read them (and write anything) after
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # w0's product is taken after the loop (the module docstring: STAGES tiles in flight)
    if DOT:
        # x's rows past M masked, not wrapped: a masked-off row is zero-filled without a read, so
        # at M=1 a tile moves BK x 2 bytes of x from L2 beside BN x BK x 2 of W, not 16 rows of it
        x_ptrs = x_ptr + rows[:, None].to(tl.int64) * K + (kt_lo * BK + offs_k)[None, :]
        acc = tl.zeros((MP, BN), dtype=tl.float32)
        for kt in tl.range(kt_lo + PRE, kt_hi, num_stages=STAGES):
            off = (kt - kt_lo) * BK
            k_ok = offs_k[None, :] < K - kt * BK
            w = tl.load(w_ptrs + off, mask=k_ok, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs + off, mask=row_ok[:, None] & k_ok, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + (kt_lo * BK + offs_p)[None, :],
                    mask=row_ok[:, None] & p_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w0), acc)
    else:
        if LATE:  # `_lr`: the [BN, BK] products accumulated, summed over K once after the loop
            a0 = tl.zeros((BN, BK), dtype=tl.float32)
        else:  # summed over K every tile (shuffles and a shared-memory step per tile and row)
            a0 = tl.zeros((BN,), dtype=tl.float32)
        a1 = a0
        a2 = a0
        a3 = a0
        for kt in tl.range(kt_lo + PRE, kt_hi, num_stages=STAGES):
            kl = K - kt * BK
            w = tl.load(w_ptrs + (kt - kt_lo) * BK, mask=offs_k[None, :] < kl, other=0.0,
                        eviction_policy="evict_first")
            a0, a1, a2, a3 = _fma_tile(w, x_ptr, a0, a1, a2, a3, M, K, kt, offs_k, offs_k < kl, MP, BK, LATE)
        if LATE and PRE > 1:  # the wide tile's [BN, PRE x BK] products fit no [BN, BK] accumulator
            z = tl.zeros((BN,), dtype=tl.float32)
            p0, p1, p2, p3 = _fma_tile(w0, x_ptr, z, z, z, z, M, K, kt_lo, offs_p, p_ok, MP, BK, False)
        else:
            a0, a1, a2, a3 = _fma_tile(w0, x_ptr, a0, a1, a2, a3, M, K, kt_lo, offs_p, p_ok, MP, BK, LATE)
        if LATE:
            a0 = tl.sum(a0, axis=1)
            if MP > 1:
                a1 = tl.sum(a1, axis=1)
            if MP > 2:
                a2 = tl.sum(a2, axis=1)
                a3 = tl.sum(a3, axis=1)
            if PRE > 1:
                a0 += p0
                if MP > 1:
                    a1 += p1
                if MP > 2:
                    a2 += p2
                    a3 += p3
        # the rows' accumulators into one [MP, BN] tile, once per CTA
        acc = tl.where(rows[:, None] == 0, a0[None, :], 0.0)
        if MP > 1:
            acc += tl.where(rows[:, None] == 1, a1[None, :], 0.0)
        if MP > 2:
            acc += tl.where(rows[:, None] == 2, a2[None, :], 0.0) + tl.where(rows[:, None] == 3, a3[None, :], 0.0)
    finish_splitk(acc, y_ptr, b_ptr, ws_ptr, cnt_ptr, rows, cols, row_ok, pid_n, split, N, HAS_BIAS, ACT,
                  MP, BN, SPLIT, False)


@dataclass(frozen=True)
class GemvSpec:
    """One `gv` launch: constexprs without MP (chosen per call from M), warps, stages, PDL."""

    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    num_stages: int
    pdl: bool = False

    @property
    def kernel(self) -> Any:
        return gemm_gemv_kernel

    def kwargs(self, mp: int, interpret: bool = False) -> dict[str, Any]:
        """The launch's keyword arguments at MP = mp; under the interpreter PDL is off."""
        kw = {**dict(self.constexprs), "MP": mp, "STAGES": self.num_stages, "num_warps": self.num_warps,
              "num_stages": self.num_stages, "PDL": self.pdl and not interpret}
        if kw["PDL"]:
            kw["launch_pdl"] = True
        return kw

    def grid(self, n: int) -> tuple[int, int]:
        cx = dict(self.constexprs)
        return -(-n // cx["BN"]), cx["SPLIT"]

    def workspace_sizes(self, n: int) -> tuple[int, int]:
        """(fp32 workspace elements, int32 counters): sized for 16 rows, so one allocation serves
        every M <= 16 (finish_splitk lays a slab's partials out MP x BN, MP <= 16)."""
        slabs, split = self.grid(n)
        if split == 1:
            return 1, 1
        return slabs * split * 16 * dict(self.constexprs)["BN"], slabs


def spec(cfg: Config) -> GemvSpec:
    """The launch of a `gv` config (configs_gemv.py)."""
    _, bn, bk = cfg.param("block")
    return GemvSpec((("BN", bn), ("BK", bk), ("SPLIT", cfg.param("split_k")), ("DOT", bool(cfg.param("dot"))),
                     ("LATE", bool(cfg.param("late"))), ("PRE", cfg.param("pre", 1))), cfg.param("warps"),
                    cfg.param("stages"), pdl=bool(cfg.param("pdl")))
