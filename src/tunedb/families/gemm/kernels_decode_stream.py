"""The triton_decode lane's streaming kernel (`ds` configs): W read the way the pure read is.

Why the `dk` kernel (kernels_decode.py) trails a pure read of the weight (BENCHMARKS.md, "The
decode lane against the physical read limit"; diagnosis in docs/decode_stream.md): its CTAs are
few and fat (a 128 x 128 x 4-stage ring needs 147 KB of shared memory: one CTA per SM), each runs a
short K loop whose first tile is peeled into registers and consumed by a tl.dot before the
software pipeline's prologue issues the next loads (one whole DRAM latency per CTA with nothing
else in flight on its SM), and 256 such CTAs on 132 SMs are two waves. The read kernel instead
keeps 8 x 16-byte loads per thread in flight in many small CTAs that the hardware streams
through the SMs.

This kernel mirrors it. A CTA owns TILES consecutive K tiles (a constexpr: the loop is unrolled,
and TILES = 1 compiles no loop at all) of one BN-row block, so a block has SPLIT =
cdiv(cdiv(K, BK), TILES) CTAs, adjacent in launch order (pid = block * SPLIT + split): they run
together and the block's reduction starts as soon as its last W bytes land. A CTA loads a whole
[BN, BK] slab of W in one tl.load (BK contiguous bf16 per row: 16-byte vectors, BN * BK /
(32 * warps) elements per thread in flight, no shared-memory ring) and loads slab t + 1 before it
multiplies slab t (a register double buffer: Triton 3.6 pipelines no plain loads).
Two ways to multiply, a constexpr:
- tl.dot (default): x padded to 16 rows (masked rows are not fetched) against the slab on the
  tensor cores, through a shared-memory layout conversion;
- FMA (`_fma`): no tensor cores, for small M; W stays in registers and each of the M rows of x is
  a broadcast multiply and a row sum (M x the FMAs: meant for M <= 4).
Split-K is reduced in the same kernel, exactly as kernels_decode.py does it (deterministic by
default: partial planes summed in split order by the last split to arrive; `_at`: fp32 atomics
into a self-cleaning workspace). `_pdl` loads the first W slab before gdc_wait; x is read and
everything is written after it. Imports triton, never torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+ (the validity predicate refuses _pdl configs elsewhere)
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass

from tunedb.families.gemm.kernels_common import NO_SPECIALIZE, epilogue
from tunedb.families.gemm.kernels_decode import DecodeSpec
from tunedb.records import Config

BM_PAD = 16  # output rows a block's workspace plane holds (every M <= 16)


@triton.jit
def _tile_dot(acc, x_ptr, w, k0, M, K, BM: tl.constexpr, BK: tl.constexpr):
    rows = tl.arange(0, BM)
    offs_k = k0 + tl.arange(0, BK)
    x = tl.load(x_ptr + rows[:, None] * K + offs_k[None, :],
                mask=(rows[:, None] < M) & (offs_k[None, :] < K), other=0.0)
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _tile_fma(acc, x_ptr, w, k0, M, K, BM: tl.constexpr, BK: tl.constexpr):
    rows = tl.arange(0, BM)
    offs_k = k0 + tl.arange(0, BK)
    wf = w.to(tl.float32)
    for m in range(0, M):
        xm = tl.load(x_ptr + m * K + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        part = tl.sum(wf * xm[None, :], axis=1)
        acc = tl.where(rows[:, None] == m, acc + part[None, :], acc)
    return acc


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def stream_kernel(x_ptr, w_ptr, y_ptr, b_ptr, ws_ptr, cnt_ptr, M, N, K, HAS_BIAS, ACT,
                  BN: tl.constexpr, BK: tl.constexpr, TILES: tl.constexpr, FMA: tl.constexpr,
                  ATOMIC: tl.constexpr, PDL: tl.constexpr):
    """y[M, N] = act(x[M, K] @ w[N, K]^T + b) for M <= 16; x, w, y contiguous. Each CTA owns
    TILES consecutive K tiles of one BN-row block; SPLIT = cdiv(cdiv(K, BK), TILES) CTAs per block."""
    BM: tl.constexpr = 16
    SPLIT = tl.cdiv(tl.cdiv(K, BK), TILES)
    pid = tl.program_id(0)
    pid_n = pid // SPLIT
    split = pid % SPLIT
    cols = pid_n * BN + tl.arange(0, BN)
    cols_in = (cols % N).to(tl.int64)  # wrapped: edge-slab W loads stay in bounds, unmasked in N
    offs_k = tl.arange(0, BK)
    k0 = split * (TILES * BK)
    w_ptrs = w_ptr + cols_in[:, None] * K + (k0 + offs_k)[None, :]
    w = tl.load(w_ptrs, mask=offs_k[None, :] < K - k0, other=0.0)
    if PDL:
        # x is the previous kernel's output: read it (and write anything) only after it completes
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for t in tl.static_range(1, TILES):
        # slab t is in flight while slab t - 1 is multiplied (a tile past K is fully masked: no bytes)
        w_next = tl.load(w_ptrs + t * BK, mask=offs_k[None, :] < K - k0 - t * BK, other=0.0)
        if FMA:
            acc = _tile_fma(acc, x_ptr, w, k0 + (t - 1) * BK, M, K, BM, BK)
        else:
            acc = _tile_dot(acc, x_ptr, w, k0 + (t - 1) * BK, M, K, BM, BK)
        w = w_next
    if FMA:
        acc = _tile_fma(acc, x_ptr, w, k0 + (TILES - 1) * BK, M, K, BM, BK)
    else:
        acc = _tile_dot(acc, x_ptr, w, k0 + (TILES - 1) * BK, M, K, BM, BK)

    rows = tl.arange(0, BM)
    row_ok = rows < M
    out_mask = row_ok[:, None] & (cols[None, :] < N)
    y_ptrs = y_ptr + rows[:, None] * N + cols[None, :]
    if SPLIT == 1:
        acc = epilogue(acc, b_ptr, cols, N, HAS_BIAS, ACT)
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        tile = rows[:, None] * BN + tl.arange(0, BN)[None, :]
        row_mask = row_ok[:, None] & (tile >= 0)
        if ATOMIC:
            plane = ws_ptr + pid_n.to(tl.int64) * (BM * BN)
            tl.atomic_add(plane + tile, acc, mask=row_mask, sem="relaxed")
        else:
            plane = ws_ptr + (pid_n.to(tl.int64) * SPLIT + split) * (BM * BN)
            tl.store(plane + tile, acc, mask=row_mask)
        tl.debug_barrier()  # every thread's partial is issued before the counter releases it
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT - 1:
            tl.debug_barrier()
            total = tl.zeros((BM, BN), dtype=tl.float32)
            if ATOMIC:
                total = tl.load(plane + tile, mask=row_mask, other=0.0, cache_modifier=".cg")
                tl.store(plane + tile, tl.zeros((BM, BN), dtype=tl.float32), mask=row_mask)
            else:
                first = ws_ptr + pid_n.to(tl.int64) * SPLIT * (BM * BN)
                # split order 0, 1, ..., SPLIT - 1 (the same inputs give the same bits), eight
                # partial planes in flight per step
                for s0 in range(0, SPLIT, 8):
                    for j in tl.static_range(8):
                        here = row_mask & (tile * 0 + s0 + j < SPLIT)
                        total += tl.load(first + (s0 + j) * (BM * BN) + tile, mask=here, other=0.0,
                                         cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            total = epilogue(total, b_ptr, cols, N, HAS_BIAS, ACT)
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)


@dataclass(frozen=True)
class StreamSpec(DecodeSpec):
    """The stream kernel's launch: the decode kernel's (launch_pdl for `_pdl`, PDL off under the
    interpreter), num_stages 1 (the double buffer is in registers)."""

    @property
    def kernel(self) -> Any:
        return stream_kernel


def spec(cfg: Config) -> StreamSpec:
    _, bn, bk = cfg.param("block")
    atomic, pdl = bool(cfg.param("atomic")), bool(cfg.param("pdl"))
    cx = (("BN", bn), ("BK", bk), ("TILES", cfg.param("tiles")), ("FMA", bool(cfg.param("fma"))),
          ("ATOMIC", atomic), ("PDL", pdl))
    # num_stages 1: the kernel has no loop for Triton's pipeliner (its double buffer is unrolled)
    return StreamSpec("decode_stream", cx, cfg.param("warps"), 1, pdl=pdl)


def splits(sp: StreamSpec, k: int) -> int:
    """CTAs per N block at K = k: TILES K tiles each (the kernel computes the same number)."""
    cx = dict(sp.constexprs)
    return -(-(-(-k // cx["BK"])) // cx["TILES"])


def grid_of(sp: StreamSpec, n: int, k: int) -> Callable[[int, int], tuple[int]]:
    shape = (-(-n // dict(sp.constexprs)["BN"]) * splits(sp, k),)
    return lambda m, sms: shape


def workspace_sizes(sp: StreamSpec, n: int, k: int) -> tuple[int, int]:
    """(fp32 workspace elements, int32 counters) for (N, K) = (n, k), sized for 16 rows (every M <= 16)."""
    cx = dict(sp.constexprs)
    blocks, split = -(-n // cx["BN"]), splits(sp, k)
    if split == 1:
        return 1, 1
    planes = blocks if cx["ATOMIC"] else blocks * split
    return planes * BM_PAD * cx["BN"], blocks
