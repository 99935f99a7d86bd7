"""requires_grad inputs to the linalg ops: the gradient is torch's own on every device. A served
arm (a Triton kernel) has no backward; it is simulated here by a family launch whose results
carry no autograd history, as a kernel's do. Without the ops' Autograd kernel, backward warned
and left the inputs without gradient (silently, on CUDA)."""
from __future__ import annotations

import warnings

import pytest
import torch

from tunedb.families import linalg
from tunedb.families.linalg import ops as la
from tunedb.families.linalg import problems


@pytest.fixture
def kernel_like_launch(monkeypatch):
    """The family's launch with its results detached (a Triton kernel's have no history)."""
    real = linalg.FAMILY.launch
    calls = []

    def detached(config, sig, *args, **kwargs):
        calls.append(sig.op)
        with torch.no_grad():
            out = real(config, sig, *args, **kwargs)
        return tuple(t.detach() for t in out) if isinstance(out, tuple) else out.detach()

    monkeypatch.setattr(linalg.FAMILY, "launch", detached)
    return calls


def _inputs(op: str, n: int = 5, batch: int = 3):
    g = torch.Generator().manual_seed(n)
    a = torch.randn(batch, n, n, generator=g, dtype=torch.float64)
    spd = a @ a.mT / n + torch.eye(n, dtype=torch.float64)
    vec = torch.randn(batch, n, generator=g, dtype=torch.float64)
    return {"dot": (vec, vec.flip(0)), "gemv": (a, vec), "gemm": (a, a.mT), "potrf": (spd,),
            "trsv": (torch.linalg.cholesky(spd), vec), "posv": (spd, vec)}[op]


@pytest.mark.parametrize("op", ["dot", "gemv", "gemm", "potrf", "trsv", "posv"])
def test_the_gradient_is_torchs_even_where_a_kernel_serves(op, kernel_like_launch):
    base = _inputs(op)
    mine = [t.clone().requires_grad_() for t in base]
    ref = [t.clone().requires_grad_() for t in base]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "autograd kernel was not registered" warning
        out = getattr(la, op)(*mine)
        want = problems.torch_arm(op, *ref)
        first, first_ref = (out[0], want[0]) if isinstance(out, tuple) else (out, want)
        torch.testing.assert_close(first, first_ref)
        (first * torch.linspace(0.5, 2.0, first.numel(), dtype=first.dtype).view(first.shape)).sum().backward()
        (first_ref * torch.linspace(0.5, 2.0, first.numel(), dtype=first.dtype).view(first.shape)).sum().backward()
    for got, exp in zip(mine, ref):
        assert got.grad is not None, f"{op}: no gradient reached the input"
        torch.testing.assert_close(got.grad, exp.grad)


@pytest.mark.parametrize("op", ["dot", "gemv", "gemm", "potrf", "trsv", "posv"])
def test_forward_mode_tangents_are_torchs(op, kernel_like_launch):
    """torch.func.jvp and forward_ad's dual tensors set no requires_grad: below autograd the
    served arm dropped their tangent silently (a zero jvp, a zero jacfwd)."""
    base = _inputs(op)
    g = torch.Generator().manual_seed(7)
    tangents = tuple(torch.randn(t.shape, generator=g, dtype=t.dtype) for t in base)
    if op in ("potrf", "posv"):  # stay on the symmetric matrices the op reads
        tangents = (tangents[0] + tangents[0].mT,) + tangents[1:]

    def first(fn):
        return lambda *xs: (lambda out: out[0] if isinstance(out, tuple) else out)(fn(*xs))

    _, mine = torch.func.jvp(first(getattr(la, op)), base, tangents)
    _, want = torch.func.jvp(first(lambda *xs: problems.torch_arm(op, *xs)), base, tangents)
    assert mine.abs().max() > 0
    torch.testing.assert_close(mine, want)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        out = first(getattr(la, op))(*(fwad.make_dual(t, d) for t, d in zip(base, tangents)))
        torch.testing.assert_close(fwad.unpack_dual(out).tangent, want)


def test_without_a_wanted_gradient_the_served_arm_runs(kernel_like_launch):
    a, b = (t.clone().requires_grad_() for t in _inputs("posv"))
    with torch.no_grad():
        x, info = la.posv(a, b)
    assert kernel_like_launch == ["posv"] and not x.requires_grad
    x, info = la.posv(*(t.detach() for t in (a, b)))
    assert kernel_like_launch == ["posv", "posv"]
    torch.testing.assert_close(x, torch.linalg.solve(a.detach(), b.detach()))


def test_bad_inputs_raise_the_same_error_with_a_gradient():
    from tunedb.errors import SignatureError

    a = torch.randn(2, 4, 4, requires_grad=True)
    with pytest.raises(SignatureError, match=r"posv's b must have shape \[batch, n\] = \[2, 4\]"):
        la.posv(a, torch.randn(2, 5))
