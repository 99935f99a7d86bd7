"""The fused cutoff solvers (kernels_direct, kernels_pcg) under the Triton interpreter (CPU): at
small sizes (n 2..8 with odd n and padding, T 1..5) against torch.linalg.solve on the dense
equivalent in fp32 and fp64; strided inputs read in place and never written; PCG's per-system
device-side exit (a solved system runs 0 iterations, a cap is reported); a non-SPD system
reported not ok; the dispatch rule of kernels="fused"/"auto".

TRITON_INTERPRET must be set before triton is imported, so the kernel checks run in a child
process (this file run as a script).
"""
import json
import os
import subprocess
import sys

import pytest

BOUND = {"fp64": 1e-9, "fp32": 1e-4}
# (batch, T, n); the last three are the shapes that failed on the H200 (n 4 at T 10: one 16-row
# chunk, 6 rows masked; n 12: NP 16 padding; n 32: one block row per chunk, the largest tile)
CASES = [(3, 3, 2), (2, 4, 3), (2, 5, 5), (1, 3, 8), (2, 1, 6), (2, 10, 4), (1, 4, 12), (1, 3, 32)]


def _child() -> None:
    import torch

    from tunedb.cutoff import fused, layout, solvers

    failures = []

    def close(name, x, ref, bound):
        err = (x.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-300)
        if not err <= 50 * bound:
            failures.append(f"{name}: relative error {err:.2e} > {50 * bound:.0e}")

    for dname, dtype in (("fp64", torch.float64), ("fp32", torch.float32)):
        bound = BOUND[dname]
        for batch, steps, n in CASES:
            strip, b = layout.random_system(batch, steps, n, dtype=dtype, seed=batch * 100 + steps * 10 + n)
            ref = torch.linalg.solve(layout.to_dense(strip.double()), b.double().reshape(batch, -1, 1)).reshape(b.shape)
            tag = f"{dname} batch={batch} T={steps} n={n}"
            x, ok = solvers.direct(strip, b, kernels="fused")
            close(f"direct {tag}", x, ref, bound)
            if not bool(ok.all()):
                failures.append(f"direct {tag}: ok {ok.tolist()} on SPD input")
            for x0 in ((None, torch.randn_like(b)) if n == 3 else (torch.randn_like(b),)):
                x, conv = solvers.pcg(strip, b, x0, tol=bound / 10, max_iter=steps * n + 20, kernels="fused")
                close(f"pcg {tag} x0={'given' if x0 is not None else 'none'}", x, ref, bound)
                if not bool(conv.all()):
                    failures.append(f"pcg {tag}: not converged")
                if float(layout.residual(strip, b, x).max()) > bound:
                    failures.append(f"pcg {tag}: residual above {bound}")

    # several pass chunks per system (the neighbours cross chunk edges; the last chunk partial)
    strip, b = layout.random_system(2, 5, 3, seed=6)
    ref = torch.linalg.solve(layout.to_dense(strip), b.reshape(2, -1, 1)).reshape(b.shape)
    for chunk in (1, 2):
        x, conv, _ = fused.pcg(strip, b, torch.randn_like(b), tol=1e-11, max_iter=60, chunk=chunk)
        close(f"pcg chunk={chunk}", x, ref, 1e-9)

    # strided views: every stride honoured, nothing written
    big, bb = layout.random_system(4, 4, 3, seed=7)
    strip, b = big[1::2], bb[::2].transpose(1, 2).contiguous().transpose(1, 2)
    x0 = torch.randn(2, 3, 4, dtype=b.dtype).transpose(1, 2)
    keep = [t.clone() for t in (big, bb, x0)]
    versions = [t._version for t in (big, bb, x0)]
    ref = torch.linalg.solve(layout.to_dense(strip), b.reshape(2, -1, 1)).reshape(b.shape)
    close("direct strided", solvers.direct(strip, b, kernels="fused")[0], ref, 1e-9)
    close("pcg strided", solvers.pcg(strip, b, x0, tol=1e-11, max_iter=60, kernels="fused")[0], ref, 1e-9)
    if not all(torch.equal(t, k) for t, k in zip((big, bb, x0), keep)) or \
            [t._version for t in (big, bb, x0)] != versions:
        failures.append("an input was written")

    # the device-side exit: per system, and the cap
    strip, b = layout.random_system(3, 4, 4, seed=8)
    exact = solvers.direct(strip, b, kernels="fused")[0]
    x0 = exact.clone()
    x0[1:] += 1e-3 * torch.randn_like(x0[1:])
    x, conv, iters = fused.pcg(strip, b, x0, tol=1e-10, max_iter=100)
    if int(iters[0]) != 0 or not torch.equal(x[0], exact[0]) or int(iters[1:].min()) < 2 or not bool(conv.all()):
        failures.append(f"device exit: iterations {iters.tolist()}, converged {conv.tolist()}")
    x, conv, iters = fused.pcg(strip, b, torch.zeros_like(b), tol=1e-14, max_iter=2)
    if bool(conv.any()) or iters.tolist() != [2, 2, 2]:
        failures.append(f"cap: iterations {iters.tolist()}, converged {conv.tolist()}")
    x, conv, iters = fused.pcg(strip, b, x0, tol=1e-10, max_iter=0)
    if not torch.equal(x, x0) or iters.tolist() != [0, 0, 0]:
        failures.append("max_iter=0 must return the warm start")

    # not SPD: the direct solver says so, finite output
    strip, b = layout.random_system(2, 3, 4, seed=9)
    strip[1, 1, :, 4:8] = -strip[1, 1, :, 4:8]
    x, ok = solvers.direct(strip, b, kernels="fused")
    if ok.tolist() != [True, False]:
        failures.append(f"non-SPD: ok {ok.tolist()}, expected [True, False]")
    # a residual test that cannot be decided (inf in b; ||b||^2 past fp32's range) is not converged
    strip, b = layout.random_system(2, 3, 4, dtype=torch.float32, seed=10)
    big = b * 1e19
    x, conv, _ = fused.pcg(strip, big, None, tol=1e-5, max_iter=20)
    if bool(conv.any()):
        failures.append(f"overflowing ||b||^2 reported converged: {conv.tolist()}")
    print("RESULT " + json.dumps(failures))


@pytest.mark.slow
def test_fused_solvers_match_dense_solve_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads(lines[-1][7:]) == []


def test_dispatch_rule(monkeypatch):
    """auto takes the fused kernels on CUDA tensors they cover only; fused refuses n > 32 by name,
    and a CPU strip unless the Triton interpreter runs."""
    import torch

    from tunedb.cutoff import fused, layout, solvers
    from tunedb.errors import CutoffError

    strip, b = layout.random_system(2, 3, 33)
    assert not fused.covers(strip) and fused.covers(strip[..., :32, :96])
    assert not solvers._use_fused(strip[..., :4, :12], "auto")  # a CPU tensor: the composed path
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert solvers._use_fused(strip[..., :4, :12], "fused")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(CutoffError, match="runs Triton kernels on CUDA tensors; the strip is on cpu"):
        solvers._use_fused(strip[..., :4, :12], "fused")
    with pytest.raises(CutoffError, match="kernels='fused' covers n <= 32; got n=33"):
        solvers.direct(strip, b, kernels="fused")
    with pytest.raises(CutoffError, match="kernels='fused' covers n <= 32; got n=33"):
        solvers.pcg(strip, b, kernels="fused")
    meta = lambda batch, n: torch.empty(batch, 2, n, 3 * n, device="meta")  # noqa: E731
    # auto's direct rule (fused.auto_direct): where the H200 measured the fused kernel faster
    assert fused.auto_direct(meta(4096, 16)) and fused.auto_direct(meta(1024, 32))
    assert not fused.auto_direct(meta(1025, 32)) and not fused.auto_direct(meta(8, 33))
    x = solvers.direct(strip, b)[0]  # auto on the CPU
    assert float(layout.residual(strip, b, x).max()) < 1e-10
    assert x.dtype == torch.float64


if __name__ == "__main__":
    _child()
