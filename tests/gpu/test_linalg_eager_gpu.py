"""The small linear-algebra ops' eager shortcuts on the GPU (families/linalg/ops.py `_fast`):
the CUDA tier's and the Triton arms' prepared launches (cuda_launcher, triton_launcher) give the
general path's result bit for bit, against an fp64 reference; a CUDA graph captured after them
replays the same kernel; a strided input takes the general path; a Triton gemv at a small batch
serves torch.bmm eagerly and itself under capture (eager.py). Shipped sm90 table
(TUNEDB_USER_DB=off). About 30 s on the H200 (NVRTC and Triton compiles)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.families.linalg import ops  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def shipped(monkeypatch):
    monkeypatch.setenv("TUNEDB_USER_DB", "off")
    from tunedb.runtime import selector

    selector.reload()
    yield
    selector.reload()


def _spd(batch, n, dtype):
    g = torch.randn(batch, n, n, device="cuda", dtype=torch.float64)
    return (g @ g.mT + n * torch.eye(n, device="cuda", dtype=torch.float64)).to(dtype)


def _args(op, n, batch, dtype):
    if op == "gemv":
        return (torch.randn(batch, n, n, device="cuda", dtype=dtype), torch.randn(batch, n, device="cuda", dtype=dtype))
    a = _spd(batch, n, dtype)
    b = torch.randn(batch, n, device="cuda", dtype=dtype)
    if op == "trsv":
        return (torch.linalg.cholesky(a).contiguous(), b)
    return (a,) if op == "potrf" else (a, b)


def _ref(op, args):
    a = args[0].double()
    if op == "potrf":
        return torch.linalg.cholesky(a)
    if op == "trsv":
        return torch.linalg.solve_triangular(a, args[1].double().unsqueeze(-1), upper=False).squeeze(-1)
    if op == "gemv":
        return (a @ args[1].double().unsqueeze(-1)).squeeze(-1)
    return torch.linalg.solve(a, args[1].double())


def _flat(x):
    return x if isinstance(x, tuple) else (x,)


def _key(op, args):
    second = args[1] if len(args) > 1 else args[0]
    return (op, args[0].dtype, args[0].shape, second.dtype, second.shape)


CELLS = [("potrf", 8, 4096, torch.float32), ("potrf", 8, 512, torch.float64), ("posv", 32, 4096, torch.float32),
         ("posv", 16, 16, torch.float32), ("trsv", 8, 4096, torch.float32), ("potrf", 64, 512, torch.float32),
         ("posv", 128, 64, torch.float64), ("trsv", 64, 256, torch.float32),
         # Triton arms (triton_launcher): reg and lane posv, a warp gemv past the eager rule's batch
         ("posv", 8, 4096, torch.float32), ("posv", 8, 16, torch.float32), ("gemv", 32, 65536, torch.float32)]


@pytest.mark.parametrize("op,n,batch,dtype", CELLS)
def test_the_prepared_launch_gives_the_general_paths_result(op, n, batch, dtype):
    torch.manual_seed(0)
    args = _args(op, n, batch, dtype)
    with torch.no_grad():
        first = _flat(getattr(ops, op)(*args))  # the general path; the key's shortcut is made after it
        bound, fast = ops._fast[_key(op, args)]
        assert not bound.config.is_sentinel and bound.eager is None, bound
        assert fast is not None, f"no prepared launch for {bound}"
        got = _flat(getattr(ops, op)(*args))
        general = _flat(bound.call(*args))
        for g, e, f in zip(got, general, first):
            assert torch.equal(g, e) and torch.equal(g, f), op
        tol = 1e-9 if dtype == torch.float64 else 2e-3
        ref = _ref(op, args)
        assert torch.allclose(got[0].double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
        if op in ("potrf", "posv"):
            assert int(got[1].abs().sum()) == 0
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            captured = _flat(getattr(ops, op)(*args))
        g.replay()
        torch.cuda.synchronize()
        for c, e in zip(captured, got):
            assert torch.equal(c, e), op


def test_a_non_spd_problem_is_reported_by_the_prepared_launch_as_by_the_general_path():
    args = _args("potrf", 8, 4096, torch.float32)
    args[0][7, 3, 3] = -50.0
    with torch.no_grad():
        ops.potrf(*args)
        low, info = ops.potrf(*args)
        bound, fast = ops._fast[_key("potrf", args)]
        assert fast is not None
        want_low, want_info = bound.call(*args)
    assert torch.equal(info, want_info) and int(info[7]) == 4 and int(info.abs().sum()) == 4
    assert torch.equal(low[:7], want_low[:7])


def test_a_strided_input_takes_the_general_path():
    torch.manual_seed(1)
    a = _spd(4096, 8, torch.float32)
    at = a.mT.contiguous().mT  # the same values, column-major
    with torch.no_grad():
        ops.potrf(a)
        ops.potrf(a)
        low, info = ops.potrf(at)
    assert not at.is_contiguous()
    assert torch.allclose(low.double(), torch.linalg.cholesky(a.double()), atol=1e-3)


def test_a_small_triton_gemv_serves_torch_eagerly_and_itself_in_a_graph():
    torch.manual_seed(2)
    a, x = torch.randn(4096, 8, 8, device="cuda"), torch.randn(4096, 8, device="cuda")
    with torch.no_grad():
        ops.gemv(a, x)
        bound, _fast = ops._fast[_key("gemv", (a, x))]
        assert not bound.config.is_sentinel and bound.eager == "torch", bound
        eager = ops.gemv(a, x)
        assert torch.equal(eager, torch.bmm(a, x.unsqueeze(2)).squeeze(2))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            captured = ops.gemv(a, x)
        g.replay()
        torch.cuda.synchronize()
    ref = (a.double() @ x.double().unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(captured.double(), ref, atol=1e-4)


@pytest.mark.parametrize("op", ["potrf", "posv", "trsv", "gemv"])
def test_any_batch_shape_runs_the_tuned_arm_and_keeps_the_shape(op):
    # torch.linalg's shapes on the entry points: [2, 64, n, n] is the table's batch 128, a 2-D A
    # is one problem; the results come back in the input's batch shape, against fp64
    n = 8
    flat = _args(op, n, 128, torch.float32)
    args = tuple(t.reshape(2, 64, *t.shape[1:]) for t in flat)
    out = _flat(ops.__dict__[op](*args))
    ref = _ref(op, flat)
    assert out[0].shape == (args[0].shape if op == "potrf" else args[1].shape)
    torch.testing.assert_close(out[0].reshape(ref.shape).double(), ref, rtol=1e-4, atol=1e-4)
    if op in ("potrf", "posv"):
        assert out[1].shape == (2, 64) and int(out[1].abs().sum()) == 0
    assert _key(op, flat) in ops._bound  # the flattened key resolved through the table
    one = _flat(ops.__dict__[op](*(t[0, 0] for t in args)))
    torch.testing.assert_close(one[0].double(), ref[0], rtol=1e-4, atol=1e-4)


def test_an_n_past_the_family_runs_torchs_forms_on_the_gpu_and_in_a_graph():
    a, b = _spd(16, 160, torch.float64), torch.randn(16, 160, device="cuda", dtype=torch.float64)
    x, info = ops.posv(a, b)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))
    assert info.shape == (16,) and int(info.abs().sum()) == 0
    from tunedb.measure.cudagraph import capture

    kept: list = []
    g = capture(lambda: ops.posv(a, b), warmup=1, keep=kept)
    b.copy_(torch.randn_like(b))
    g.replay()
    torch.testing.assert_close(kept[0][0], torch.linalg.solve(a, b))


def test_vmap_is_one_call_of_the_tuned_arm_bitwise():
    # torch.vmap over [4, 32, 8, 8]: the vmap rule makes it the op's batch of 128, which the table
    # serves as the flattened call does: the same kernel, the same bits
    flat = _args("posv", 8, 128, torch.float32)
    a, b = flat[0].reshape(4, 32, 8, 8), flat[1].reshape(4, 32, 8)
    x = torch.vmap(lambda m, v: ops.posv(m, v)[0])(a, b)
    want, _ = ops.posv(*flat)
    assert torch.equal(x.reshape(128, 8), want)
    torch.testing.assert_close(x.reshape(128, 8).double(), _ref("posv", flat), rtol=1e-4, atol=1e-4)
