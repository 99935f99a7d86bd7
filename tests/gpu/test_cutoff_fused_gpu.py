"""The fused cutoff solvers on the GPU: both captured in one CUDA graph, replayed on new systems
written into the captured inputs, against an fp64 torch.linalg.solve of the dense equivalent;
strided (non-contiguous) strips read in place; PCG's device-side exit (iterations follow the warm
start, a cap reported as not converged); PCG at the shapes whose in-place updates raced; n > 32
falls back to the composed solvers. Run: pytest -m gpu tests/gpu/test_cutoff_fused_gpu.py (about
40-70 s, most of it Triton compiles)."""
from __future__ import annotations

import pytest
import torch

from tunedb.cutoff import fused, layout, solvers

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BOUND = {torch.float32: 1e-4, torch.float64: 1e-9}


def dense_solve(strip, b):
    batch = b.shape[0]
    return torch.linalg.solve(layout.to_dense(strip.double()), b.double().reshape(batch, -1, 1)).reshape(b.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,steps,n", [(300, 10, 4), (64, 30, 12), (33, 7, 32), (40, 1, 17)])
def test_fused_solvers_in_one_captured_graph(dtype, batch, steps, n):
    strip, b = layout.random_system(batch, steps, n, dtype=dtype, device="cuda", seed=1)
    x0 = torch.zeros_like(b)
    tol = BOUND[dtype] / 10
    cap = steps * n + 10
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the Triton compiles, outside the capture
        solvers.direct(strip, b)
        solvers.pcg(strip, b, x0, tol=tol, max_iter=cap)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        xd, okd = solvers.direct(strip, b)  # auto on CUDA, n <= 32: the fused kernels
        xi, oki = solvers.pcg(strip, b, x0, tol=tol, max_iter=cap)
    for seed in (2, 3):
        s2, b2 = layout.random_system(batch, steps, n, dtype=dtype, device="cuda", seed=seed)
        strip.copy_(s2)
        b.copy_(b2)
        graph.replay()
        torch.cuda.synchronize()
        ref = dense_solve(strip, b)
        assert bool(okd.all()) and bool(oki.all())
        for x in (xd, xi):
            assert float(layout.residual(strip, b, x).max()) <= BOUND[dtype]
            torch.testing.assert_close(x.double(), ref, rtol=0, atol=100 * BOUND[dtype] * ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_inputs_are_read_in_place(dtype):
    big, bb = layout.random_system(64, 6, 8, dtype=dtype, device="cuda", seed=4)
    strip, b = big[::2], bb[1::2].transpose(1, 2).contiguous().transpose(1, 2)  # odd strides
    x0 = torch.randn(b.shape[0], 8, 6, dtype=dtype, device="cuda").transpose(1, 2)
    keep = [t.clone() for t in (big, bb, x0)]
    ref = dense_solve(strip, b)
    xd, ok = solvers.direct(strip, b, kernels="fused")
    xi, conv = solvers.pcg(strip, b, x0, tol=BOUND[dtype] / 10, max_iter=200, kernels="fused")
    assert bool(ok.all()) and bool(conv.all())
    for x in (xd, xi):
        torch.testing.assert_close(x.double(), ref, rtol=0, atol=100 * BOUND[dtype] * ref.abs().max().item())
    assert all(torch.equal(t, k) for t, k in zip((big, bb, x0), keep))


def test_pcg_exits_on_the_device_per_system():
    strip, b = layout.random_system(16, 12, 8, device="cuda", seed=5)
    exact, _ = solvers.direct(strip, b)
    x0 = exact.clone()
    x0[8:] += 1e-3 * torch.randn_like(x0[8:])
    x, conv, iters = fused.pcg(strip, b, x0, tol=1e-10, max_iter=200)
    assert bool(conv.all())
    assert int(iters[:8].max()) <= 1 and int(iters[8:].min()) > 1  # the warm start sets the work
    _, conv2, iters2 = fused.pcg(strip, b, torch.zeros_like(b), tol=1e-14, max_iter=3)
    assert not bool(conv2.any()) and bool((iters2 == 3).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch,steps,n", [(4096, 10, 4), (512, 32, 12)])
def test_fused_pcg_where_vectors_are_shared_by_warps(dtype, batch, steps, n):
    """The shapes whose [TB, NP] pass vectors (64 values) are held by several of the 128 threads'
    warps, where the in-place x, r, p updates raced on the H200: the fused iterates equal the
    composed PCG's at a fixed iteration count before convergence (a double update would not),
    and a converged run meets the residual bound on every system."""
    strip, b = layout.random_system(batch, steps, n, dtype=dtype, device="cuda", seed=11)
    x0 = torch.zeros_like(b)
    scale = dense_solve(strip[:8], b[:8]).abs().max().item()
    for iters in (1, 2, 5):
        xf = solvers.pcg(strip, b, x0, tol=0.0, max_iter=iters, kernels="fused")[0]
        xt = solvers.pcg(strip, b, x0, tol=0.0, max_iter=iters, kernels="torch")[0]
        err = (xf.double() - xt.double()).abs().max().item() / scale
        assert err <= 10 * BOUND[dtype], f"{iters} iterations: fused vs torch {err:.2e}"
    x, conv, iters = fused.pcg(strip, b, x0, tol=BOUND[dtype] / 10, max_iter=200)
    assert bool(conv.all()) and int(iters.max()) < 200
    assert float(layout.residual(strip, b, x).max()) <= BOUND[dtype]


def test_large_n_falls_back_to_the_composed_solver():
    strip, b = layout.random_system(8, 4, 40, device="cuda", seed=6)
    x = solvers.solve(strip, b, linsys="direct")
    assert float(layout.residual(strip, b, x).max()) <= 1e-9
    x = solvers.solve(strip, b, torch.zeros_like(b), linsys="iterative", tol=1e-11, max_iter=400)
    assert float(layout.residual(strip, b, x).max()) <= 1e-9
