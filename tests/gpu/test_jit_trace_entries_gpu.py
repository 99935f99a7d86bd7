"""torch.jit.trace of the eager entry points on the GPU (session 52's probe): a trace records only
dispatched ops, so an entry that ran its Triton or CUDA kernel directly (grad_form.direct, the GEMM
fast path) would leave its output in the trace as a constant, and the traced function would
return the traced inputs' result for every new input. Traced under no_grad, each entry must go
through torch.ops.tunedb and give the new inputs' result."""
import pytest

torch = pytest.importorskip("torch")

from test_direct_entries_gpu import _cases, _flat, _reference  # noqa: E402

from tunedb.families.gemm import ops as gemm_ops  # noqa: E402

pytestmark = pytest.mark.gpu


def _fresh(args):
    """Inputs of the same shapes, dtypes and scale with other values (SPD stays SPD: a scaled copy;
    gemm_log_softmax's weight keeps its /16, or bf16 logits of 60 round past the tolerance)."""
    return tuple(a * 1.5 if a.dim() == 3 and a.shape[-1] == a.shape[-2]
                 else torch.randn_like(a) * a.float().std().to(a.dtype) for a in args)


@pytest.mark.parametrize("name", ["potrf", "posv", "gemv", "bmm", "conv2d", "gemm_log_softmax"])
def test_a_traced_entry_point_computes_for_new_inputs(name):
    entry, _op, args = _cases()[name]
    with torch.no_grad():
        traced = torch.jit.trace(lambda *a: _flat(entry(*a))[0], args, check_trace=False)
        assert "tunedb::" in str(traced.graph), traced.graph
        other = _fresh(args)
        got = traced(*other)
        ref = _reference(name, other)[0]
        tol = 1e-3 if ref.dtype == torch.float64 else 3e-2
        assert torch.allclose(got.to(ref.dtype), ref, rtol=tol, atol=tol), name


@pytest.mark.parametrize("act", ["none", "gelu"])
def test_a_traced_gemm_entry_computes_for_new_inputs_in_both_grad_modes(act):
    torch.manual_seed(0)
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) / 16
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)

    def fn(x):
        return gemm_ops.gemm(x, w) if act == "none" else gemm_ops.gemm_act(x, w, b, act)

    for _ in range(3):
        fn(x)  # the eager fast path has this key memoised before the trace
    with torch.no_grad():
        traced = torch.jit.trace(fn, (x,))  # its own check re-runs under no_grad
    x2 = torch.randn_like(x)
    ref = x2.float() @ w.float().T
    if act != "none":
        ref = torch.nn.functional.gelu(ref + b.float())
    assert torch.allclose(traced(x2).float(), ref, rtol=3e-2, atol=3e-2)
