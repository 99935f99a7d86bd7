"""The triton_decode lane (M <= 16): one kernel streams W at the memory limit, split-K reduced inside it.

Grid (cdiv(N, BN), SPLIT). Each CTA owns a BN-row slab of W and a contiguous run of K tiles
(the runs differ by at most one tile). x (M <= 16 rows, masked up to a 16-row tensor-core tile)
is reloaded from L2 with every W tile; W tiles are [BN, BK] rows of K-contiguous bf16/fp16 (16-byte
vectors), pipelined num_stages deep. The first W tile is loaded before `gdc_wait`: under
programmatic dependent launch (PDL) the weight stream starts while the previous kernel drains,
and x (that kernel's output) is read only after the wait. Every store (y, the workspace, the
counters) also comes after the wait, so a PDL chain never writes what its predecessor reads.
The one read before the wait is W's first tile: a `_pdl` config assumes the kernel just before
it in the stream did not write the weight (true of a model's forward; not of a weight update
issued right before the call, which would need a non-PDL config).

Split-K (SPLIT > 1), reduced in the same kernel:
- deterministic (the default): each split stores its fp32 partial in ws[block, split, 16, BN];
  an atomic counter per N block (acq_rel) finds the last split to arrive, which sums the partials
  in split order 0..SPLIT-1, applies bias and activation, writes y and resets the counter.
  Whichever CTA is last, the sum has the same order: the same inputs give the same bits.
- atomic (`_at`): splits accumulate into ws[block, 16, BN] with fp32 atomic adds (no partial
  planes written to and read back from memory); the last one applies the epilogue and zeroes
  the workspace for the next call. The order of the additions, so the low bits, varies by run.
Counters and the atomic workspace are left zero by every call (self-cleaning), so the launcher
allocates them once. Imports triton, never torch.
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

from tunedb.families.gemm.kernel_specs import KernelSpec
from tunedb.families.gemm.kernels_common import NO_SPECIALIZE, epilogue
from tunedb.records import Config

BM_PAD = 16  # x's rows padded to one tensor-core tile
POINTERS = ("io", "io", "io", "io", "f32", "i32")
INTS = ("M", "N", "K", "HAS_BIAS", "ACT")


@triton.jit
def finish_splitk(acc, y_ptr, b_ptr, ws_ptr, cnt_ptr, rows, cols, row_ok, pid_n, split, N, HAS_BIAS, ACT,
                  BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr):
    """One CTA's [BM, BN] fp32 partial of N block `pid_n` into y: stored with the epilogue when
    SPLIT == 1, else reduced in the kernel as the module docstring says (the last split to arrive
    sums, applies the epilogue, stores y and leaves the workspace and its counter zero). Shared by
    the decode kernels whose CTAs each own one split of one N block."""
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
                for s in tl.static_range(SPLIT):
                    total += tl.load(first + s * (BM * BN) + tile, mask=row_mask, other=0.0,
                                     cache_modifier=".cg")
            tl.atomic_xchg(cnt_ptr + pid_n, 0)
            total = epilogue(total, b_ptr, cols, N, HAS_BIAS, ACT)
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=NO_SPECIALIZE)
def decode_kernel(x_ptr, w_ptr, y_ptr, b_ptr, ws_ptr, cnt_ptr, M, N, K, HAS_BIAS, ACT,
                  BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, ATOMIC: tl.constexpr,
                  PDL: tl.constexpr):
    """y[M, N] = act(x[M, K] @ w[N, K]^T + b) for M <= 16; x, w, y contiguous."""
    BM: tl.constexpr = 16
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)
    cols_in = (cols % N).to(tl.int64)  # wrapped: edge-slab W loads stay in bounds, unmasked in N
    rows = tl.arange(0, BM)
    row_ok = rows < M
    offs_k = tl.arange(0, BK)
    k_tiles = tl.cdiv(K, BK)
    kt_lo = split * k_tiles // SPLIT
    kt_hi = (split + 1) * k_tiles // SPLIT
    w_ptrs = w_ptr + cols_in[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    x_ptrs = x_ptr + rows[:, None] * K + (kt_lo * BK + offs_k)[None, :]
    k_left = K - kt_lo * BK
    w = tl.load(w_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
    if PDL:
        # x is the previous kernel's output: read it (and write anything) only after it completes
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(x_ptrs, mask=row_ok[:, None] & (offs_k[None, :] < k_left), other=0.0)
    acc = tl.dot(x, tl.trans(w))
    for kt in range(kt_lo + 1, kt_hi):
        w_ptrs += BK
        x_ptrs += BK
        k_left = K - kt * BK
        w = tl.load(w_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        x = tl.load(x_ptrs, mask=row_ok[:, None] & (offs_k[None, :] < k_left), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    finish_splitk(acc, y_ptr, b_ptr, ws_ptr, cnt_ptr, rows, cols, row_ok, pid_n, split, N, HAS_BIAS, ACT,
                  BM, BN, SPLIT, ATOMIC)


@dataclass(frozen=True)
class DecodeSpec(KernelSpec):
    """The decode kernel's launch: constexprs, num_warps/num_stages and launch_pdl for `_pdl`."""

    pdl: bool = False

    @property
    def kernel(self) -> Any:
        return decode_kernel

    def kwargs(self, interpret: bool = False) -> dict[str, Any]:
        """Under the interpreter PDL is off: it has no grid dependency control."""
        kw = super().kwargs()
        if self.pdl and not interpret:
            kw["launch_pdl"] = True
        else:
            kw["PDL"] = False
        return kw


def spec(cfg: Config) -> DecodeSpec:
    """The launch of a triton_decode config: this kernel for `dk`, the stream kernel for `ds`, the
    prefetch twin (kernels_decode_pf.py) for `dk..._pf{P}`."""
    if cfg.param("kernel") == "stream":
        from tunedb.families.gemm import kernels_decode_stream

        return kernels_decode_stream.spec(cfg)
    if cfg.param("pf"):
        from tunedb.families.gemm import kernels_decode_pf

        return kernels_decode_pf.spec(cfg)
    _, bn, bk = cfg.param("block")
    split, atomic, pdl = cfg.param("split_k"), bool(cfg.param("atomic")), bool(cfg.param("pdl"))
    cx = (("BN", bn), ("BK", bk), ("SPLIT", split), ("ATOMIC", atomic), ("PDL", pdl))
    return DecodeSpec("decode", cx, cfg.param("warps"), cfg.param("stages"), pdl=pdl)


def grid_of(sp: DecodeSpec, n: int, k: int) -> Callable[[int, int], tuple[int, ...]]:
    """The launch grid at (N, K) = (n, k) as grid(M, sms) (a `ds` config's splits depend on K)."""
    if sp.name == "decode_stream":
        from tunedb.families.gemm import kernels_decode_stream

        return kernels_decode_stream.grid_of(sp, n, k)
    cx = dict(sp.constexprs)
    shape = (-(-n // cx["BN"]), cx["SPLIT"])
    return lambda m, sms: shape


def workspace_sizes(sp: DecodeSpec, n: int, k: int) -> tuple[int, int]:
    """(fp32 workspace elements, int32 counters) for N = n: sized for 16 rows, so one
    allocation serves every M <= 16."""
    if sp.name == "decode_stream":
        from tunedb.families.gemm import kernels_decode_stream

        return kernels_decode_stream.workspace_sizes(sp, n, k)
    cx = dict(sp.constexprs)
    blocks, split = -(-n // cx["BN"]), cx["SPLIT"]
    if split == 1:
        return 1, 1
    planes = blocks if cx["ATOMIC"] else blocks * split
    return planes * BM_PAD * cx["BN"], blocks
