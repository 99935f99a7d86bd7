"""A tuned GEMM's gradient is itself differentiable (create_graph: gradient penalties, Hessian-vector
products), for every fused activation: aten's silu_backward has no derivative, so a double
backward through a SiLU-fused op failed where F.silu(F.linear(...)) works."""
import pytest
import torch

from tunedb.families.gemm import ops


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu"])
def test_gradgradcheck_of_gemm_act(act):
    torch.manual_seed(0)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x, w, b: ops.gemm_act(x, w, b, act), (x, w, b))


def test_a_gradient_penalty_through_a_silu_layer_matches_torch():
    torch.manual_seed(0)
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    got_gx, = torch.autograd.grad(ops.gemm_act(x, w, None, "silu").sum(), x, create_graph=True)
    got, = torch.autograd.grad(got_gx.square().sum(), w)
    ref_gx, = torch.autograd.grad(torch.nn.functional.silu(x @ w.t()).sum(), x, create_graph=True)
    ref, = torch.autograd.grad(ref_gx.square().sum(), w)
    torch.testing.assert_close(got, ref)

