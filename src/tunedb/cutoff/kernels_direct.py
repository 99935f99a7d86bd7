"""The fused direct solver: one Triton kernel runs block Cholesky (block Thomas) over all T block
steps of a system, forward and backward, reading the [L | D | R] strip as stored.

One program per system; every n x n block is an NP x NP register tile (NP: n rounded up to a
power of two; padded entries load as 0 and are never a pivot column, since every loop runs over
the n real columns only). Forward, per step t (C_{-1} = I, y_{-1} = 0, and L_0 is masked to 0,
so step 0 needs no branch):

    W_t = C_{t-1}^{-1} L_t^T      row i of W by forward substitution on the carried tile C_{t-1}
    S_t = D_t - W_t^T W_t         one rank-1 update per finished row of W
    g_t = b_t - W_t^T y_{t-1}     likewise
    C_t = chol(S_t),  y_t = C_t^{-1} g_t    right-looking in registers, y alongside

C_t, W_t and y_t go to workspaces (new tensors: the strip is never written or copied). After a
barrier (the backward pass reads what other threads of the program wrote), backward:
x_t = C_t^{-T} (y_t - W_{t+1} x_{t+1}), the carried x_{t+1} in registers. A pivot that is not
positive (or NaN) sets info to 1 and is replaced by 1, so nothing divides by zero; the caller
reports such a system as not ok. Problem offsets are int64 (batch * T * n * 3n may pass 2**31).
"""
import triton
import triton.language as tl


# IEEE-rounded sqrt and division in fp32 (Triton's defaults there are approximate, up to 2 ulp).
@triton.jit
def sqrt_rn(x):
    if x.dtype == tl.float32:
        return tl.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@triton.jit
def div_rn(x, y):
    if x.dtype == tl.float32:
        return tl.div_rn(x, y)
    else:
        return x / y


@triton.jit
def btd_direct(S, s_b, s_t, s_r, s_c, B, b_b, b_t, b_i, X, CW, WW, YW, INFO, T,
               N: tl.constexpr, NP: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, NP)[:, None]
    c = tl.arange(0, NP)[None, :]
    v = tl.arange(0, NP)
    m2 = (r < N) & (c < N)
    sbase = S + pid * s_b
    bbase = B + pid * b_b
    tile = pid * T * (NP * NP) + r * NP + c
    dt = S.dtype.element_ty
    C = tl.where(r == c, 1.0, 0.0).to(dt)
    y_prev = tl.zeros([NP], dt)
    info = tl.zeros([NP], tl.int32)  # any nonzero entry: a bad pivot
    for t in range(T):
        row = sbase + t * s_t
        d = tl.load(row + r * s_r + (c + N) * s_c, mask=m2, other=0)
        # M = L_t^T (M[i, j] = L_t[j, i]); masked to 0 at t = 0, the padding block
        mt = tl.load(row + c * s_r + r * s_c, mask=m2 & (c * 0 + t > 0), other=0)
        g = tl.load(bbase + t * b_t + v * b_i, mask=v < N, other=0)
        for i in range(N):
            ci = tl.sum(tl.where(c == i, C, 0), axis=1)  # column i of C, indexed by row
            cii = tl.sum(tl.where(v == i, ci, 0), axis=0)
            wi = div_rn(tl.sum(tl.where(r == i, mt, 0), axis=0), cii)  # row i of W, by column
            mt = tl.where(r == i, wi[None, :], tl.where(r > i, mt - ci[:, None] * wi[None, :], mt))
            d = d - wi[:, None] * wi[None, :]
            g = g - wi * tl.sum(tl.where(v == i, y_prev, 0), axis=0)
        y = g
        for j in range(N):
            col = tl.sum(tl.where(c == j, d, 0), axis=1)
            piv = tl.sum(tl.where(v == j, col, 0), axis=0)
            bad = (piv <= 0) | (piv != piv)
            info = tl.where(bad, 1, info)
            s = sqrt_rn(tl.where(bad, 1, piv))
            below = tl.where(v > j, div_rn(col, s), 0)
            low = tl.where(v == j, s, below)
            d = d - below[:, None] * below[None, :]
            d = tl.where(c == j, low[:, None], d)
            yj = div_rn(tl.sum(tl.where(v == j, y, 0), axis=0), s)
            y = tl.where(v == j, yj, y - below * yj)
        C = tl.where(r >= c, d, 0)
        tl.store(CW + tile + t * (NP * NP), C)
        tl.store(WW + tile + t * (NP * NP), mt)
        tl.store(YW + (pid * T + t) * NP + v, y)
        y_prev = y
    tl.debug_barrier()  # the backward pass reads tiles other threads of this program stored
    x_next = tl.zeros([NP], dt)
    for tt in range(T):
        t = T - 1 - tt
        C = tl.load(CW + tile + t * (NP * NP))
        w = tl.load(WW + tile + (t + 1) * (NP * NP), mask=(r >= 0) & (c * 0 + t + 1 < T), other=0)
        g = tl.load(YW + (pid * T + t) * NP + v) - tl.sum(w * x_next[None, :], axis=1)
        x = tl.zeros([NP], dt)
        for ii in range(N):
            i = N - 1 - ii
            ri = tl.sum(tl.where(r == i, C, 0), axis=0)  # row i of C, indexed by column
            cii = tl.sum(tl.where(v == i, ri, 0), axis=0)
            xi = div_rn(tl.sum(tl.where(v == i, g, 0), axis=0), cii)
            x = tl.where(v == i, xi, x)
            g = g - tl.where(v < i, ri * xi, 0)
        tl.store(X + (pid * T + t) * N + v, x, mask=v < N)
        x_next = x
    tl.store(INFO + pid, tl.max(info, axis=0))
