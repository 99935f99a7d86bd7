"""Problems, the library arm, the fp64 reference and the residuals of the linalg family.

make_inputs builds random, well-conditioned batches on the device (never zeros): SPD matrices
A = G G^T / n + I (eigenvalues in about [1, 5]) for potrf/posv, and for trsv the Cholesky factor
of such a matrix (a random triangular matrix is exponentially ill-conditioned in n; a factor of a
well-conditioned SPD matrix is not). The residuals are normwise backward errors, per problem,
computed in fp64 (the verify rule compares an arm's worst one with torch's on the same inputs):

    products:        ||y - y_ref|| / (||A|| ||x||)      (dot: ||x|| ||y||; gemm: ||A|| ||B||)
    potrf:           ||L L^T - A|| / ||A||
    trsv / posv:     ||A x - b|| / (||A|| ||x||)

Torch is imported inside the functions (importing the family must stay cheap).
"""
from __future__ import annotations

from typing import Any

from tunedb.records import Signature

_TORCH_DTYPES = {"fp32": "float32", "fp64": "float64", "fp16": "float16", "bf16": "bfloat16"}


def torch_dtype(dt: str) -> Any:
    import torch

    return getattr(torch, _TORCH_DTYPES[dt])


def spd(batch: int, n: int, generator: Any, device: Any) -> Any:
    """A batch of well-conditioned SPD matrices in fp64."""
    import torch

    g = torch.randn(batch, n, n, generator=generator, device=device, dtype=torch.float64)
    eye = torch.eye(n, device=device, dtype=torch.float64)
    return torch.baddbmm(eye.expand(batch, n, n), g, g.mT, alpha=1.0 / n)


def make_inputs(sig: Signature, batch: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random inputs for `sig` over `batch` problems: (args, kwargs) for launch and reference."""
    import torch

    n, dtype = sig.get("n"), torch_dtype(sig.dt)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float64) * scale).to(dtype)

    op = sig.op
    if op == "dot":
        return (randn(batch, n), randn(batch, n)), {}
    if op == "gemv":
        return (randn(batch, n, n, scale=n ** -0.5), randn(batch, n)), {}
    if op == "gemm":
        return (randn(batch, n, n, scale=n ** -0.5), randn(batch, n, n, scale=n ** -0.5)), {}
    a = spd(batch, n, gen, device)
    if op == "potrf":
        return (a.to(dtype),), {}
    b = randn(batch, n)
    if op == "trsv":
        return (torch.linalg.cholesky_ex(a).L.to(dtype), b), {}
    return (a.to(dtype), b), {}


# --- the library arm ------------------------------------------------------------------------
# The capturable torch forms (ANCHORS: torch.linalg.cholesky checks info on the host and
# cholesky_solve's MAGMA path fails under capture; cholesky_ex and solve_triangular do not).

def torch_arm(op: str, *args: Any) -> Any:
    """The op by the library arm's forms; potrf and posv return (result, info int32[batch]).
    The reference runs it in fp64; the family serves the kernel module's `torch` arm (the same
    forms, with its out= contract) and this one only where that module is absent."""
    import torch

    dev = args[0].device.type if isinstance(args[0], torch.Tensor) else "cpu"
    from tunedb.runtime.autocast_rule import enabled  # False on meta (shapes inferred with grad wanted)

    if enabled(dev):  # the op's dtype is its operands' (its fake's): no autocast inside
        with torch.autocast(dev, enabled=False):
            return torch_arm(op, *args)

    if op == "dot":
        x, y = args
        return torch.matmul(x.unsqueeze(-2), y.unsqueeze(-1)).reshape(x.shape[0])
    if op == "gemv":
        a, x = args
        return torch.bmm(a, x.unsqueeze(-1)).squeeze(-1)
    if op == "gemm":
        return torch.bmm(*args)
    if op == "potrf":
        out = torch.linalg.cholesky_ex(args[0])
        return out.L, out.info
    if op == "trsv":
        low, b = args
        return torch.linalg.solve_triangular(low, b.unsqueeze(-1), upper=False).squeeze(-1)
    if op == "posv":
        a, b = args
        low, info = torch.linalg.cholesky_ex(a)
        y = torch.linalg.solve_triangular(low, b.unsqueeze(-1), upper=False)
        return torch.linalg.solve_triangular(low.mT, y, upper=True).squeeze(-1), info
    raise ValueError(f"unknown linalg op {op!r}")


def reference(sig: Signature, *args: Any) -> Any:
    """The op in fp64 on upcast inputs (the result only: potrf -> L, posv -> x)."""
    import torch

    out = torch_arm(sig.op, *(t.to(torch.float64) for t in args))
    return out[0] if sig.op in ("potrf", "posv") else out


def _norm(t: Any) -> Any:
    """Per-problem Frobenius / 2-norm over everything but the batch dimension."""
    return t.reshape(t.shape[0], -1).norm(dim=1)


def residuals(sig: Signature, args: tuple[Any, ...], out: Any) -> Any:
    """Each problem's normwise backward error (fp64 tensor [batch]); NaN where the result is
    not finite."""
    import torch

    if isinstance(out, (tuple, list)):
        out = out[0]
    f64 = [t.to(torch.float64) for t in args]
    y = out.to(torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    op = sig.op
    if op == "potrf":
        a = f64[0]
        low = torch.tril(y)
        res = _norm(low @ low.mT - a) / _norm(a).clamp_min(tiny)
    elif op in ("trsv", "posv"):
        a = torch.tril(f64[0]) if op == "trsv" else f64[0]
        b = f64[1]
        r = (a @ y.unsqueeze(-1)).squeeze(-1) - b
        res = _norm(r) / (_norm(a) * _norm(y)).clamp_min(tiny)
    else:
        ref = reference(sig, *args)
        scale = _norm(f64[0]) * _norm(f64[1])
        res = _norm(y - ref) / scale.clamp_min(tiny)
    return torch.where(torch.isfinite(y.reshape(y.shape[0], -1)).all(dim=1), res,
                       torch.full_like(res, float("nan")))


def residual(sig: Signature, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
    """The worst problem's backward error (inf when any result is not finite): the verify
    rule's number for one arm on one set of inputs."""
    import torch

    res = residuals(sig, args, out)
    if torch.isnan(res).any():
        return float("inf")
    return float(res.max()) if res.numel() else 0.0


# A residual floor per dtype: an exact arm's residual can be 0 or far below the dtype's epsilon
# (torch on tiny n); the bound never falls below a few units of roundoff.
_EPS = {"fp64": 2.0 ** -52, "fp32": 2.0 ** -23, "fp16": 2.0 ** -10, "bf16": 2.0 ** -7}


def residual_bound(sig: Signature, torch_residual: float, factor: float) -> float:
    """What an arm's residual may reach: factor x torch's on the same inputs, at least factor x
    n units of roundoff."""
    return factor * max(torch_residual, sig.get("n") * _EPS[sig.dt])
