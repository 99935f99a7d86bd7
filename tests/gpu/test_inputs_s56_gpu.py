"""Session 56's input fixes on the GPU, where the served arms are the kernels rather than torch's
forms: an empty batch's Cholesky factor row-major; vmap with a second operand whose batch shape
differs from A's named as an eager call names it, and a matching vmap solving through the tuned
arm; an fp8 x of one token a row ([B, 1, K]) taking its [B, 1] block scale as the 2-D call does;
a Linear carrying its own `act` attribute left as written. Expected run time: about 20 s."""
import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _spd(*batch, n=8, dtype=torch.float32):
    g = torch.randn(*batch, n, n, device="cuda", dtype=dtype)
    return g @ g.mT + n * torch.eye(n, device="cuda", dtype=dtype)


@pytest.mark.parametrize("shape", [(0, 8, 8), (0, 64, 64), (3, 0, 32, 32)])
def test_an_empty_batch_gets_a_row_major_factor(shape):
    from tunedb.families.linalg import ops as la

    a = torch.eye(shape[-1], device="cuda").expand(*shape)
    low, info = la.potrf(a)
    assert low.is_cuda and low.shape == shape and low.stride() == torch.empty(shape).stride()
    assert info.shape == shape[:-2]


def test_vmap_names_a_mismatch_and_solves_a_match():
    from tunedb.errors import SignatureError
    from tunedb.families.linalg import ops as la

    torch.manual_seed(0)
    a = _spd(6, 64)
    with pytest.raises(SignatureError, match=r"batch shape \[\] \(shape \[8\]\) differs from the first's \[64\]"):
        torch.vmap(la.posv, in_dims=(0, None))(a, torch.ones(8, device="cuda"))
    b = torch.randn(6, 64, 8, device="cuda")
    x, info = torch.vmap(la.posv)(a, b)
    ref = torch.linalg.solve(a.double(), b.double())
    assert not info.any() and torch.allclose(x.double(), ref, rtol=1e-3, atol=1e-4)


def test_fp8_one_token_rows_take_their_flat_block_scale():
    from tunedb.families.scaled_mm import ops as S

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm89 or later")
    torch.manual_seed(0)
    f8 = torch.float8_e4m3fn
    for b, n, k in ((4, 256, 128), (16, 512, 64)):
        x = torch.randn(b, 1, k, device="cuda").to(f8)
        w = torch.randn(n, k, device="cuda").to(f8)
        sx = torch.rand(b, 1, device="cuda") + 0.5
        sw = torch.rand((n + 127) // 128, 1, device="cuda") + 0.5
        flat = S.scaled_mm_fp8(x.view(b, k), w, sx, sw, "block")
        got = S.scaled_mm_fp8(x, w, sx, sw, "block")
        assert got.shape == (b, 1, n) and torch.equal(got.view(b, n), flat)
        ref = (x.view(b, k).float() * sx) @ (w.float() * sw.repeat_interleave(128, 0)[:n]).T
        assert torch.allclose(flat.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_a_linear_with_its_own_act_attribute_runs_as_written():
    import tunedb

    lin = torch.nn.Linear(4096, 4096, device="cuda", dtype=torch.bfloat16)
    lin.act = "tag"
    model = tunedb.optimize(torch.nn.Sequential(lin, torch.nn.SiLU()), inplace=False)
    assert type(model[0]) is torch.nn.Linear and model[0].act == "tag"
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(model(x), torch.nn.functional.silu(lin(x)))
