"""The cutoff solvers on the GPU: both captured in one CUDA graph (direct, and PCG at a fixed
iteration cap with the tolerance checked on the device), replayed on new values written into the
captured inputs and checked against torch.linalg.solve in fp64; the auto switch and a probe timed
with CUDA events. Run: pytest -m gpu tests/gpu/test_cutoff_gpu.py (about 30 s, most of it the
linalg ops' first Triton compiles)."""
from __future__ import annotations

import pytest
import torch

from tunedb import settings
from tunedb.cutoff import fitting as fitmod
from tunedb.cutoff import layout, probing as probemod, solvers

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BOUND = {torch.float32: 1e-4, torch.float64: 1e-9}


@pytest.fixture(autouse=True)
def _no_user_tier():
    with settings.override(USER_DB="off"):
        yield


def dense_solve(strip, b):
    batch, steps, n = b.shape
    return torch.linalg.solve(layout.to_dense(strip.double()), b.double().reshape(batch, -1, 1)).reshape(b.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernels", ["tunedb", "torch"])
@pytest.mark.parametrize("batch,steps,n", [(256, 16, 8), (64, 8, 12)])
def test_both_solvers_in_one_captured_graph(dtype, kernels, batch, steps, n):
    strip, b = layout.random_system(batch, steps, n, dtype=dtype, device="cuda", seed=1)
    x0 = torch.zeros_like(b)
    cap, tol = steps * n + 10, BOUND[dtype] / 10
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager first calls: the linalg ops resolve and compile here
        solvers.direct(strip, b, kernels=kernels)
        solvers.pcg(strip, b, x0, tol=tol, max_iter=cap)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        xd, okd = solvers.direct(strip, b, kernels=kernels)
        xi, oki = solvers.pcg(strip, b, x0, tol=tol, max_iter=cap)
    for seed in (2, 3):  # new systems written into the captured inputs
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


def test_pcg_with_a_cap_below_convergence_reports_it_under_capture():
    strip, b = layout.random_system(32, 8, 4, device="cuda", seed=4)
    x0 = torch.zeros_like(b)
    solvers.pcg(strip, b, x0, max_iter=2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, conv = solvers.pcg(strip, b, x0, tol=1e-12, max_iter=2)
    graph.replay()
    torch.cuda.synchronize()
    assert not bool(conv.any())


def test_probe_times_with_cuda_events_and_auto_switches():
    strip, b = layout.random_system(128, 16, 8, dtype=torch.float32, device="cuda", seed=5)
    exact = solvers.direct(strip, b)[0]

    def workload(solver):
        for k in range(24):
            level = 10.0 ** (-7 + (k % 8))
            x0 = exact + level * torch.randn_like(exact)
            solver(strip, b, x0, signal=level)

    p = probemod.probe(workload, problem="gpu-toy", device="cuda", allow_busy=True, tol=1e-4,
                       max_iter=200, check_every=2)
    assert p.timer == "cuda_events" and p.device == torch.cuda.get_device_name()
    assert all(t > 0 for tr in p.traces.values() for t in tr.times_ms)
    f = fitmod.fit(p, statistic="mean", scale="log")
    from tunedb.cutoff.store import Decision

    d = Decision("gpu-toy", p.device, f.cutoff)
    pa = probemod.probe(workload, problem="gpu-toy", device="cuda", policies=("auto",), decision=d,
                        allow_busy=True, tol=1e-4, max_iter=200, check_every=2)
    assert len(pa.traces["auto"].times_ms) == len(p.traces["direct"].times_ms)
