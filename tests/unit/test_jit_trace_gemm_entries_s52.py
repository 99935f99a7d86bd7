"""torch.jit.trace of a module calling the GEMM entry points (gemm, gemm_act) with Parameters that
want gradients: the trace's own check re-runs it under no_grad, and the entry points recorded
tunedb::gemm_act with grad on and F.linear's aten ops without (TracingCheckError). Traced, every
call goes through torch.ops.tunedb, in both grad modes."""
import pytest
import torch

from tunedb.families.gemm.ops import gemm, gemm_act


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(10, 16))
        self.b = torch.nn.Parameter(torch.randn(10))

    def forward(self, x):
        return gemm_act(x, self.w, self.b, "gelu") + gemm(x, self.w)


@pytest.mark.parametrize("grad", [True, False])
def test_the_trace_records_the_tuned_ops_and_computes_for_new_inputs(grad):
    torch.manual_seed(0)
    m = Head()
    with torch.set_grad_enabled(grad):
        traced = torch.jit.trace(m, (torch.randn(4, 16),))  # check_trace on: both grad modes agree
    graph = str(traced.graph)
    assert "tunedb::gemm_act" in graph and "tunedb::gemm" in graph and "aten::linear" not in graph
    x = torch.randn(5, 16)
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x, m.w, m.b)) + x @ m.w.T
    assert torch.allclose(traced(x), want, atol=1e-5)


@pytest.mark.parametrize("op, shapes", [("linalg_gemm", [(4, 8, 8), (4, 8, 8)]), ("linalg_dot", [(4, 8), (4, 8)]),
                                        ("linalg_gemm", [(2, 2, 3, 8, 8), (2, 2, 3, 8, 8)])])
def test_a_strict_linalg_op_under_vmap_names_the_samples_shape(op, shapes):
    # folded first, the refusal named a shape the caller never passed ((32, 8) for [8, 8] samples)
    from tunedb.errors import SignatureError
    from tunedb.families.linalg import ops  # noqa: F401 - defines torch.ops.tunedb.linalg_*

    args = [torch.randn(*s) for s in shapes]
    sample = list(shapes[0][1:])
    with pytest.raises(SignatureError, match=f"got a sample of shape {sample}".replace("[", r"\[").replace("]", r"\]")):
        torch.vmap(getattr(torch.ops.tunedb, op))(*args)
