"""The forward-only public ops (bmm, conv1d/conv2d, gemm_log_softmax) on inputs a model hands
them in training or at an empty batch: a wanted gradient is torch's own (without an Autograd
kernel torch warned "an autograd kernel was not registered ... silently incorrect behavior" on
backward, and a Triton-served call left its inputs without gradient), an empty batch returns
torch's empty result (it raised SignatureError), and torch.compile's fake kernel refuses a call
the op cannot run (it traced it)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from tunedb.errors import SignatureError
from tunedb.families.bmm import ops as bmm_ops
from tunedb.families.conv import ops as conv_ops
from tunedb.families.gemm_log_softmax import ops as glsm_ops


def _grads(fn, ref, *inputs):
    """Gradients of a weighted sum through fn and through ref (torch) on fresh copies."""
    out = []
    for f in (fn, ref):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        y = f(*leaves)
        (y.float() * torch.linspace(0.5, 2.0, y.numel()).view(y.shape)).sum().backward()
        out.append([t.grad for t in leaves])
    return out


CASES = {
    "bmm": (bmm_ops.bmm, torch.matmul, lambda: (torch.randn(3, 4, 5), torch.randn(3, 5, 6))),
    "conv1d": (lambda x, w, b: conv_ops.conv1d(x, w, b, 2, 1, 1, 2, act="silu"),
               lambda x, w, b: F.silu(F.conv1d(x, w, b, 2, 1, 1, 2)),
               lambda: (torch.randn(2, 4, 11), torch.randn(6, 2, 3), torch.randn(6))),
    "conv2d": (lambda x, w, b: conv_ops.conv2d(x, w, b, 1, (1, 0), (1, 2), 1, act="relu"),
               lambda x, w, b: torch.relu(F.conv2d(x, w, b, 1, (1, 0), (1, 2), 1)),
               lambda: (torch.randn(2, 3, 7, 9), torch.randn(4, 3, 3, 3), torch.randn(4))),
    "gemm_log_softmax": (glsm_ops.gemm_log_softmax,
                         lambda x, w, b: torch.log_softmax(F.linear(x, w, b), -1),
                         lambda: (torch.randn(2, 3, 16, dtype=torch.bfloat16), torch.randn(17, 16, dtype=torch.bfloat16),
                                  torch.randn(17, dtype=torch.bfloat16))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_wanted_gradient_is_torchs_without_the_fallback_warning(name):
    fn, ref, make = CASES[name]
    torch.manual_seed(0)
    inputs = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, want = _grads(fn, ref, *inputs)
    for g, w in zip(got, want):
        assert g is not None
        torch.testing.assert_close(g, w)


def test_without_a_wanted_gradient_nothing_is_recorded():
    a, b = torch.randn(2, 3, 4, requires_grad=True), torch.randn(2, 4, 5)
    with torch.no_grad():
        assert not bmm_ops.bmm(a, b).requires_grad


@pytest.mark.parametrize("a_shape, b_shape", [((0, 3, 5), (0, 5, 6)), ((2, 0, 5), (2, 5, 6)),
                                              ((2, 3, 0), (2, 0, 6)), ((3, 0), (0, 4))])
def test_an_empty_bmm_is_torchs_empty_result(a_shape, b_shape):
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    torch.testing.assert_close(bmm_ops.bmm(a, b), torch.matmul(a, b))


def test_an_empty_bmm_still_checks_its_shapes():
    with pytest.raises(SignatureError, match="do not match"):
        bmm_ops.bmm(torch.randn(0, 3, 5), torch.randn(0, 4, 6))


def test_an_empty_batch_of_gemm_log_softmax_is_empty():
    x, w = torch.randn(0, 7, 16, dtype=torch.bfloat16), torch.randn(33, 16, dtype=torch.bfloat16)
    y = glsm_ops.gemm_log_softmax(x, w)
    assert y.shape == (0, 7, 33) and y.dtype == torch.bfloat16
    with pytest.raises(SignatureError, match="K=16 but weight"):
        glsm_ops.gemm_log_softmax(x, torch.randn(33, 15, dtype=torch.bfloat16))


def test_the_gemm_log_softmax_fake_refuses_what_the_op_refuses():
    x = torch.empty(4, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(SignatureError, match="K=64 but weight"):
        glsm_ops.gemm_log_softmax(x, torch.empty(33, 60, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(SignatureError, match="bias has shape"):
        glsm_ops.gemm_log_softmax(x, torch.empty(33, 64, dtype=torch.bfloat16, device="meta"),
                                  torch.empty(32, dtype=torch.bfloat16, device="meta"))


def _gemm_cases():
    from tunedb.families.gemm import ops as gemm_ops

    return {
        "gemm": (gemm_ops.gemm, F.linear, lambda: (torch.randn(2, 3, 8), torch.randn(5, 8))),
        "gemm_act": (lambda x, w, b: gemm_ops.gemm_act(x, w, b, "gelu_tanh"),
                     lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
                     lambda: (torch.randn(4, 8), torch.randn(5, 8), torch.randn(5))),
    }


@pytest.mark.parametrize("name", sorted(CASES) + ["gemm", "gemm_act"])
def test_forward_mode_and_functorch_transforms_get_torchs_derivatives(name):
    """torch.func.jvp / forward_ad set no requires_grad: below autograd the tangent was dropped
    (a zero jvp); the GEMM ops' autograd.Function had no jvp and no functorch rule (torch.func.grad
    raised NotImplementedError)."""
    fn, ref, make = {**CASES, **_gemm_cases()}[name]
    torch.manual_seed(0)
    inputs = make()
    tangents = tuple(torch.randn_like(t) for t in inputs)
    got = torch.func.jvp(fn, inputs, tangents)[1]
    want = torch.func.jvp(ref, inputs, tangents)[1]
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want)
    g_got = torch.func.grad(lambda *xs: fn(*xs).float().sum(), argnums=tuple(range(len(inputs))))(*inputs)
    g_want = torch.func.grad(lambda *xs: ref(*xs).float().sum(), argnums=tuple(range(len(inputs))))(*inputs)
    for g, w in zip(g_got, g_want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("k,n", [(0, 3), (4, 0)])
def test_a_tuned_linear_with_an_empty_dimension_trains(k, n):
    """Linear(0, 3) and Linear(4, 0): backward's reshape(-1, 0) had no answer for -1."""
    import tunedb

    lin = torch.nn.Linear(k, n)
    model = tunedb.optimize(torch.nn.Sequential(lin))
    x = torch.randn(2, k, requires_grad=True)
    model(x).sum().backward()
    assert x.grad.shape == (2, k) and lin.weight.grad.shape == (n, k)
