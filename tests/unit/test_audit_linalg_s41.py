"""Session 41 audit of the small batched linear algebra entry points and tunedb.cutoff's solvers,
called on inputs a robotics / scientific user passes (CPU: the library arm, torch's own forms).

- The linalg entry points take torch.linalg's shapes (a 2-D A, 1-D vectors), but where the
  SECOND operand had too few dimensions (posv(A [n, n], b 0-d), gemm(A [n, n], B [n])) the op's
  check blamed the first: "posv's A must be a batch of square matrices [batch, n, n], got shape
  (4, 4)", a shape the entry point accepts (ops._any_shape).
- tunedb.cutoff.solve / direct / pcg with b=None (or a numpy b, or no tensor for the strip) failed
  deep inside ("'NoneType' object is not subscriptable", "... has no attribute 'new_zeros'"), or
  named matching dtypes as the mismatch ("b is float64 on cpu; the strip is torch.float64 on
  cpu"); a `decision=` that is not a fitted Decision raised an AttributeError (layout.check,
  solvers.solve).
"""
from __future__ import annotations

import pytest
import torch

from tunedb import cutoff
from tunedb.errors import CutoffError, SignatureError
from tunedb.families.linalg import ops as la


def _spd(*lead, n):
    g = torch.randn(*lead, n, n, dtype=torch.float64)
    return g @ g.mT / n + torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 4, 129])
@pytest.mark.parametrize("op, second", [("posv", ()), ("trsv", ()), ("gemv", ()), ("gemm", (4,)), ("dot", ())])
def test_a_second_operand_with_too_few_dims_is_the_one_named(op, second, n):
    first = torch.randn(n, dtype=torch.float64) if op == "dot" else _spd(n=n)
    bad = torch.zeros(second, dtype=torch.float64)
    name = {"posv": "b", "trsv": "b", "gemv": "x", "gemm": "B", "dot": "y"}[op]
    with pytest.raises(SignatureError, match=rf"linalg {op}'s {name} must have shape .*got shape \[{', '.join(map(str, second))}\]"):
        getattr(la, op)(first, bad)


def test_a_first_operand_with_too_few_dims_is_named_with_the_shapes_accepted():
    with pytest.raises(SignatureError, match=r"linalg potrf's A must have shape \[\.\.\., n, n\].*got shape \[4\]"):
        la.potrf(torch.ones(4, dtype=torch.float64))


def test_good_shapes_still_match_torch():
    a, b = _spd(2, 3, n=4), torch.randn(2, 3, 4, dtype=torch.float64)
    low, info = torch.linalg.cholesky_ex(a)
    x, got_info = la.posv(a, b)
    assert torch.allclose(x, torch.cholesky_solve(b.unsqueeze(-1), low).squeeze(-1), atol=1e-10)
    assert torch.equal(got_info, info)
    got = la.dot(b[0, 0], b[0, 1])
    assert got.shape == () and torch.allclose(got, torch.dot(b[0, 0], b[0, 1]), atol=1e-12)


@pytest.fixture
def system():
    return cutoff.random_system(2, 3, 4)


@pytest.mark.parametrize("call", [
    lambda s, b: cutoff.solve(s, None, linsys="direct"),
    lambda s, b: cutoff.solve(s, None, linsys="iterative"),
    lambda s, b: cutoff.direct(s, None),
    lambda s, b: cutoff.pcg(s, None),
])
def test_cutoff_without_b_names_it(system, call):
    with pytest.raises(CutoffError, match="b must be a torch.Tensor .*got NoneType"):
        call(*system)


def test_cutoff_numpy_or_missing_operands_are_named(system):
    strip, b = system
    with pytest.raises(CutoffError, match="b must be a torch.Tensor .*got ndarray"):
        cutoff.solve(strip, b.numpy(), linsys="direct")
    with pytest.raises(CutoffError, match="x0 must be a torch.Tensor .*got list"):
        cutoff.pcg(strip, b, b.tolist())
    with pytest.raises(CutoffError, match="strip must be a torch.Tensor .*got NoneType"):
        cutoff.solve(None, b, linsys="direct")


def test_cutoff_decision_that_is_not_a_decision_is_named(system):
    strip, b = system
    with pytest.raises(CutoffError, match="decision='direct' must be a fitted Decision"):
        cutoff.solve(strip, b, signal=1.0, decision="direct")


def test_cutoff_good_calls_still_solve(system):
    strip, b = system
    from tunedb.cutoff import layout

    ref = torch.linalg.solve(layout.to_dense(strip), b.reshape(2, -1)).reshape(b.shape)
    assert torch.allclose(cutoff.solve(strip, b, linsys="direct"), ref, atol=1e-10)
    assert torch.allclose(cutoff.solve(strip, b, torch.zeros_like(b), linsys="iterative"), ref, atol=1e-8)
