"""torch.fx.symbolic_trace of code calling tunedb's public functions (la.*, bmm, conv1d/conv2d,
gemm/gemm_act, gemm_log_softmax): each call becomes one node whose target is the public function,
and the GraphModule gives what the code gives (session 53: each raised an FX TraceError or named
the Proxy as a bad argument)."""
from __future__ import annotations

import pickle

import pytest
import torch
from torch import fx

import tunedb.families.bmm.ops as bo
import tunedb.families.conv.ops as co
import tunedb.families.gemm.ops as go
import tunedb.families.gemm_log_softmax.ops as glo
import tunedb.families.linalg.ops as la


def _spd(batch: int, n: int) -> torch.Tensor:
    a = torch.randn(batch, n, n, dtype=torch.float64)
    return a @ a.mT + n * torch.eye(n, dtype=torch.float64)


torch.manual_seed(0)
A = _spd(4, 5)
CASES = {
    "potrf": (lambda a: la.potrf(a)[0], (A,), la.potrf),
    "posv": (lambda a, b: la.posv(a, b)[0], (A, torch.randn(4, 5, dtype=torch.float64)), la.posv),
    "posv, a batched-shape b": (lambda a, b: la.posv(a, b)[0], (A.reshape(2, 2, 5, 5), torch.randn(2, 2, 5, dtype=torch.float64)), la.posv),
    "dot": (lambda x, y: la.dot(x, y), (torch.randn(4, 5), torch.randn(4, 5)), la.dot),
    "gemv": (lambda a, x: la.gemv(a, x), (A, torch.randn(4, 5, dtype=torch.float64)), la.gemv),
    "la.gemm": (lambda a, b: la.gemm(a, b), (A, A), la.gemm),
    "trsv": (lambda low, b: la.trsv(low, b), (torch.linalg.cholesky(A), torch.randn(4, 5, dtype=torch.float64)), la.trsv),
    "bmm": (lambda a, b: bo.bmm(a, b), (torch.randn(2, 3, 4), torch.randn(2, 4, 5)), bo.bmm),
    "bmm 4-D": (lambda a, b: bo.bmm(a, b), (torch.randn(2, 2, 3, 4), torch.randn(2, 2, 4, 5)), bo.bmm),
    "conv1d": (lambda x, w: co.conv1d(x, w, padding=1), (torch.randn(2, 3, 10), torch.randn(4, 3, 3)), co.conv1d),
    "conv2d": (lambda x, w: co.conv2d(x, w, stride=2), (torch.randn(2, 3, 10, 10), torch.randn(4, 3, 3, 3)), co.conv2d),
    "gemm": (lambda x, w: go.gemm(x, w), (torch.randn(3, 8), torch.randn(5, 8)), go.gemm),
    "gemm_act": (lambda x, w, b: go.gemm_act(x, w, b, "relu"), (torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)), go.gemm_act),
    "gemm_log_softmax": (lambda x, w: glo.gemm_log_softmax(x, w), (torch.randn(3, 8), torch.randn(5, 8)), glo.gemm_log_softmax),
}


@pytest.mark.parametrize("name", list(CASES))
def test_symbolic_trace_records_the_public_function_as_one_node(name):
    fn, args, public = CASES[name]
    graph = fx.symbolic_trace(fn)
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert calls[0] is public and all(c.__name__ == "getitem" for c in calls[1:]), calls
    torch.testing.assert_close(graph(*args), fn(*args), rtol=0, atol=0)
    again = pickle.loads(pickle.dumps(graph))  # the target by its qualified name
    torch.testing.assert_close(again(*args), fn(*args), rtol=0, atol=0)


def test_a_module_calling_the_ops_traces_and_a_constant_operand_stays_an_input():
    class Solver(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("a", A)

        def forward(self, b):  # the first operand a buffer (a get_attr), the second the Proxy
            x, info = la.posv(self.a, b)
            return x * 2, info

    b = torch.randn(4, 5, dtype=torch.float64)
    m = Solver()
    graph = fx.symbolic_trace(m)
    (x, info), (want_x, want_info) = graph(b), m(b)
    torch.testing.assert_close(x, want_x, rtol=0, atol=0)
    assert torch.equal(info, want_info)
    torch.testing.assert_close(x / 2, torch.linalg.solve(A, b.unsqueeze(-1)).squeeze(-1))


@pytest.mark.parametrize("op", ["gemv", "posv", "trsv"])
def test_a_constant_first_operand_of_torch_linalgs_shapes_traces(op):
    # the first operand a closure constant (2-D: one problem, the any-shape path), the second traced
    low = torch.linalg.cholesky(A[0])
    a = low if op == "trsv" else A[0]
    fn = {"gemv": lambda x: la.gemv(a, x), "posv": lambda x: la.posv(a, x)[0], "trsv": lambda x: la.trsv(a, x)}[op]
    x = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(fx.symbolic_trace(fn)(x), fn(x), rtol=0, atol=0)


def test_a_non_tensor_outside_a_trace_is_still_named():
    from tunedb.errors import SignatureError

    with pytest.raises(SignatureError, match="gemm's x must be a tensor, got list"):
        go.gemm([[1.0]], torch.randn(2, 1))
    with pytest.raises(SignatureError, match="conv1d's x must be a tensor, got int"):
        co.conv1d(3, torch.randn(4, 3, 3))
