"""The linalg and bmm entry points take torch.linalg's shapes: any leading batch dimensions (none for one
problem), restored on the results; an n past the family's 2..128 (or 1) runs torch's forms
instead of raising; operands whose batch shapes differ are refused by name. CPU (the library
arm); tests/gpu/test_linalg_eager_gpu.py checks the same shapes on the tuned CUDA arms."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.errors import SignatureError  # noqa: E402
from tunedb.families.linalg import ops  # noqa: E402


def _spd(*shape):
    n = shape[-1]
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    return g @ g.mT + n * torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 1, 2)], ids=lambda s: f"lead{list(s)}")
@pytest.mark.parametrize("n", [1, 5, 130])
def test_potrf_and_posv_keep_the_batch_shape(lead, n):
    a = _spd(*lead, n, n)
    b = torch.randn(*lead, n, dtype=torch.float64)
    low, info = ops.potrf(a)
    assert low.shape == a.shape and info.shape == lead and info.dtype == torch.int32
    assert low.is_contiguous()  # row-major, as every arm returns it
    torch.testing.assert_close(low, torch.linalg.cholesky(a))
    x, info = ops.posv(a, b)
    assert x.shape == b.shape and info.shape == lead
    torch.testing.assert_close(x, torch.linalg.solve(a, b))


@pytest.mark.parametrize("n", [4, 129])
def test_trsv_gemv_gemm_dot_keep_the_batch_shape(n):
    a = _spd(2, 3, n, n)
    low = torch.linalg.cholesky(a)
    b = torch.randn(2, 3, n, dtype=torch.float64)
    torch.testing.assert_close(ops.trsv(low, b), torch.linalg.solve_triangular(low, b.unsqueeze(-1), upper=False).squeeze(-1))
    torch.testing.assert_close(ops.gemv(a, b), (a @ b.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(ops.gemm(a, a), a @ a)
    torch.testing.assert_close(ops.dot(b, b), (b * b).sum(-1))
    one = ops.dot(b[0, 0], b[0, 0])  # one problem: two vectors give a 0-d result
    assert one.shape == () and torch.allclose(one, b[0, 0] @ b[0, 0])


def test_a_non_spd_problem_is_reported_in_info_at_its_batch_index():
    a = _spd(2, 3, 4, 4)
    a[1, 2, 2, 2] = -100.0
    _, info = ops.potrf(a)
    assert info.tolist() == [[0, 0, 0], [0, 0, 3]]


def test_empty_batches_and_empty_problems():
    assert ops.potrf(torch.empty(0, 3, 5, 5, dtype=torch.float64))[0].shape == (0, 3, 5, 5)
    low, info = ops.potrf(torch.empty(3, 0, 0, dtype=torch.float64))
    assert low.shape == (3, 0, 0) and info.tolist() == [0, 0, 0]


@pytest.mark.parametrize("b_shape", [(3, 5, 6), (6,), (4, 3, 6)])
def test_batch_shapes_must_match(b_shape):
    a = _spd(3, 4, 6, 6)
    with pytest.raises(SignatureError, match=r"batch shape .* differs from the first's \[3, 4\]"):
        ops.posv(a, torch.randn(*b_shape, dtype=torch.float64))


def test_bad_inputs_are_still_named():
    a = _spd(2, 3, 5, 5)
    with pytest.raises(SignatureError, match="b must be a tensor"):
        ops.posv(a, None)
    with pytest.raises(SignatureError, match="share one dtype"):
        ops.posv(a, torch.randn(2, 3, 5))
    with pytest.raises(SignatureError, match="does not take dtype 'fp16'"):
        ops.potrf(a.half())


def test_gradients_flow_through_the_reshape_and_the_torch_forms():
    for shape in ((2, 3, 5, 5), (2, 130, 130)):
        a = _spd(*shape).requires_grad_()
        low, _ = ops.potrf(a)
        low.sum().backward()
        ref = a.detach().clone().requires_grad_()
        torch.linalg.cholesky(ref).sum().backward()
        torch.testing.assert_close(a.grad, ref.grad)


def test_compiled_calls_take_any_batch_shape():
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: ops.posv(a, b)[0] * 2.0, backend="eager", fullgraph=True)
    for shape in ((2, 3, 5, 5), (6, 6), (2, 140, 140)):
        a = _spd(*shape)
        b = torch.randn(*shape[:-1], dtype=torch.float64)
        torch.testing.assert_close(f(a, b), torch.linalg.solve(a, b) * 2.0)
    torch._dynamo.reset()


def test_bmm_takes_equal_leading_dimensions():
    from tunedb.families.bmm import ops as bmm_ops

    q, k = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5)
    torch.testing.assert_close(bmm_ops.bmm(q, k.transpose(-1, -2)), q @ k.transpose(-1, -2))
    assert bmm_ops.bmm(torch.randn(2, 3, 0, 5), torch.randn(2, 3, 5, 6)).shape == (2, 3, 0, 6)
    with pytest.raises(SignatureError, match=r"equal leading dimensions\); got a \[2, 3, 4, 5\], b \[2, 4, 5, 6\]"):
        bmm_ops.bmm(q, torch.randn(2, 4, 5, 6))
    x = q.clone().requires_grad_()
    bmm_ops.bmm(x, k.transpose(-1, -2)).sum().backward()
    torch.testing.assert_close(x.grad, k.sum(-2, keepdim=True).expand_as(q))


def test_vmap_runs_one_call_over_the_vmapped_problems(recwarn):
    # a vmap rule per op: the vmapped dimension joins the op's batch (torch's fallback would loop
    # over the slices and warn "There is a performance drop")
    a = _spd(6, 4, 5, 5)
    b = torch.randn(6, 4, 5, dtype=torch.float64)
    x = torch.vmap(lambda m, v: ops.posv(m, v)[0])(a, b)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))
    shared = torch.vmap(lambda m, v: ops.posv(m, v)[0], in_dims=(None, 0))(a[0], b)
    torch.testing.assert_close(shared, torch.linalg.solve(a[0].expand(6, 4, 5, 5), b))
    low, info = torch.vmap(ops.potrf)(a[:, 0])  # one problem per vmapped slice (2-D)
    torch.testing.assert_close(low, torch.linalg.cholesky(a[:, 0]))
    assert info.shape == (6,)
    torch.testing.assert_close(torch.vmap(ops.dot, in_dims=(1, 1))(b, b), (b * b).sum(-1).T)
    torch.testing.assert_close(torch.vmap(torch.vmap(ops.gemv))(a, b), (a @ b.unsqueeze(-1)).squeeze(-1))
    grads = torch.vmap(torch.func.grad(lambda m: ops.potrf(m)[0].sum()))(a[:, 0])
    torch.testing.assert_close(grads, torch.vmap(torch.func.grad(lambda m: torch.linalg.cholesky(m).sum()))(a[:, 0]))
    assert not [w for w in recwarn if "performance drop" in str(w.message)]


def test_bmm_under_vmap_and_in_dtypes_it_has_no_kernel_for(recwarn):
    from tunedb.families.bmm import ops as bmm_ops

    a, b = torch.randn(6, 4, 5, 7), torch.randn(6, 4, 7, 3)
    torch.testing.assert_close(torch.vmap(bmm_ops.bmm)(a, b), a @ b)
    torch.testing.assert_close(torch.vmap(bmm_ops.bmm, in_dims=(0, None))(a, b[0]), a @ b[0])
    assert not [w for w in recwarn if "performance drop" in str(w.message)]
    torch.testing.assert_close(bmm_ops.bmm(a.double(), b.double()), a.double() @ b.double())  # torch's product
    ints = bmm_ops.bmm(torch.ones(2, 3, 4, dtype=torch.int64), torch.ones(2, 4, 5, dtype=torch.int64))
    assert ints.dtype == torch.int64 and int(ints[0, 0, 0]) == 4


def test_gemm_log_softmax_computes_torchs_form_for_fp32_and_fp64():
    from tunedb.families.gemm_log_softmax import ops as glsm_ops

    for dtype in (torch.float32, torch.float64):
        x, w, b = torch.randn(2, 3, 8, dtype=dtype), torch.randn(10, 8, dtype=dtype), torch.randn(10, dtype=dtype)
        got = glsm_ops.gemm_log_softmax(x, w, b)
        assert got.dtype == dtype
        torch.testing.assert_close(got, torch.log_softmax(x @ w.T + b, -1))
    with pytest.raises(SignatureError, match="they must match"):  # a dtype mix is still named
        glsm_ops.gemm_log_softmax(torch.randn(3, 8), torch.randn(10, 8).bfloat16())


@pytest.mark.parametrize("n", [1, 129, 300])
def test_recommend_names_torchs_forms_for_an_n_past_the_family(n):
    import tunedb

    plan = tunedb.recommend("posv", "fp32", n, 100)
    assert (plan.arm, plan.packing, plan.source) == ("torch", "library", "fallback")
    assert "outside the family's 2..128" in plan.reason
    with pytest.raises(SignatureError, match="does not take dtype 'fp16'"):  # the other arguments are still checked
        tunedb.recommend("posv", "fp16", n, 100)
