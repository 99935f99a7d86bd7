"""Panel packing of potrf/posv/trsv for n = 16..128: one problem a program, left-looking in panels.

At n = 64/128 the register tiles of the warp and block packings no longer fit (block_w8 at
n = 128 spills) and every pivot of their right-looking loop is a masked reduction over the
whole tile: potrf fp32 n = 128 ran at 10x its memory floor and posv fell back to torch, itself
25-48x above its floor. Here the matrix lives in memory (L itself, which the program writes
anyway) and a program holds one panel of B columns at a time, as a [NP(rows), 1, B] tile whose
row axis lies across the lanes and warps and whose columns lie inside each thread:

  1. load the panel's columns of A (the lower part; the upper triangle of A is never read);
  2. left-looking update from the finished columns: t[r, c] -= sum_{k < c0} L[r, k] L[c0+c, k],
     KC columns of k at a time as a [NP, KC, B] product reduced inside each thread (L[r, k]: the
     thread's own rows; L[c0+c, k]: the same KC x B block in every thread, broadcast loads);
  3. the diagonal block: staged through L, its lower triangle read back into every thread (an
     [NP, B, B] tile, the same in every row) and factored there redundantly, register picks only;
  4. each row solves against that block in its own thread (a row of L21 = a row of the panel
     times L11^-T), the diagonal rows giving L11 itself;
  5. store the panel's columns of L (zeros above the diagonal), barrier, next panel.

Nothing crosses a lane but through memory and a barrier (three a panel), so a pivot costs
register work in every thread and the chain per problem is n / B panels long, not n pivots of
tile-wide reductions. The layout comes from the offsets: declared non-contiguous on every axis
(`tl.max_contiguous(..., [1, 1, 1])`), the coalescing pass keeps the lanes on the first axis,
the row axis, and the other two inside the thread (as in kernels_reg.py and kernels_rows.py).

posv factors into a workspace (A itself when in place), fuses the forward solve into each panel
(z_blk -= L[c0+c, k] z_k from the same broadcast blocks, then L11^-1 in every thread) and solves
L^T x = z panel by panel from the last (one reduction over the row axis a panel). trsv is that
forward solve alone, every thread carrying the whole problem (its work is n^2 / 2 FMAs; the
bytes of L are the cost).

Pivots as in the other packings: sqrt and its reciprocal from rsqrt and Newton steps; a pivot
that is not positive (or NaN) sets info to the first such column (1-based) and is replaced by 1
(L's diagonal holds 1 there), so nothing loops on data and the results stay finite for a finite
input. Picks add -0.0 for the registers they drop (x + -0.0 is x: the compiler may drop them).
"""
import triton
import triton.language as tl

from tunedb.families.linalg.kernels_lane import _sqrt_rsqrt


@triton.jit
def _offs(base, rows, cols, N: tl.constexpr):
    # no contiguity on any axis: the lanes go to the first (row) axis, the rest stays in-thread
    return tl.max_contiguous(base + rows * N + cols, [1, 1, 1])


@triton.jit
def _pick(x, idx, j: tl.constexpr, axis: tl.constexpr):
    return tl.sum(tl.where(idx == j, x, -0.0), axis=axis, keep_dims=True)


@triton.jit
def _update(L, X, base, xb, r, kk, col, t, zb, c0, N: tl.constexpr, KC: tl.constexpr,
            SOLVE: tl.constexpr):
    """t[r, c] -= sum_{k < c0} L[r, k] L[c0 + c, k] for rows r >= c0; with SOLVE also
    zb[c] -= sum_{k < c0} L[c0 + c, k] z[k] (z in X, written by the earlier panels)."""
    for k0 in range(0, c0, KC):
        lr = tl.load(L + _offs(base, r, k0 + kk, N), mask=(r < N) & (r >= c0), other=0)  # [NP, KC, 1]
        lc = tl.load(L + _offs(base + r * 0, col, k0 + kk, N), mask=col < N, other=0)  # [NP, KC, B]: the same block in every row
        t -= tl.sum(lr * lc, axis=1, keep_dims=True)
        if SOLVE:
            zk = tl.load(X + tl.max_contiguous(xb + r * 0 + k0 + kk, [1, 1, 1]))  # [NP, KC, 1]
            zb -= tl.sum(lc * zk, axis=1, keep_dims=True)
    return t, zb


@triton.jit
def _factor(L, base, t, zb, info, r, jj, cc, c0, N: tl.constexpr, B: tl.constexpr,
            SOLVE: tl.constexpr):
    """The panel's columns of L from the updated panel t; with SOLVE, zb = L11^-1 zb."""
    col = c0 + cc
    # the diagonal block's rows are held by B threads: stage them, read the block into every thread
    tl.store(L + _offs(base, r, col, N), t, mask=(r >= c0) & (r < c0 + B) & (r < N) & (col < N))
    tl.debug_barrier()
    # the block's lower triangle only (blk[j', c] = A11[j', c], j' >= c): the upper registers
    # are compile-time zeros, so the block costs n(n+1)/2 registers, not n^2
    blk = tl.load(L + _offs(base + r * 0, c0 + jj, c0 + cc, N), mask=(jj >= cc) & (c0 + jj < N), other=0)  # [NP, B, B]
    tl.debug_barrier()  # every thread holds the block before the panel's columns are overwritten
    for j in tl.static_range(B):
        colj = _pick(blk, cc, j, 2)  # [NP, B, 1]: block[j', j] (j' >= j)
        d = _pick(colj, jj, j, 1)  # [NP, 1, 1]: the pivot
        bad = ((d <= 0) | (d != d)) & (c0 + j < N)  # past n (the last panel's padding) is no pivot
        info = tl.where(bad & (info == 0), c0 + j + 1, info)
        s, inv = _sqrt_rsqrt(tl.where(bad | (c0 + j >= N), 1.0, d))
        # column j along the column axis (an in-thread re-indexing): L[c0 + c, c0 + j] for c > j
        lcol = tl.sum(tl.where(jj == cc, colj, -0.0), axis=1, keep_dims=True) * inv  # [NP, 1, B]
        if j + 1 < B:
            blk = tl.where((jj >= cc) & (cc > j), blk - colj * (lcol * inv), blk)
        xj = _pick(t, cc, j, 2) * inv  # [NP, 1, 1]: L[r, c0 + j]
        xj = tl.where(r == c0 + j, s, xj)
        t = tl.where(cc == j, xj, tl.where(cc > j, t - xj * lcol, t))
        if SOLVE:
            zj = _pick(zb, cc, j, 2) * inv
            zb = tl.where(cc == j, zj, tl.where(cc > j, zb - zj * lcol, zb))
    return t, zb, info


@triton.jit
def _chol_panel(A, L, X, base, xb, r, kk, jj, cc, Bv, info, c0, N: tl.constexpr, B: tl.constexpr,
                KC: tl.constexpr, SOLVE: tl.constexpr):
    """The panel of columns c0 .. c0 + B - 1 of the factorisation."""
    col = c0 + cc
    t = tl.load(A + _offs(base, r, col, N), mask=(r < N) & (col < N) & (r >= col), other=0)  # [NP, 1, B]
    zb = t
    if SOLVE:
        zb = tl.load(Bv + tl.max_contiguous(xb + r * 0 + col, [1, 1, 1]), mask=col < N, other=0)  # [NP, 1, B]
    t, zb = _update(L, X, base, xb, r, kk, col, t, zb, c0, N, KC, SOLVE)
    t, zb, info = _factor(L, base, t, zb, info, r, jj, cc, c0, N, B, SOLVE)
    tl.store(L + _offs(base, r, col, N), tl.where(r >= col, t, 0.0), mask=(r < N) & (col < N))
    if SOLVE:
        # offsets through a min (col for the storing row 0): no contiguity the coalescing pass would
        # vectorise into another layout (a shared-memory conversion a panel)
        tl.store(X + xb + tl.minimum(col, r + N), tl.broadcast_to(zb, t.shape), mask=(r == 0) & (col < N))
    tl.debug_barrier()
    return info


@triton.jit
def _chol(A, L, X, base, xb, r, kk, jj, cc, Bv, N: tl.constexpr, B: tl.constexpr, KC: tl.constexpr,
          SOLVE: tl.constexpr):
    """Factor A into L panel by panel; with SOLVE, z = L^-1 b into X. Returns info ([1, 1, 1])."""
    tl.static_assert(B % KC == 0, "the update's chunks of KC columns must tile the panels (k0 + kk < c0 unmasked)")
    info = r * 0  # [NP, 1, 1]: the same in every row
    # a loop, not unrolled: unrolled over the panels and their updates, n = 128 took minutes to compile
    for c0 in range(0, N, B):
        info = _chol_panel(A, L, X, base, xb, r, kk, jj, cc, Bv, info, c0, N, B, KC, SOLVE)
    return info


@triton.jit
def _back_panel(W, X, base, xb, r, jj, cc, c0, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr):
    """The panel of columns c0 .. c0 + B - 1 of L^T x = z (the later panels' x already in X)."""
    col = c0 + cc
    xv = tl.load(X + tl.max_contiguous(xb + r * 0 + col, [1, 1, 1]), mask=col < N, other=0)  # [NP, 1, B]: z of the panel
    below = (r < N) & (r >= c0 + B)
    lrow = tl.load(W + _offs(base, r, col, N), mask=below & (col < N), other=0)  # [NP, 1, B]: L[r, c0 + c]
    xr = tl.load(X + tl.max_contiguous(xb + r, [1, 1, 1]), mask=below, other=0)  # [NP, 1, 1]: x of the later panels
    xv -= tl.sum(lrow * xr, axis=0, keep_dims=True)
    blk = tl.load(W + _offs(base + r * 0, c0 + jj, col, N), mask=(c0 + jj < N) & (col <= c0 + jj), other=0)  # L[c0+j, c0+c]
    for q in tl.static_range(B):  # column c = B - 1 - q of the panel; past n (padding) x_c = 0
        rowc = _pick(blk, jj, B - 1 - q, 1)  # [NP, 1, B]: L[c0 + c, c0 + c'], the same in every row
        live = c0 + B - 1 - q < N
        xc = tl.where(live, _pick(xv, cc, B - 1 - q, 2) / tl.where(live, _pick(rowc, cc, B - 1 - q, 2), 1.0), 0.0)
        xv = tl.where(cc == B - 1 - q, xc, tl.where(cc < B - 1 - q, xv - rowc * xc, xv))
    tl.debug_barrier()  # every thread has read z of this panel before x overwrites it
    tl.store(X + xb + tl.minimum(col, r + N), tl.broadcast_to(xv, [NP, 1, B]), mask=(r == 0) & (col < N))
    tl.debug_barrier()


@triton.jit
def _trsv_panel(Lm, Bv, X, base, xb, r, kk, jj, cc, c0, N: tl.constexpr, NP: tl.constexpr,
                B: tl.constexpr, KC: tl.constexpr):
    col = c0 + cc
    zb = tl.load(Bv + tl.max_contiguous(xb + r * 0 + col, [1, 1, 1]), mask=col < N, other=0)  # [NP, 1, B]
    for k0 in range(0, c0, KC):
        lc = tl.load(Lm + _offs(base + r * 0, col, k0 + kk, N), mask=col < N, other=0)  # [NP, KC, B]
        zk = tl.load(X + tl.max_contiguous(xb + r * 0 + k0 + kk, [1, 1, 1]))  # [NP, KC, 1]
        zb -= tl.sum(lc * zk, axis=1, keep_dims=True)
    blk = tl.load(Lm + _offs(base + r * 0, col, c0 + jj, N), mask=(col < N) & (c0 + jj <= col), other=0)  # L[c0+c, c0+j]
    for j in tl.static_range(B):  # past n (padding) the entries stay 0 and are never stored
        lj = _pick(blk, jj, j, 1)  # [32, 1, B]: L[c0 + c, c0 + j], the same in every lane
        live = c0 + j < N
        zj = tl.where(live, _pick(zb, cc, j, 2) / tl.where(live, _pick(lj, cc, j, 2), 1.0), 0.0)
        zb = tl.where(cc == j, zj, tl.where(cc > j, zb - zj * lj, zb))
    tl.debug_barrier()  # every thread has read b of this panel (X may be b) before z overwrites it
    tl.store(X + xb + tl.minimum(col, r + N), tl.broadcast_to(zb, [NP, 1, B]), mask=(r == 0) & (col < N))
    tl.debug_barrier()


@triton.jit(do_not_specialize=["batch"])
def potrf_panel(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr, KC: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, NP)[:, None, None]
    kk = tl.arange(0, KC)[None, :, None]
    jj = tl.arange(0, B)[None, :, None]
    cc = tl.arange(0, B)[None, None, :]
    info = _chol(A, L, L, pid * (N * N), pid * N, r, kk, jj, cc, A, N, B, KC, False)
    tl.store(INFO + pid + r * 0, tl.broadcast_to(info, [NP, 1, 1]), mask=r == 0)


@triton.jit(do_not_specialize=["batch"])
def posv_panel(A, Bv, X, W, INFO, batch, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr,
               KC: tl.constexpr):
    """A x = b: L into W (a workspace, or A itself), z = L^-1 b into X with the factor, then
    L^T x = z panel by panel from the last, in place in X."""
    pid = tl.program_id(0).to(tl.int64)
    base = pid * (N * N)
    xb = pid * N
    r = tl.arange(0, NP)[:, None, None]
    kk = tl.arange(0, KC)[None, :, None]
    jj = tl.arange(0, B)[None, :, None]
    cc = tl.arange(0, B)[None, None, :]
    info = _chol(A, W, X, base, xb, r, kk, jj, cc, Bv, N, B, KC, True)
    NB: tl.constexpr = (N + B - 1) // B
    for qb in range(NB):
        _back_panel(W, X, base, xb, r, jj, cc, (NB - 1 - qb) * B, N, NP, B)
    tl.store(INFO + pid + r * 0, tl.broadcast_to(info, [NP, 1, 1]), mask=r == 0)


@triton.jit(do_not_specialize=["batch"])
def trsv_panel(Lm, Bv, X, batch, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr, KC: tl.constexpr):
    """L x = b (L lower; the upper triangle never read), panel by panel; X may be b itself. One
    warp, every lane carrying the whole solve: the row axis is the 32 lanes (NP = 32), one copy each."""
    tl.static_assert(NP == 32, "trsv_panel runs one warp: its row axis is the 32 lanes")
    tl.static_assert(B % KC == 0, "the update's chunks of KC columns must tile the panels (k0 + kk < c0 unmasked)")
    pid = tl.program_id(0).to(tl.int64)
    base = pid * (N * N)
    xb = pid * N
    r = tl.arange(0, NP)[:, None, None]
    kk = tl.arange(0, KC)[None, :, None]
    jj = tl.arange(0, B)[None, :, None]
    cc = tl.arange(0, B)[None, None, :]
    for c0 in range(0, N, B):
        _trsv_panel(Lm, Bv, X, base, xb, r, kk, jj, cc, c0, N, NP, B, KC)
