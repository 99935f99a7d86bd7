"""The two block-tridiagonal solvers: against torch.linalg.solve on dense equivalents, one residual
bound for both, and the layout contract (same tensors, no copy of the inputs, no writes)."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tunedb.cutoff import layout, solvers
from tunedb.errors import CutoffError

BOUND = {torch.float64: 1e-9, torch.float32: 1e-4}


def dense_solve(strip, b):
    batch, steps, n = b.shape
    return torch.linalg.solve(layout.to_dense(strip), b.reshape(batch, steps * n, 1)).reshape(b.shape)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch,steps,n", [(3, 5, 4), (2, 1, 3), (4, 7, 1), (2, 6, 8)])
def test_both_solvers_match_torch_linalg_solve(dtype, batch, steps, n):
    strip, b = layout.random_system(batch, steps, n, dtype=dtype, seed=batch * 100 + steps * 10 + n)
    ref = dense_solve(strip.double(), b.double())
    tol = BOUND[dtype]
    for kernels in ("tunedb", "torch"):
        x, ok = solvers.direct(strip, b, kernels=kernels)
        assert bool(ok.all())
        assert x.dtype == dtype and x.shape == b.shape
        torch.testing.assert_close(x.double(), ref, rtol=0, atol=50 * tol * ref.abs().max().item())
    x, conv = solvers.pcg(strip, b, tol=tol / 10, max_iter=steps * n + 20)
    assert bool(conv.all())
    torch.testing.assert_close(x.double(), ref, rtol=0, atol=50 * tol * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_same_residual_bound_for_both(dtype):
    strip, b = layout.random_system(6, 9, 5, dtype=dtype, seed=3)
    bound = BOUND[dtype]
    xd, _ = solvers.direct(strip, b)
    xi, conv = solvers.pcg(strip, b, tol=bound, max_iter=200)
    assert bool(conv.all())
    assert float(layout.residual(strip, b, xd).max()) <= bound
    assert float(layout.residual(strip, b, xi).max()) <= bound


def iterations_needed(strip, b, x0, tol):
    for k in range(200):
        if bool(solvers.pcg(strip, b, x0, tol=tol, max_iter=k)[1].all()):
            return k
    raise AssertionError("no convergence in 200 iterations")


def test_pcg_warm_start_needs_fewer_iterations_and_cap_is_respected():
    strip, b = layout.random_system(4, 8, 4, seed=5)
    exact, _ = solvers.direct(strip, b)
    cold = iterations_needed(strip, b, None, 1e-10)
    warm = iterations_needed(strip, b, exact + 1e-6 * torch.randn_like(exact), 1e-10)
    assert 0 < warm < cold
    assert iterations_needed(strip, b, exact, 1e-10) == 0
    x0 = torch.randn_like(b)
    x, _ = solvers.pcg(strip, b, x0, max_iter=0)
    assert torch.equal(x, x0)  # zero iterations: the warm start, untouched


def test_converged_problems_stop_updating():
    """Masking: a problem already at its solution is not moved by the others' iterations."""
    strip, b = layout.random_system(3, 6, 4, seed=9)
    exact, _ = solvers.direct(strip, b)
    x0 = exact.clone()
    x0[1:] = 0
    x, conv = solvers.pcg(strip, b, x0, tol=1e-8, max_iter=60)
    assert bool(conv.all())
    assert torch.equal(x[0], exact[0])


class CopyRecorder(TorchDispatchMode):
    """Every copy-like op reading the storage of a watched tensor, with its output size."""

    COPIES = {"aten.clone.default", "aten._to_copy.default", "aten.copy_.default", "aten.contiguous.default"}

    def __init__(self, watched):
        super().__init__()
        self.ptrs = {t.untyped_storage().data_ptr(): t for t in watched}
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) in self.COPIES:
            for a in args:
                if isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() in self.ptrs:
                    self.copies.append((str(func), self.ptrs[a.untyped_storage().data_ptr()], out.numel()))
        return out


def test_layout_identity_no_copy_no_writes():
    """Both solvers consume the same tensors as given: neither writes them (version counters and
    values unchanged, same storage) and neither copies a whole input (a block of the strip may be
    factored into a new tensor; the strip, b and x0 are never duplicated or reformatted)."""
    strip, b = layout.random_system(3, 6, 4, seed=11)
    x0 = torch.randn_like(b)
    snapshot = [t.clone() for t in (strip, b, x0)]
    versions = [t._version for t in (strip, b, x0)]
    ptrs = [t.data_ptr() for t in (strip, b, x0)]
    rec = CopyRecorder([strip, b, x0])
    with rec:
        xd, _ = solvers.direct(strip, b, kernels="torch")
        xi, _ = solvers.pcg(strip, b, x0, max_iter=40)
    for t, snap, v, p in zip((strip, b, x0), snapshot, versions, ptrs):
        assert t._version == v and t.data_ptr() == p
        assert torch.equal(t, snap)
    for func, src, numel in rec.copies:
        assert numel < src.numel(), f"{func} copied a whole input ({numel} elements)"
    assert xd.data_ptr() not in ptrs and xi.data_ptr() not in ptrs
    torch.testing.assert_close(xd, xi, rtol=0, atol=1e-8)


def test_solve_dispatches_and_checks_arguments():
    strip, b = layout.random_system(2, 4, 3, seed=1)
    x = solvers.solve(strip, b, linsys="direct")
    assert float(layout.residual(strip, b, x).max()) < 1e-12
    with pytest.raises(CutoffError, match="linsys='bogus' not supported"):
        solvers.solve(strip, b, linsys="bogus")
    with pytest.raises(CutoffError, match="needs signal="):
        solvers.solve(strip, b, linsys="auto")
    with pytest.raises(CutoffError, match=r"strip must be \[batch, T, n, 3n\]"):
        solvers.direct(strip[..., :-1], b)
    with pytest.raises(CutoffError, match="b must be"):
        solvers.pcg(strip, b[:, :-1])
    with pytest.raises(CutoffError, match="kernels='cublas' not supported"):
        solvers.direct(strip, b, kernels="cublas")
    with pytest.raises(CutoffError, match="dtype"):
        solvers.direct(strip.half(), b.half())


def test_strip_views_and_dense_equivalent():
    strip, _ = layout.random_system(2, 4, 3, seed=2)
    low, diag, up = layout.blocks(strip)
    assert low.data_ptr() == strip.data_ptr()
    assert torch.equal(up[:, :-1], low[:, 1:].mT)  # symmetric: R_t = L_{t+1}^T
    assert not low[:, 0].any() and not up[:, -1].any()  # the padding blocks
    dense = layout.to_dense(strip)
    torch.testing.assert_close(dense, dense.mT)
    x = torch.randn(2, 4, 3, dtype=strip.dtype)
    torch.testing.assert_close(layout.matvec(strip, x), (dense @ x.reshape(2, 12, 1)).reshape(2, 4, 3))


@pytest.mark.parametrize("n", [4, 16, 32, 40])
def test_random_systems_are_spd_at_every_n(n):
    """The generator every solver test and benchmark uses: SPD with lambda_min >= 1 at any n (it
    used to make indefinite systems at n >= 16, which Cholesky rightly refused)."""
    import torch

    for seed in (1, 6):
        strip, _ = layout.random_system(12, 5, n, seed=seed)
        dense = layout.to_dense(strip)
        torch.testing.assert_close(dense, dense.mT, rtol=0, atol=1e-12)
        assert float(torch.linalg.eigvalsh(dense)[:, 0].min()) >= 1.0


def test_pcg_never_reports_an_undecidable_residual_test_as_converged():
    """||b||^2 is the test's bound: an inf in b, or a finite fp32 b whose square overflows, made
    r.r <= inf true before any iteration (converged, with x NaN); such problems are not converged."""
    strip, b = layout.random_system(2, 3, 4, seed=11)
    b_inf = b.clone()
    b_inf[0, 0, 0] = float("inf")
    _, conv = solvers.pcg(strip, b_inf)
    assert conv.tolist() == [False, True]
    s32, b32 = layout.random_system(2, 3, 4, dtype=torch.float32, seed=12)
    x, conv = solvers.pcg(s32, b32 * 1e19)
    assert not bool(conv.any())
    x, ok = solvers.solve(s32, b32 * 1e19, linsys="iterative", return_ok=True)
    assert not bool(ok.any())
