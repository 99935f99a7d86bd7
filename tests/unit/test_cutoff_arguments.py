"""The cutoff solvers' arguments a user can get wrong: a CutoffError naming the value and what is
allowed, not a crash inside Triton ('0 active drivers' for kernels='fused' on a CPU strip), a
TypeError (a float max_iter) or a silent reinterpretation (a negative tol squared into a
positive bound; a NaN signal compared with the cutoff)."""
from __future__ import annotations

import pytest
import torch

from tunedb.cutoff import layout, solvers, store
from tunedb.errors import CutoffError


@pytest.fixture
def system():
    strip, b = layout.random_system(3, 4, 5, dtype=torch.float64)[:2]
    return strip, b


def test_fused_kernels_on_a_cpu_strip_say_so(system, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for solve in (solvers.direct, solvers.pcg):
        with pytest.raises(CutoffError, match="kernels='fused' runs Triton kernels on CUDA tensors; the strip is on cpu"):
            solve(*system, kernels="fused")


@pytest.mark.parametrize("kw, words", [
    (dict(tol=-1.0), "tol must be a positive finite number"),
    (dict(tol=0.0), "got 0.0"),
    (dict(tol=float("nan")), "got nan"),
    (dict(tol=float("inf")), "got inf"),
    (dict(max_iter=2.5), "max_iter must be an int >= 0; got 2.5"),
    (dict(max_iter=-1), "got -1"),
    (dict(check_every=0.5), "check_every must be None or an int >= 1"),
])
def test_pcg_numbers_are_checked(system, kw, words):
    with pytest.raises(CutoffError, match=words.replace("(", r"\(")):
        solvers.pcg(*system, **kw)


def test_pcg_good_numbers_still_solve(system):
    strip, b = system
    x, conv = solvers.pcg(strip, b, tol=1e-12, max_iter=60, check_every=5)
    assert bool(conv.all()) and float(layout.residual(strip, b, x).max()) < 1e-10


@pytest.mark.parametrize("signal", [float("nan"), "high", None])
def test_solve_auto_needs_a_numeric_signal(system, signal):
    decision = store.Decision(problem="p", device="cpu", cutoff=1.0)
    with pytest.raises(CutoffError, match="signal"):
        solvers.solve(*system, signal=signal, decision=decision)


def test_solve_auto_with_a_numeric_signal_follows_the_decision(system):
    strip, b = system
    decision = store.Decision(problem="p", device="cpu", cutoff=1.0)
    for signal in (0.5, 2, torch.tensor(3.0)):
        x = solvers.solve(strip, b, signal=signal, decision=decision, tol=1e-12, max_iter=60)
        assert float(layout.residual(strip, b, x).max()) < 1e-9


def test_solve_marks_a_system_that_is_not_positive_definite():
    strip, b = layout.random_system(2, 3, 4, dtype=torch.float64)[:2]
    bad = strip.clone()
    bad[0, 1, :, 4:8] = -bad[0, 1, :, 4:8]  # one diagonal block of problem 0 negated: indefinite
    x, ok = solvers.solve(bad, b, linsys="direct", return_ok=True)
    assert ok.tolist() == [False, True]
    assert torch.isnan(x[0]).all() and torch.isfinite(x[1]).all()  # never a finite wrong answer
    torch.testing.assert_close(x[1], solvers.direct(strip, b)[0][1])
    assert torch.isnan(solvers.solve(bad, b, linsys="direct")[0]).all()
    x, ok = solvers.solve(strip, b, linsys="iterative", return_ok=True, max_iter=1)
    assert ok.shape == (2,) and torch.isfinite(x).all()
