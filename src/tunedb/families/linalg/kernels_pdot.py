"""The panel packing of potrf/posv with its left-looking update on `tl.dot` (a probe variant).

kernels_panel.py spends its time in `_update`: every thread loads the KC x B block
L[c0 + c, k] with scalar broadcast loads (64 a chunk) and the products run over all NP rows as
in-thread FMAs. Here the update of a panel of 2B (16) columns is one matrix product a k-chunk,

    acc[r, c] = -A[r, c0 + c] + sum_k L[r, k] L[c0 + c, k]      (acc = -t; tl.dot adds)

with L[r, k0:k0+KC] an [NP, KC] operand and L[c0:c0+2B, k0:k0+KC] a [KC, 2B] one, each loaded
once a chunk by the whole program (coalesced along k) and laid out by Triton for the product:
FMA or mma.sync DMMA for input_precision "ieee" (fp32 / fp64 on sm90), tensor-core passes for
fp32 "tf32x3". Then t = -acc is parked in the panel's own columns of L (the panel's stores
overwrite it) and its first B columns converted once to the in-thread [NP, 1, B] layout of
kernels_panel; the panel is factored there as two sub-panels of B columns with
kernels_panel._factor. The second sub-panel is read back from L when its turn comes (held in
registers through the first's factor it spilled: fp64 n = 64 and fp32 n = 128 at one warp) and
first takes the one-chunk update from the first's fresh columns (kernels_panel._update over
those B columns, through L and a barrier).

posv folds the forward solve's update into the same product: rows r < c0 are dead for the panel
(above its diagonal), so row 0 of the product carries z instead, acc[0, c] = -b[c0 + c] +
sum_k z_k L[c0 + c, k] (z of the finished columns, in X). That row is parked in the workspace's
row 0 above the diagonal (W[0, c0 + c], overwritten by the panel's own zeros when it is stored;
never read as L) with the rest of the updated panel and read back by every thread as the
sub-panels' right-hand side; _factor applies L11^-1 as in kernels_panel. The backward solve is kernels_panel._back_panel.

Arguments, results, info and the non-SPD convention are kernels_panel's (potrf_panel,
posv_panel); B is the sub-panel width (the update's panel is 2B), KC the product's k-chunk.
The loops stay loops (`range`), so n = 128 compiles in seconds.
"""
import triton
import triton.language as tl

from tunedb.families.linalg.kernels_panel import _back_panel, _factor, _offs, _update


@triton.jit
def _dot_update(A, L, Bv, X, base, xb, c0, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr,
                KC: tl.constexpr, SOLVE: tl.constexpr, PREC: tl.constexpr):
    """The updated panel t[r, c] (c < 2B), parked in L[:, c0 + c]; its first B columns returned
    as an [NP, 1, B] tile in the in-thread layout. With SOLVE (c0 > 0) row 0 of the parked panel
    is the updated right-hand side."""
    rows = tl.arange(0, NP)[:, None]  # [NP, 1]
    cw = tl.arange(0, 2 * B)[None, :]  # [1, 2B]
    col = c0 + cw
    head = (rows == 0) & (c0 > 0)  # the dead row that carries b, then z (posv only)
    lower = (rows >= col) & (rows < N) & (col < N)
    if SOLVE:
        a = tl.load(tl.where(head, Bv + xb + col, A + base + rows * N + col), mask=(lower | head) & (col < N), other=0)
    else:
        a = tl.load(A + base + rows * N + col, mask=lower, other=0)
    acc = -a  # tl.dot adds: accumulate -t, negate once at the end (exact)
    kc = tl.arange(0, KC)[None, :]  # [1, KC]: k along the row operand's columns
    kr = tl.arange(0, KC)[:, None]  # [KC, 1]: k along the panel operand's rows
    for k0 in range(0, c0, KC):
        k = k0 + kc
        # rows < c0 are finished (above the panel's diagonal): masked, not loaded
        live = (rows >= c0) & (rows < N) & (k < c0)
        if SOLVE:
            lr = tl.load(tl.where(head, X + xb + k + rows * 0, L + base + rows * N + k), mask=live | (head & (k < c0)), other=0)
        else:
            lr = tl.load(L + base + rows * N + k, mask=live, other=0)  # [NP, KC]: L[r, k]
        lp = tl.load(L + base + col * N + k0 + kr, mask=(col < N) & (k0 + kr < c0), other=0)  # [KC, 2B]: L[c0 + c, k]
        acc = tl.dot(lr, lp, acc, input_precision=PREC, out_dtype=acc.dtype)
    t = -acc
    # parked in the panel's own columns of L (see the module docstring); row 0 carries posv's
    # right-hand side
    tl.debug_barrier()  # in place (L is A) every thread has read its A before the panel is overwritten
    tl.store(L + base + rows * N + col, t, mask=(rows < N) & (col < N))
    # the first sub-panel: one conversion into kernels_panel's layout (rows across the threads,
    # columns in-thread)
    t1, _ = tl.split(tl.permute(tl.reshape(t, [NP, 2, B]), (0, 2, 1)))
    return t1[:, None, :]


@triton.jit
def _store_cols(L, X, base, xb, r, cc, t, zb, c0, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr,
                SOLVE: tl.constexpr):
    """Columns c0 .. c0 + B - 1 of L (zeros above the diagonal: they also clear the parked
    right-hand side) and, with SOLVE, z of them into X; then a barrier."""
    col = c0 + cc
    tl.store(L + _offs(base, r, col, N), tl.where(r >= col, t, 0.0), mask=(r < N) & (col < N))
    if SOLVE:
        # offsets through a min: no contiguity for the coalescing pass to vectorise (as kernels_panel)
        tl.store(X + xb + tl.minimum(col, r + N), tl.broadcast_to(zb, [NP, 1, B]), mask=(r == 0) & (col < N))
    tl.debug_barrier()


@triton.jit
def _pdot_panel(A, L, Bv, X, base, xb, r, jj, cc, ku, info, c0, N: tl.constexpr, NP: tl.constexpr,
                B: tl.constexpr, KC: tl.constexpr, KU: tl.constexpr, SOLVE: tl.constexpr, PREC: tl.constexpr):
    """The panel of columns c0 .. c0 + 2B - 1 of the factorisation (and of z with SOLVE)."""
    t1 = _dot_update(A, L, Bv, X, base, xb, c0, N, NP, B, KC, SOLVE, PREC)
    zb1 = t1
    src = tl.where(c0 > 0, L + base, Bv + xb)  # posv's right-hand side: the first panel has no update
    if SOLVE:
        tl.debug_barrier()  # the parked right-hand side is in L before any thread reads it
        zb1 = tl.load(src + tl.max_contiguous(r * 0 + c0 + cc, [1, 1, 1]), mask=c0 + cc < N, other=0)
    t1, zb1, info = _factor(L, base, t1, zb1, info, r, jj, cc, c0, N, B, SOLVE)
    _store_cols(L, X, base, xb, r, cc, t1, zb1, c0, N, NP, B, SOLVE)  # ends in a barrier
    if c0 + B < N:
        col2 = c0 + B + cc
        t2 = tl.load(L + _offs(base, r, col2, N), mask=(r >= col2) & (r < N) & (col2 < N), other=0)
        zb2 = t2
        if SOLVE:  # L[0, c0 + B + c] is still the parked right-hand side (sub-panel 1 cleared only its own)
            zb2 = tl.load(src + tl.max_contiguous(r * 0 + col2, [1, 1, 1]), mask=col2 < N, other=0)
        # the second sub-panel's update from the first's columns: kernels_panel._update over the
        # B columns from c0 (base and xb moved by c0, chunks of KU: its [NP, KU, B] broadcast
        # block is KU * B registers a row, so fp64 takes B / 2 as kernels_panel does; its row
        # mask r >= B also lets through rows B .. c0 - 1, whose entries there are stored zeros)
        t2, zb2 = _update(L, X, base + c0, xb + c0, r, ku, col2, t2, zb2, B, N, KU, SOLVE)
        t2, zb2, info = _factor(L, base, t2, zb2, info, r, jj, cc, c0 + B, N, B, SOLVE)
        _store_cols(L, X, base, xb, r, cc, t2, zb2, c0 + B, N, NP, B, SOLVE)
    return info


@triton.jit
def _pdot_chol(A, L, Bv, X, base, xb, r, jj, cc, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr,
               KC: tl.constexpr, SOLVE: tl.constexpr, PREC: tl.constexpr):
    KU: tl.constexpr = B // 2 if A.dtype.element_ty == tl.float64 else B
    ku = tl.arange(0, KU)[None, :, None]
    info = r * 0  # [NP, 1, 1]: the same in every row
    for c0 in range(0, N, 2 * B):  # a loop: unrolled, n = 128 would compile for minutes
        info = _pdot_panel(A, L, Bv, X, base, xb, r, jj, cc, ku, info, c0, N, NP, B, KC, KU, SOLVE, PREC)
    return info


@triton.jit(do_not_specialize=["batch"])
def potrf_pdot(A, L, INFO, batch, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr, KC: tl.constexpr,
               PREC: tl.constexpr = "ieee"):
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, NP)[:, None, None]
    jj = tl.arange(0, B)[None, :, None]
    cc = tl.arange(0, B)[None, None, :]
    info = _pdot_chol(A, L, A, L, pid * (N * N), pid * N, r, jj, cc, N, NP, B, KC, False, PREC)
    tl.store(INFO + pid + r * 0, tl.broadcast_to(info, [NP, 1, 1]), mask=r == 0)


@triton.jit(do_not_specialize=["batch"])
def posv_pdot(A, Bv, X, W, INFO, batch, N: tl.constexpr, NP: tl.constexpr, B: tl.constexpr, KC: tl.constexpr,
              PREC: tl.constexpr = "ieee"):
    """A x = b: L into W (a workspace, or A itself) with z = L^-1 b into X, then L^T x = z panel
    by panel from the last, in place in X (kernels_panel._back_panel)."""
    pid = tl.program_id(0).to(tl.int64)
    base = pid * (N * N)
    xb = pid * N
    r = tl.arange(0, NP)[:, None, None]
    jj = tl.arange(0, B)[None, :, None]
    cc = tl.arange(0, B)[None, None, :]
    info = _pdot_chol(A, W, Bv, X, base, xb, r, jj, cc, N, NP, B, KC, True, PREC)
    NB: tl.constexpr = (N + B - 1) // B
    for qb in range(NB):
        _back_panel(W, X, base, xb, r, jj, cc, (NB - 1 - qb) * B, N, NP, B)
    tl.store(INFO + pid + r * 0, tl.broadcast_to(info, [NP, 1, 1]), mask=r == 0)
