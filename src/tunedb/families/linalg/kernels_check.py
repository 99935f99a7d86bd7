"""Inputs and numerical checks for the small linear-algebra kernels (tests, bench, the gate).

Inputs are seeded and built in fp64 on the target device (a device generator: a seed gives
the same problems on every run of one device type), then cast. SPD matrices are A = M M^T / n + n^0.5 I (well conditioned);
kind="hard" gives eigenvalues spread over `cond` (A = Q diag(logspace) Q^T).

Residuals are per problem, in fp64, on the inputs' device: dot/gemv/gemm ||C - ref|| / (||A|| ||B||), potrf
||L L^T - A|| / ||A||, trsv ||L x - b|| / (||L|| ||x||), posv ||A x - b|| / (||A|| ||x||)
(Frobenius / 2-norms). `within_torch` bounds an arm's worst residual by a small multiple of
what the torch arm gets on the same inputs (floored at the dtype's unit roundoff).
"""
from __future__ import annotations

from typing import Any

_EPS = {"fp32": 2.0 ** -24, "fp64": 2.0 ** -53, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def torch_dtype(dtype: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def spd(batch: int, n: int, seed: int = 0, kind: str = "well", cond: float = 1e4, device: Any = "cpu") -> Any:
    """[batch, n, n] fp64 SPD matrices on `device`."""
    import math

    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    f64 = {"dtype": torch.float64, "device": device}
    if kind == "well":
        m = torch.randn(batch, n, n, generator=g, **f64)
        return m @ m.mT / n + n ** 0.5 * torch.eye(n, **f64)
    q, _ = torch.linalg.qr(torch.randn(batch, n, n, generator=g, **f64))
    ev = torch.logspace(0, -math.log10(cond), n, **f64)
    a = (q * ev) @ q.mT
    return (a + a.mT) / 2


def make_inputs(op: str, batch: int, n: int, dtype: str, device: Any = "cpu", seed: int = 0,
                kind: str = "well") -> tuple:
    """Valid inputs for `op` (fresh tensors, contiguous) on `device`."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed + 7919)
    f64 = {"dtype": torch.float64, "device": device}
    vec = torch.randn(batch, n, generator=g, **f64)
    if op == "dot":
        parts = (vec, torch.randn(batch, n, generator=g, **f64))
    elif op in ("gemv", "gemm"):
        a = torch.randn(batch, n, n, generator=g, **f64)
        parts = (a, vec) if op == "gemv" else (a, torch.randn(batch, n, n, generator=g, **f64))
    elif op == "potrf":
        parts = (spd(batch, n, seed, kind, device=device),)
    elif op == "trsv":
        parts = (torch.linalg.cholesky(spd(batch, n, seed, kind, device=device)), vec)
    elif op == "posv":
        parts = (spd(batch, n, seed, kind, device=device), vec)
    else:
        raise ValueError(f"unknown op {op!r}")
    dt = torch_dtype(dtype)
    return tuple(p.to(dt).contiguous() for p in parts)


def residual(op: str, inputs: tuple, result: Any) -> Any:
    """Per-problem fp64 residual [batch] of `result` (for potrf/posv: the first element)."""
    import torch

    if isinstance(result, tuple):
        result = result[0]
    ins = [t.detach().to(torch.float64) for t in inputs]
    res = result.detach().to(torch.float64)
    tiny = torch.finfo(torch.float64).tiny

    def nrm(t: Any) -> Any:
        return torch.linalg.vector_norm(t.flatten(1), dim=1)

    if op == "dot":
        ref = (ins[0] * ins[1]).sum(-1)
        return (res - ref).abs() / (nrm(ins[0]) * nrm(ins[1]) + tiny)
    if op == "gemv":
        ref = (ins[0] @ ins[1].unsqueeze(2)).squeeze(2)
        return nrm(res - ref) / (nrm(ins[0]) * nrm(ins[1]) + tiny)
    if op == "gemm":
        return nrm(res - ins[0] @ ins[1]) / (nrm(ins[0]) * nrm(ins[1]) + tiny)
    if op == "potrf":
        lower = torch.tril(ins[0])
        a = lower + torch.tril(ins[0], -1).mT
        return nrm(res @ res.mT - a) / (nrm(a) + tiny)
    if op == "trsv":
        lo = torch.tril(ins[0])
        return nrm((lo @ res.unsqueeze(2)).squeeze(2) - ins[1]) / (nrm(lo) * nrm(res) + tiny)
    if op == "posv":
        return nrm((ins[0] @ res.unsqueeze(2)).squeeze(2) - ins[1]) / (nrm(ins[0]) * nrm(res) + tiny)
    raise ValueError(f"unknown op {op!r}")


def within_torch(op: str, dtype: str, inputs: tuple, result: Any, torch_result: Any,
                 factor: float = 8.0) -> tuple[bool, float, float]:
    """(ok, arm's worst residual, bound): worst <= factor * max(torch's worst, unit roundoff)."""
    import torch

    mine = residual(op, inputs, result)
    theirs = residual(op, inputs, torch_result)
    worst = float(mine.max()) if mine.numel() else 0.0
    bound = factor * max(float(theirs.max()) if theirs.numel() else 0.0, _EPS[dtype])
    finite = bool(torch.isfinite(mine).all())
    return finite and worst <= bound, worst, bound


def one_per_packing(op: str, n: int, dtype: str) -> list:
    """The prior's first valid config of each packing (what the GPU tests cover per cell)."""
    from tunedb.families.linalg import kernels_space as space
    from tunedb.families.linalg import kernels_prior as prior

    ranked = prior.candidates(op, n, dtype)
    firsts: dict = {}
    for c in ranked:
        firsts.setdefault(c.packing, c)
    return list(firsts.values())
