"""One launch for two or three sibling projections at 1 to 16 rows (families/gemm/siblings.py):
y_g = act_g(x @ W_g^T (+ b_g)) for g < G, every W_g [N_g, K] row-major as nn.Linear stores it, fp32
accumulation, each y_g its own contiguous [N_g] (one row) or [M, N_g] output in x's dtype.

Why: at decode a layer's q, k and v projections read the same x, and each GEMV pays a fixed cost
(launch, ramp-up, tail) that its bytes do not: 5.4 us for the 8.4 MB k projection at M=1 whose
bytes need 1.95 us at 4.3 TB/s (BENCHMARKS.md, session 35). Programs [0, NB0) stream W_0's
slabs, [NB0, NB0 + NB1) W_1's, the rest W_2's, each in its own branch (three pointers, no
concatenated copy of the weights). A program's slab is BN rows streamed in [BN, BK] tiles of
K-contiguous bytes by a pipelined loop (`tl.range` with num_stages: cp.async prologue of
STAGES - 1 tiles); the products are accumulated in [BN, BK] fp32 registers and summed once after
the loop (the `gv` kernel's `_lr` form, kernels_gemv.py). Rows past N_g are clamped for the loads
and masked for the store; bias and activation are the family's epilogue (kernels_common.py), in
fp32 before the one rounding.

Rows 2..16 (MP = 16, the tensor-core path): x is [M, K] and each y_g [M, N_g]; a program's slab
is BN rows of W_g and one tensor-core dot per K tile, tl.dot(x tile [16, BK], W tile^T), with
x's rows past M masked (zero-filled, never read), as the `gv` kernel's `_mma` configs
(kernels_gemv.py); the tile by the group's size (tile()). With SPLIT > 1 a program takes one
run of K tiles of its slab (grid (blocks, SPLIT)) and the decode lane's deterministic in-kernel
reduction (kernels_decode.finish_splitk) sums the runs in split order: more programs for a group
of few weight rows (q/k/v of 4608-6144 rows is 72-96 programs of 64 rows on 132 SMs, 62-72% of
HBM in session 37), a workspace and counters per group (workspace_sizes). The weight on the MMA's M side,
tl.dot(W tile, x tile^T) into [BN, 16] for sm90's wgmma, lost to this form at every group measured
(session 37 call 2). siblings.py launches it at 2 to TUNEDB_SIBLING_ROWS rows, up to
MMA_MAX_BYTES of weights. Imports triton; torch only inside launch() (its zeroed workspace).
"""
from __future__ import annotations

import functools
from typing import Any

import triton
import triton.language as tl

from tunedb.families.gemm.kernels_common import ACT_CODES, epilogue
from tunedb.families.gemm.kernels_decode import finish_splitk


@triton.jit
def _slab(x_ptr, w_ptr, y_ptr, b_ptr, n, blk, K, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, STAGES: tl.constexpr):
    rows = blk * BN + tl.arange(0, BN)
    row_ok = rows < n
    rows_in = tl.where(row_ok, rows, 0).to(tl.int64)
    offs_k = tl.arange(0, BK)
    w_ptrs = w_ptr + rows_in[:, None] * K + offs_k[None, :]
    acc = tl.zeros((BN, BK), dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        k_ok = offs_k < K - k0
        w = tl.load(w_ptrs + k0, mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
        xv = tl.load(x_ptr + k0 + offs_k, mask=k_ok, other=0.0)
        acc += w.to(tl.float32) * xv.to(tl.float32)[None, :]
    y = epilogue(tl.sum(acc, axis=1)[None, :], b_ptr, rows, n, HAS_BIAS, ACT)  # the family's bias + activation
    tl.store(y_ptr + rows[None, :], y.to(y_ptr.dtype.element_ty), mask=row_ok[None, :])


@triton.jit
def _slab_mma(x_ptr, w_ptr, y_ptr, b_ptr, ws_ptr, cnt_ptr, n, blk, gblk, split, M, K, HAS_BIAS: tl.constexpr,
              ACT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, MP: tl.constexpr,
              SPLIT: tl.constexpr):
    rows = blk * BN + tl.arange(0, BN)
    row_ok = rows < n
    rows_in = tl.where(row_ok, rows, 0).to(tl.int64)
    ms = tl.arange(0, MP)
    m_ok = ms < M
    offs_k = tl.arange(0, BK)
    k_tiles = tl.cdiv(K, BK)
    k_lo = (split * k_tiles // SPLIT) * BK  # this split's run of K tiles (runs differ by one at most)
    k_hi = ((split + 1) * k_tiles // SPLIT) * BK
    w_ptrs = w_ptr + rows_in[:, None] * K + offs_k[None, :]
    x_ptrs = x_ptr + ms[:, None].to(tl.int64) * K + offs_k[None, :]
    acc = tl.zeros((MP, BN), dtype=tl.float32)
    for k0 in tl.range(k_lo, k_hi, BK, num_stages=STAGES):
        k_ok = offs_k < K - k0
        w = tl.load(w_ptrs + k0, mask=k_ok[None, :], other=0.0, eviction_policy="evict_first")
        xv = tl.load(x_ptrs + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(xv, tl.trans(w), acc)
    # SPLIT == 1: the epilogue and the store; else the decode lane's deterministic in-kernel
    # reduction over the group's block index gblk (workspace planes and counters of the whole group)
    finish_splitk(acc, y_ptr, b_ptr, ws_ptr, cnt_ptr, ms, rows, m_ok, gblk, split, n, HAS_BIAS, ACT,
                  MP, BN, SPLIT, False)


@triton.jit
def _member(x_ptr, w_ptr, y_ptr, b_ptr, ws_ptr, cnt_ptr, n, blk, gblk, split, M, K, HAS_BIAS: tl.constexpr,
            ACT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, MP: tl.constexpr,
            SPLIT: tl.constexpr):
    if MP == 1:
        _slab(x_ptr, w_ptr, y_ptr, b_ptr, n, blk, K, HAS_BIAS, ACT, BN, BK, STAGES)
    else:
        _slab_mma(x_ptr, w_ptr, y_ptr, b_ptr, ws_ptr, cnt_ptr, n, blk, gblk, split, M, K, HAS_BIAS, ACT, BN, BK,
                  STAGES, MP, SPLIT)


# K stays specialised: its divisibility by 16 is what lets the W rows load as 16-byte vectors
@triton.jit(do_not_specialize=("N0", "N1", "N2", "NB0", "NB1", "M"))
def siblings_kernel(x_ptr, w0_ptr, w1_ptr, w2_ptr, y0_ptr, y1_ptr, y2_ptr, b0_ptr, b1_ptr, b2_ptr, ws_ptr, cnt_ptr,
                    N0, N1, N2, NB0, NB1, M, K, HAS_BIAS: tl.constexpr, ACT0: tl.constexpr, ACT1: tl.constexpr,
                    ACT2: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                    MP: tl.constexpr = 1, SPLIT: tl.constexpr = 1):
    pid = tl.program_id(0)
    split = tl.program_id(1)  # SPLIT > 1 (the tensor-core path only): this program's share of K
    if pid < NB0:
        _member(x_ptr, w0_ptr, y0_ptr, b0_ptr, ws_ptr, cnt_ptr, N0, pid, pid, split, M, K, HAS_BIAS, ACT0, BN, BK,
                STAGES, MP, SPLIT)
    elif pid < NB0 + NB1:  # with two siblings every program past NB0 (the grid is NB0 + NB1)
        _member(x_ptr, w1_ptr, y1_ptr, b1_ptr, ws_ptr, cnt_ptr, N1, pid - NB0, pid, split, M, K, HAS_BIAS, ACT1,
                BN, BK, STAGES, MP, SPLIT)
    else:
        _member(x_ptr, w2_ptr, y2_ptr, b2_ptr, ws_ptr, cnt_ptr, N2, pid - NB0 - NB1, pid, split, M, K, HAS_BIAS,
                ACT2, BN, BK, STAGES, MP, SPLIT)


MAX_ROWS = 16  # the tensor-core path's tile height


def tile(k: int, m: int = 1, rows: int = 0, sms: int = 0) -> tuple[int, int, int, int, int]:
    """(BN, BK, warps, stages, split) for a group of `rows` weight rows in all at K = k and m rows
    of x. One row: the shipped gemm table's M=1 pick at the Llama widths (`gv1_n16x256_w4_s5_lr`).
    2-16 rows, by the group's rows (session 37 call 2, bench/siblings_gemv.py --rows 2,4,16 over
    eleven groups of 768-37888 rows and 3-272 MB, fourteen tiles): up to 2560 rows 32-row slabs of
    256-wide K tiles (2 warps: enough programs for a small group), up to 6144 64-row slabs (4
    warps, 5 stages), past it 128-row slabs (4 warps, 4 stages). Chosen on that sweep, so
    in-sample: within 3.4% of the best tile at every point, 1.03-3.5x cuBLAS one by one. The gv
    lane's one-warp 16-row slab ran 1.8-2.5x slower. BK narrowed to K's power of two below the
    tile's (16 at least: tl.dot's). At 2-16 rows with `sms` (the GPU's SM count) given, a group
    of too few slabs to fill the SMs splits K (split_for; TUNEDB_SIBLING_SPLIT, default auto)."""
    if m == 1:
        bn, bk, warps, stages = 16, 256, 4, 5
    elif rows <= 2560:
        bn, bk, warps, stages = 32, 256, 2, 4
    elif rows <= 6144:
        bn, bk, warps, stages = 64, 128, 4, 5
    else:
        bn, bk, warps, stages = 128, 128, 4, 4
    while bk > 16 and bk > k:
        bk //= 2
    split = split_for(-(-rows // bn), k, bk, sms) if sms and m > 1 else 1
    return bn, bk, warps, stages, split


SPLIT_MAX, SPLIT_MIN_TILES = 8, 4


def split_for(blocks: int, k: int, bk: int, sms: int) -> int:
    """How many runs to split K into for a group of `blocks` weight slabs (BN rows each) on `sms`
    SMs: as many as keep the programs at one an SM at most (sms // blocks), only where that is two
    or more, at most SPLIT_MAX and each run SPLIT_MIN_TILES K tiles at least (a run must still
    fill its pipeline). Measured (bench/siblings_gemv.py --rows 2,16; session 42 calls 1 and 2,
    H200 and H100, seventeen groups): tensor-parallel shards and MLA down-projections of 768-2112
    rows at K = 4096-8192 (24-66 slabs) ran 1.3-1.7x faster split (Llama-3-8B q/k/v over 8 GPUs
    12.1 -> 7.3 us, DeepSeek-V3's q_a/kv_a 19.7 -> 15.1 us), within 5% of the best of eleven
    split tiles; splitting past one program an SM lost (Llama-3-8B q/k/v's 96 slabs split 3:
    16.5 -> 22.5 us, the rule session 38 wrote), so groups of more slabs than half the SMs stay
    whole."""
    runs = min(sms // max(1, blocks), SPLIT_MAX, -(-k // bk) // SPLIT_MIN_TILES)
    return runs if runs >= 2 else 1


def _tiles(tiles: tuple[int, ...] | None, k: int, m: int, rows: int) -> tuple[int, int, int, int, int]:
    """A tile given as (BN, BK, warps, stages[, split]) (split 1 when left out), or tile()'s; a
    split only on the tensor-core path (2-16 rows) and at most K's tiles."""
    bn, bk, warps, stages, *rest = tiles or tile(k, m, rows)
    split = rest[0] if rest else 1
    if split != 1 and (m == 1 or not 1 <= split <= -(-k // bk)):
        raise ValueError(f"siblings_kernel split {split} at M={m}, K={k}, BK={bk}: K is split only at 2 to "
                         f"{MAX_ROWS} rows, into at most cdiv(K, BK) = {-(-k // bk)} runs")
    return bn, bk, warps, stages, split


def workspace_sizes(ns: tuple[int, ...], k: int, m: int = 1,
                    tiles: tuple[int, ...] | None = None) -> tuple[int, int]:
    """(fp32 workspace elements, int32 counters) of one group's launch at m rows: a split's
    [16, BN] partial per (block, split), a counter per block; (1, 1) when K is not split. The
    counters must start zero; every launch leaves them zero (the reduction is self-cleaning)."""
    bn, _bk, _w, _s, split = _tiles(tiles, k, m, sum(ns))
    if split == 1:
        return 1, 1
    blocks = sum(triton.cdiv(n, bn) for n in ns)
    return blocks * split * MAX_ROWS * bn, blocks


def launch(x, weights, biases, outs, acts=None, interpret: bool = False,
           tiles: tuple[int, ...] | None = None, workspace: tuple[Any, Any] | None = None) -> None:
    """siblings_kernel over x [M, K] or [K] (contiguous, M <= 16), weights [N_g, K] and outs
    [M, N_g] or [N_g] (contiguous; biases [N_g] or all None; acts: each output's activation, a
    name of ACT_CODES, default none), one launch; `tiles` (BN, BK, warps, stages[, split]) in
    place of tile(); `workspace` (fp32, int32 zeros of workspace_sizes()), else made here."""
    k = x.shape[-1]
    m = x.numel() // k
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"siblings_kernel takes 1 to {MAX_ROWS} rows of x, got {m} (x {list(x.shape)})")
    ns = tuple(w.shape[0] for w in weights)
    if workspace is None:
        import torch  # the caller's tensors are torch's; the module itself imports triton only

        sizes = workspace_sizes(ns, k, m, tiles)
        workspace = (x.new_zeros(sizes[0], dtype=torch.float32), x.new_zeros(sizes[1], dtype=torch.int32))
    site, grid = site_for(ns, k, biases[0] is not None, tuple(acts or ("none",) * len(ns)), interpret, tiles, m)
    site(grid, *varying(x.view(-1), weights, biases, [o.view(-1) for o in outs], workspace))


def varying(x, weights, biases, outs, workspace) -> tuple:
    """The tensors of one launch in the kernel's order, padded to three siblings (with two, a third
    branch never taken; without bias the bias pointers are never read), then the workspace and
    counters (read only where K is split)."""
    w = (*weights, *weights[-1:] * (3 - len(weights)))
    y = (*outs, *outs[-1:] * (3 - len(outs)))
    b = (*biases, *biases[-1:] * (3 - len(biases))) if biases[0] is not None else (w[0],) * 3
    return (x, *w, *y, *b, *workspace)


@functools.lru_cache(maxsize=256)
def site_for(ns: tuple[int, ...], k: int, has_bias: bool, acts: tuple[str, ...], interpret: bool = False,
             tiles: tuple[int, ...] | None = None, m: int = 1) -> tuple[Any, tuple[int, ...]]:
    """(launch site, grid) of one group's shapes at m rows: the sizes are fixed arguments, the
    tensors vary (triton_launch.Site: the compiled binary called without JITFunction.run's
    per-call binding, tens of microseconds of host time a launch)."""
    from tunedb.families.gemm.triton_launch import Site

    bn, bk, warps, stages, split = _tiles(tiles, k, m, sum(ns))
    nbs = [triton.cdiv(n, bn) for n in ns]
    full = list(ns) + [ns[-1]] * (3 - len(ns))
    codes = [ACT_CODES[a] for a in acts] + [0] * (3 - len(acts))
    constexprs = {"HAS_BIAS": has_bias, "ACT0": codes[0], "ACT1": codes[1], "ACT2": codes[2], "BN": bn, "BK": bk,
                  "STAGES": stages, "MP": 1 if m == 1 else MAX_ROWS, "SPLIT": split,
                  **({} if interpret else {"num_warps": warps, "num_stages": stages})}
    site = Site(siblings_kernel, (full[0], full[1], full[2], nbs[0], nbs[1], m, k), constexprs)
    return site, (sum(nbs), split)
