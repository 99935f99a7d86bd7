"""The CUDA tier's blocked kernel (`cudab_b{NB}_w{W}`): potrf and posv for 33 <= n <= 128, one
problem a block of W warps, the lower triangle in shared memory as NB x NB tiles, factored by
panels of NB columns (right-looking, blocked). This module holds the ids, THE predicate's part for
them, the shared memory and the macros; kernels_cuda_blocked_src.py the CUDA source.

Why: the tile kernel (kernels_cuda_tile.py) keeps the lower triangle in registers, one thread a
tile, and takes one barrier a pivot. Nsight Compute on the H200 (session 23, potrf fp32 n = 128,
TS = 8): 47% of the warp samples wait at that barrier, two thirds of the threads (those left of
the pivot's tile column) only keep the barriers, 3 blocks an SM (1 at fp64). The work that
matters at n = 128 is the trailing update (n^3 / 6 FMAs); here every thread takes a share of it
at every panel, because the tiles sit in shared memory and the work is handed out afresh:

  1. the diagonal tile (P, P) is factored by warp 0 alone, lane r holding row r: the pivot by one
     shuffle, the column through a double-buffered buffer with one __syncwarp (as the warp
     kernel); the panel's 1/l_kk are kept for the next step;
  2. the tiles below it, L_IP = A_IP L_PP^-T, one row a thread by substitution (posv: b's rows
     too, so the forward solve rides along);
  3. the trailing update A_IJ -= L_IP L_JP^T over the lower tiles right of the panel, in 4 x 4
     blocks of outputs a thread (16 FMAs for 8 16-byte shared loads per 4 (fp32) or 2 (fp64)
     columns; micro-blocks wholly above a diagonal tile's diagonal are skipped); posv's b takes
     its GEMV beside it.
With lookahead: panel P + 1's tile column is updated first, then warp 0 factors its diagonal tile
while the other warps update the rest: three barriers a panel (NB columns), not one a pivot.
Each tile row's 16-byte chunks are permuted by the row (chunk ^ G(row / 4) ^ H(row % 4)), so the
update's reads (rows 4 m + q at one chunk) and the row-a-lane reads fall on distinct bank groups,
and an update item's four rows share one offset a chunk. posv then solves L^T x = y by tile rows
from the bottom (warp 0 solves the diagonal tile with one shuffle a step; every thread updates y
above it). Registers are capped by launch bounds for as many blocks an SM as the shared memory
fits (`min_blocks`).

Measured (H200, session 24 call 8, the tune's interleaved rounds at n = 128): over the tile
kernel's best arm 1.36-3.13x (batch 65536: potrf fp32 2.54x, fp64 3.13x, posv 1.93x / 2.78x), over
the best Triton arm 1.90-5.10x, over torch 3.78-9.22x (BENCHMARKS.md "Session 24"). Tried and dropped: solving
the panel's rows through the diagonal tile's inverse (warp 0 inverting it beside the factorization,
no chain in step 2) lost 1.15-1.8x; the lookahead and the register cap together 1.0-1.8x over the
form without them (bench/blocked_variants.py).

Memory: the lower tiles (padded to NT x NB with the identity) take NT(NT + 1)/2 NB^2 elements of
dynamic shared memory, loaded a warp a row with coalesced (16-byte where n and the pointers allow)
reads; potrf writes L back the same way with zeros above the diagonal. A block reads its whole
problem before it writes any of it, so OUT may alias A (potrf) or B (posv). Numerics as the other
arms: only A's lower triangle is used, a pivot that is not positive (or NaN) sets info to its
1-based column (the first) and is replaced by 1.
"""
from __future__ import annotations

import re

from tunedb.families.linalg.kernels_cuda_tile import cell_reason

PREFIX = "cudab"
OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
MIN_N, MAX_N = 33, 128
PANELS = (16,)
WARPS = (4, 8)
MAX_SMEM = 227 * 1024  # dynamic shared memory a block on sm90 (opt-in)
_ITEM = {"fp32": 4, "fp64": 8}
_ID = re.compile(r"cudab_b([1-9][0-9]*)_w([1-9][0-9]*)")


def config_id(nb: int, warps: int) -> str:
    return f"{PREFIX}_b{nb}_w{warps}"


def parse(config_id_: str) -> tuple[int, int] | None:
    """(NB, W) of `cudab_b{NB}_w{W}` (canonical: no leading zeros), or None for any other id."""
    match = _ID.fullmatch(config_id_)
    return (int(match.group(1)), int(match.group(2))) if match else None


def ids() -> tuple[str, ...]:
    return tuple(config_id(nb, w) for nb in PANELS for w in WARPS)


def smem_bytes(op: str, n: int, dtype: str, nb: int) -> int:
    """Dynamic shared memory a block: the lower tiles, the panel's 1/l_kk, the pivot column (two
    buffers), posv's b / y / x, and the info word."""
    nt = -(-n // nb)
    elems = nt * (nt + 1) // 2 * nb * nb + 3 * nb + (op == "posv") * nt * nb
    return elems * _ITEM.get(dtype, 8) + 16


def invalid_reason(op: str, nb: int, warps: int, n: int, dtype: str) -> str | None:
    """Why `cudab_b{nb}_w{warps}` cannot run op at (n, dtype), judged on the shape alone, or None."""
    cid = config_id(nb, warps)
    why = cell_reason(cid, op, OPS, dtype, DTYPES, n, MIN_N, MAX_N)
    if why:
        return why
    if nb not in PANELS:
        return f"{cid}: the panel width must be one of {PANELS}, got {nb}"
    if warps not in WARPS:
        return f"{cid}: warps a block must be one of {WARPS}, got {warps}"
    need = smem_bytes(op, n, dtype, nb)
    if need > MAX_SMEM:
        return f"{cid} at n={n} {dtype} needs {need} B of shared memory a block (at most {MAX_SMEM})"
    return None


def min_blocks(op: str, n: int, dtype: str, nb: int, warps: int) -> int:
    """Blocks an SM the registers are capped for (launch bounds): as many as the shared memory
    fits (228 KiB an SM, 1 KiB a block reserved), but never below 80 (fp32) / 112 (fp64)
    registers a thread, what the update's 4 x 4 block needs without spilling."""
    fits = 228 * 1024 // (smem_bytes(op, n, dtype, nb) + 1024)
    floor = 112 if dtype == "fp64" else 80
    return max(1, min(fits, 65536 // (floor * 32 * warps)))


def defines(op: str, n: int, dtype: str, nb: int, warps: int) -> dict[str, int]:
    return {"N": n, "NB": nb, "NT": -(-n // nb), "NTHREADS": 32 * warps, "DOUBLE": int(dtype == "fp64"),
            "POSV": int(op == "posv"), "PIPE": 1, "MINB": min_blocks(op, n, dtype, nb, warps)}
