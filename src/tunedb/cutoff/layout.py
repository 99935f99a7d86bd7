"""The block-tridiagonal strip layout both solvers consume, and what can be computed on it alone.

A batch of symmetric positive definite block-tridiagonal systems (T diagonal blocks of n x n,
the KKT / Schur-complement systems of trajectory optimization and MPC) is ONE tensor

    strip: [batch, T, n, 3n]    row block t holds [ L_t | D_t | R_t ]

L_t couples x_{t-1} (the sub-diagonal block), D_t is the diagonal block, R_t couples x_{t+1};
symmetry means R_t = L_{t+1}^T. The padding blocks L_0 and R_{T-1} are zero (they multiply the
zero padding of x). The right-hand side and every iterate are padded vectors [batch, T, n].

Why rows of [L | D | R]: the product A x is one batched matvec of the strip with the stacked
neighbours [x_{t-1}; x_t; x_{t+1}] (3n long), so the iterative solver reads the strip as stored,
and the direct solver reads L_t and D_t as strided views of the same allocation; switching
solvers per solve costs a mode flag and no copy.
"""
from __future__ import annotations

from typing import Any

from tunedb.errors import CutoffError


def blocks(strip: Any) -> tuple[Any, Any, Any]:
    """(L, D, R): three [batch, T, n, n] views of the strip (no copy)."""
    n = strip.shape[-2]
    return strip[..., :n], strip[..., n:2 * n], strip[..., 2 * n:]


def check(strip: Any, b: Any, x0: Any = None) -> tuple[int, int, int]:
    """(batch, T, n) of a well-formed system; raises CutoffError naming the bad value. Shapes,
    dtypes and devices only: nothing here reads the data (no host sync)."""
    import torch

    # b is required and every operand a tensor: b=None slipped past (x0's "optional") and failed
    # deep in the solvers; a numpy b was named as "float64 ... the strip is torch.float64"
    for name, v in (("strip", strip), ("b", b), ("x0", x0)):
        if not isinstance(v, torch.Tensor) and not (name == "x0" and v is None):
            shape = "[batch, T, n, 3n]" if name == "strip" else "[batch, T, n]"
            raise CutoffError(f"{name} must be a torch.Tensor {shape}; got {type(v).__name__}")
    if strip.dim() != 4 or strip.shape[-1] != 3 * strip.shape[-2]:
        raise CutoffError(f"strip must be [batch, T, n, 3n]; got shape {tuple(strip.shape)}")
    batch, steps, n, _ = strip.shape
    if steps < 1 or n < 1:
        raise CutoffError(f"strip needs T >= 1 and n >= 1; got T={steps}, n={n}")
    if str(strip.dtype) not in ("torch.float32", "torch.float64"):
        raise CutoffError(f"strip dtype {strip.dtype} not supported; allowed: float32, float64")
    for name, v in (("b", b), ("x0", x0)):
        if v is None:
            continue
        if tuple(v.shape) != (batch, steps, n):
            raise CutoffError(f"{name} must be [batch, T, n] = {[batch, steps, n]}; got {list(v.shape)}")
        if v.dtype != strip.dtype or v.device != strip.device:
            raise CutoffError(f"{name} is {v.dtype} on {v.device}; the strip is {strip.dtype} on {strip.device}")
    return batch, steps, n


def neighbours(x: Any) -> Any:
    """[batch, T, 3n]: per step the stacked [x_{t-1}; x_t; x_{t+1}], zero-padded at the ends."""
    import torch

    zero = x.new_zeros(x.shape[0], 1, x.shape[2])
    prev = torch.cat((zero, x[:, :-1]), dim=1)
    nxt = torch.cat((x[:, 1:], zero), dim=1)
    return torch.cat((prev, x, nxt), dim=2)


def matvec(strip: Any, x: Any) -> Any:
    """A x for the whole batch: one batched product of the strip with the neighbours."""
    return (strip @ neighbours(x).unsqueeze(-1)).squeeze(-1)


def residual(strip: Any, b: Any, x: Any) -> Any:
    """Per problem ||b - A x|| / ||b||, [batch] on the device (the bound both solvers meet)."""
    r = (b - matvec(strip, x)).flatten(1).norm(dim=1)
    bn = b.flatten(1).norm(dim=1)
    return r / bn.clamp_min(1e-300 if b.dtype.itemsize == 8 else 1e-30)


def to_dense(strip: Any) -> Any:
    """[batch, T n, T n] dense equivalent (for tests and references; allocates)."""
    batch, steps, n, _ = strip.shape
    low, diag, up = blocks(strip)
    out = strip.new_zeros(batch, steps * n, steps * n)
    for t in range(steps):
        s = slice(t * n, (t + 1) * n)
        out[:, s, s] = diag[:, t]
        if t > 0:
            out[:, s, (t - 1) * n:t * n] = low[:, t]
        if t + 1 < steps:
            out[:, s, (t + 1) * n:(t + 2) * n] = up[:, t]
    return out


def from_blocks(diag: Any, low: Any) -> Any:
    """A new strip from diagonal blocks D [batch, T, n, n] and sub-diagonal blocks L [batch, T-1,
    n, n] (L[:, t-1] couples x_t to x_{t-1}); R is filled as L^T shifted, the padding zeroed."""
    import torch

    batch, steps, n, _ = diag.shape
    strip = diag.new_zeros(batch, steps, n, 3 * n)
    lo, d, up = blocks(strip)
    d.copy_(diag)
    if steps > 1:
        lo[:, 1:].copy_(low)
        up[:, :-1].copy_(low.mT)
    return strip


def random_system(batch: int, steps: int, n: int, *, dtype: Any = None, device: Any = "cpu",
                  coupling: float = 0.4, seed: int = 0) -> tuple[Any, Any]:
    """(strip, b): random SPD block-tridiagonal systems, well conditioned at every n. Couplings
    L_t are coupling * Gaussian (spectral norm about 2 coupling sqrt(n)); each diagonal block is
    D_t = G G^T / n + (1 + |L_t| + |L_{t+1}|) I with |L| = sqrt(||L||_1 ||L||_inf) >= ||L||_2
    (cheap, unlike an SVD per block), so by block Gershgorin
    x^T A x >= sum_t (lambda_min(D_t) - ||L_t|| - ||L_{t+1}||) |x_t|^2 >= |x|^2: every system is
    SPD with lambda_min >= 1 whatever n and T. (A shift that only grew like coupling sqrt(n)
    made a few systems of a batch indefinite at n >= 16; Cholesky then rightly failed on them.)"""
    import torch

    dtype = dtype or torch.float64
    gen = torch.Generator(device="cpu").manual_seed(seed)
    g = torch.randn(batch, steps, n, n, generator=gen, dtype=torch.float64)
    low = coupling * torch.randn(batch, max(steps - 1, 0), n, n, generator=gen, dtype=torch.float64)
    b = torch.randn(batch, steps, n, generator=gen, dtype=torch.float64)
    norms = torch.zeros(batch, steps + 1, dtype=torch.float64)  # ||L_t||_2 for t = 0..T (0: padding)
    if steps > 1:
        a = low.abs()
        norms[:, 1:steps] = (a.sum(-1).amax(-1) * a.sum(-2).amax(-1)).sqrt()
    shift = 1.0 + norms[:, :steps] + norms[:, 1:]
    diag = g @ g.mT / n + shift[..., None, None] * torch.eye(n, dtype=torch.float64)
    strip = from_blocks(diag, low)
    return strip.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype)
