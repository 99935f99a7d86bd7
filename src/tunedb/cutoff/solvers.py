"""The two solvers of one block-tridiagonal strip, and `solve(..., linsys=...)` that picks per call.

direct(strip, b): block Cholesky (block Thomas). Per step t the Schur complement
    S_0 = D_0,  W_t = C_{t-1}^{-1} L_t^T,  S_t = D_t - W_t^T W_t,  C_t = chol(S_t)
then y_t = C_t^{-1} (b_t - W_t^T y_{t-1}) forward and x_t = C_t^{-T} (y_t - W_{t+1} x_{t+1})
backward. Flat cost: T sequential steps whatever the right-hand side.

pcg(strip, b, x0): conjugate gradient preconditioned by block Jacobi (the diagonal blocks D_t),
warm-started from x0; per problem it stops at ||r|| <= tol ||b|| or after max_iter iterations.

Kernels (`kernels=`): "fused" runs the fused Triton solvers (`fused`: the direct solver is ONE
kernel over all T steps, PCG two launches whatever the cap; each system leaves PCG's loop on the
device when it converges); they cover n <= 32, fp32 and fp64. "auto" (default) takes them on
CUDA tensors they cover where they were measured faster (PCG: all of it; direct: n <= 16, and
n <= 32 up to 1024 systems, fused.auto_direct), and otherwise the composed path: "tunedb" composes the direct solver
from the linalg family's tuned ops (tunedb::linalg_potrf / _trsv per block step, the matrix and
back solves on torch.linalg.solve_triangular; an n outside the family's 2..128 takes
torch.linalg), "torch" from torch.linalg alone; PCG's composed path is eager torch (one set of
batched ops per iteration: alpha = 0 once a problem converged, so with check_every=None it runs
exactly max_iter iterations without a host sync, and check_every=k reads "all converged?" on the
host every k iterations and leaves early). "auto" on a CPU tensor: torch.linalg / eager torch.

Both read the caller's tensors as given (views of the strip; no copy, no reformat, no writes)
and return (x, ok): a new [batch, T, n] solution and a [batch] bool on the device (direct: every
Schur complement was positive definite; pcg: converged within the cap). Neither syncs the host
except pcg's optional check_every. Numerical contract: both reach residual(strip, b, x) <= tol
(direct: to roundoff; tests hold both to the same bound).
"""
from __future__ import annotations

import math
import numbers
import os
from typing import Any

from tunedb.cutoff import layout
from tunedb.errors import CutoffError

KERNELS = ("auto", "fused", "tunedb", "torch")
POLICIES = ("direct", "iterative")


FAMILY = "linalg"
_served: dict[tuple[Any, ...], bool] = {}  # (op, dtype, n) -> the family takes it
_ops: dict[str, Any] = {}


def _family_op(op: str) -> Any:
    """torch.ops.tunedb.linalg_<op>, registered through the family registry (the seam: no core
    module imports a concrete family)."""
    got = _ops.get(op)
    if got is None:
        import torch

        from tunedb import families
        from tunedb.families.contract import hook

        hook(families.get(FAMILY), "register_ops")()
        got = _ops[op] = getattr(torch.ops.tunedb, f"{FAMILY}_{op}")
    return got


def _tuned(op: str, kernels: str, *tensors: Any) -> bool:
    a = tensors[0]
    if kernels in ("torch", "fused") or (kernels == "auto" and a.device.type != "cuda"):
        return False
    key = (op, a.dtype, a.shape[-1])
    hit = _served.get(key)
    if hit is None:  # the family's signature check: an n or dtype it does not take goes to torch
        from tunedb import families
        from tunedb.errors import SignatureError

        try:
            families.get(FAMILY).signature_of(op, *tensors)
            hit = True
        except SignatureError:
            hit = False
        _served[key] = hit
    return hit


def _potrf(a: Any, kernels: str) -> tuple[Any, Any]:
    if _tuned("potrf", kernels, a):
        return _family_op("potrf")(a)
    import torch

    return torch.linalg.cholesky_ex(a)


def _lower_solve(c: Any, v: Any, kernels: str) -> Any:
    if _tuned("trsv", kernels, c, v):
        return _family_op("trsv")(c, v)
    import torch

    return torch.linalg.solve_triangular(c, v.unsqueeze(-1), upper=False).squeeze(-1)


def _check_kernels(kernels: str) -> None:
    if kernels not in KERNELS:
        raise CutoffError(f"kernels={kernels!r} not supported; allowed: {', '.join(KERNELS)}")


def _use_fused(strip: Any, kernels: str, op: str = "pcg") -> bool:
    from tunedb.cutoff import fused

    if kernels == "fused":
        if not fused.covers(strip):
            raise CutoffError(f"kernels='fused' covers n <= {fused.MAX_N}; got n={strip.shape[-2]} "
                              "(use kernels='auto', which falls back to the composed solvers)")
        if strip.device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise CutoffError(f"kernels='fused' runs Triton kernels on CUDA tensors; the strip is on "
                              f"{strip.device} (use kernels='auto' or 'torch' there, or TRITON_INTERPRET=1 on the CPU)")
        return True
    if kernels != "auto" or strip.device.type != "cuda":
        return False
    return fused.auto_direct(strip) if op == "direct" else fused.covers(strip)


def direct(strip: Any, b: Any, *, kernels: str = "auto") -> tuple[Any, Any]:
    """(x, ok): block Cholesky solve of every system of the batch (L and D read; R unread)."""
    import torch

    _check_kernels(kernels)
    _, steps, _ = layout.check(strip, b)
    if _use_fused(strip, kernels, "direct"):
        from tunedb.cutoff import fused

        return fused.direct(strip, b)
    low, diag, _ = layout.blocks(strip)
    factors, couplings, ys = [], [], []
    ok = None
    for t in range(steps):
        if t == 0:
            schur = diag[:, 0]
        else:
            w = torch.linalg.solve_triangular(factors[-1], low[:, t].mT, upper=False)
            couplings.append(w)
            schur = diag[:, t] - w.mT @ w
        c, info = _potrf(schur.contiguous(), kernels)
        ok = info == 0 if ok is None else ok & (info == 0)
        factors.append(c)
        rhs = b[:, t] if t == 0 else b[:, t] - (couplings[-1].mT @ ys[-1].unsqueeze(-1)).squeeze(-1)
        ys.append(_lower_solve(c, rhs.contiguous(), kernels))
    xs: list[Any] = [None] * steps
    for t in range(steps - 1, -1, -1):
        rhs = ys[t] if t == steps - 1 else ys[t] - (couplings[t] @ xs[t + 1].unsqueeze(-1)).squeeze(-1)
        xs[t] = torch.linalg.solve_triangular(factors[t].mT, rhs.unsqueeze(-1), upper=True).squeeze(-1)
    return torch.stack(xs, dim=1), ok


def _safe_div(num: Any, den: Any) -> Any:
    import torch

    return num / torch.where(den == 0, torch.ones_like(den), den)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_bool(v: Any) -> bool:
    """A Python or numpy bool (numpy's is no subclass of bool): no switching signal, though float() takes it."""
    return type(v).__name__ in ("bool", "bool_")


def _check_pcg(tol: Any, max_iter: Any, check_every: Any) -> None:
    """CutoffError naming a bad PCG argument (solve checks them whatever policy it picks: a bad one
    surfaced only at the first calm step of a control loop, maybe long after deployment)."""
    if not _is_int(max_iter) or max_iter < 0:
        raise CutoffError(f"max_iter must be an int >= 0; got {max_iter!r}")
    if check_every is not None and (not _is_int(check_every) or check_every < 1):
        raise CutoffError(f"check_every must be None or an int >= 1; got {check_every!r}")
    if tol is not None and not (isinstance(tol, numbers.Real) and not isinstance(tol, bool) and 0 < tol < math.inf):
        raise CutoffError(f"tol must be a positive finite number (||r|| <= tol ||b||); got {tol!r}")


def pcg(strip: Any, b: Any, x0: Any = None, *, tol: float | None = None, max_iter: int = 100,
        check_every: int | None = None, kernels: str = "auto") -> tuple[Any, Any]:
    """(x, converged): block-Jacobi preconditioned CG from x0 (zeros when None); per problem it
    stops at ||b - A x|| <= tol ||b|| (default tol: 1e-10 fp64, 1e-5 fp32) or after max_iter.
    check_every only concerns the composed path (the fused loop leaves on the device)."""
    import torch

    batch, steps, n = layout.check(strip, b, x0)
    _check_pcg(tol, max_iter, check_every)
    _check_kernels(kernels)
    if tol is None:
        tol = 1e-10 if strip.dtype == torch.float64 else 1e-5
    if _use_fused(strip, kernels):
        from tunedb.cutoff import fused

        x, conv, _ = fused.pcg(strip, b, x0, tol=tol, max_iter=max_iter)
        return x, conv
    _, diag, _ = layout.blocks(strip)
    jac, _ = torch.linalg.cholesky_ex(diag)  # [batch, T, n, n]; reads the view, writes nothing

    def precond(r: Any) -> Any:
        y = torch.linalg.solve_triangular(jac, r.unsqueeze(-1), upper=False)
        return torch.linalg.solve_triangular(jac.mT, y, upper=True).squeeze(-1)

    def dot(u: Any, v: Any) -> Any:
        return (u * v).sum(dim=(1, 2))

    x = b.new_zeros(b.shape) if x0 is None else x0  # never written: every update makes a new x
    r = b - layout.matvec(strip, x)
    bound = (tol * b.flatten(1).norm(dim=1)) ** 2
    # an infinite or NaN bound (b holding inf, or ||b||^2 past the dtype's range) proves nothing:
    # those problems never count as converged (rr <= inf held before any iteration)
    bound = torch.where(torch.isfinite(bound), bound, torch.full_like(bound, -1.0))
    done = dot(r, r) <= bound
    z = precond(r)
    p = z
    rz = dot(r, z)
    for i in range(max_iter):
        ap = layout.matvec(strip, p)
        alpha = torch.where(done, torch.zeros_like(rz), _safe_div(rz, dot(p, ap)))
        x = x + alpha[:, None, None] * p
        r = r - alpha[:, None, None] * ap
        done = done | (dot(r, r) <= bound)
        z = precond(r)
        rz_new = dot(r, z)
        p = z + _safe_div(rz_new, rz)[:, None, None] * p
        rz = rz_new
        if check_every is not None and (i + 1) % check_every == 0 and bool(done.all()):
            break
    return x, done


def solve(strip: Any, b: Any, x0: Any = None, *, linsys: str = "auto", signal: float | None = None,
          problem: str | None = None, decision: Any = None, tol: float | None = None,
          max_iter: int = 100, check_every: int | None = None, kernels: str = "auto",
          return_ok: bool = False) -> Any:
    """x: the solution by the chosen policy (with return_ok, (x, ok): ok a [batch] bool on the
    device, as direct() and pcg() give). linsys: "direct", "iterative", or "auto", which
    switches per call on `signal` (the caller's switching signal, a host number) against the
    persisted cutoff of this problem class on this device (`decision`, else the user's
    configuration, see tunedb.cutoff.store). A problem the direct solve finds not positive
    definite gets NaN in x (no host sync: the caller sees it, never a finite wrong answer); one
    that PCG leaves unconverged within max_iter keeps its last iterate (ok says which)."""
    _check_pcg(tol, max_iter, check_every)
    policy = linsys
    if linsys == "auto":
        if signal is None:
            raise CutoffError("linsys='auto' needs signal= (the switching signal of this solve)")
        try:  # a bool is no signal (True compared as 1.0)
            value = math.nan if is_bool(signal) else float(signal)
        except (TypeError, ValueError):
            value = math.nan
        if math.isnan(value):
            raise CutoffError(f"signal={signal!r} must be a number (the switching signal of this solve, "
                              "compared with the persisted cutoff)")
        if decision is None:
            from tunedb.cutoff import store

            decision = store.lookup(problem or store.problem_class(strip), store.device_name(strip.device))
        elif not callable(getattr(decision, "policy_for", None)):  # was an AttributeError from inside
            raise CutoffError(f"decision={decision!r} must be a fitted Decision (tunedb.cutoff.fit / persist / "
                              "lookup), or None to look this problem's cutoff up")
        policy = decision.policy_for(value)
    if policy == "direct":
        x, ok = direct(strip, b, kernels=kernels)
        x = x.masked_fill(~ok.view(-1, *([1] * (x.dim() - 1))), math.nan)
        return (x, ok) if return_ok else x
    if policy == "iterative":
        x, ok = pcg(strip, b, x0, tol=tol, max_iter=max_iter, check_every=check_every, kernels=kernels)
        return (x, ok) if return_ok else x
    if linsys == "auto":  # a decision whose policy is not one (an object standing in for a Decision)
        raise CutoffError(f"decision={decision!r} chose policy {policy!r} for signal={signal!r}; "
                          f"allowed: direct, iterative")
    raise CutoffError(f"linsys={linsys!r} not supported; allowed: direct, iterative, auto")
