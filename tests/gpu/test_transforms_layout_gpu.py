"""Session 26's fixes on CUDA, where the served arms are Triton kernels: functorch transforms
and forward-mode AD through a Triton-served GEMM Linear whose key already took the eager fast
path (the tangent was dropped there, and torch.func.grad raised), a Triton-served convolution's
output in F.conv's layout on a channels-last input and under Inductor, and the linalg ops' jvp
through a served kernel. Expected run time on the H200: about 40 s (Triton and Inductor compiles)."""
import copy

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from tunedb import database  # noqa: E402
from tunedb.families.gemm import FAMILY  # noqa: E402
from tunedb.families.gemm import ops  # noqa: E402
from tunedb.records import Entry, Region, Signature  # noqa: E402
from tunedb.runtime import launch_table, selector  # noqa: E402

pytestmark = pytest.mark.gpu

TRITON_CFG = "b64x64x64_w4_s3_g8"


def test_functorch_and_forward_ad_through_a_triton_served_linear(tiers_dirs):
    m, n, k = 64, 256, 128
    sig = Signature.parse(f"gemm|op=gemm_act|dt=fp16|N={n}|K={k}|act=gelu|bias=1")
    cfg = FAMILY.parse_config(TRITON_CFG)
    database.write_entries("user", "gemm", "sm90", [Entry(sig, (Region(128, cfg.id),))], [cfg])
    selector.reload()
    (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", 0)
    ops.gemm_act(x, w, b, "gelu")  # binds the key: the next eager call takes the fast path
    assert launch_table.launcher("gemm_act", x, w, b, "gelu", m).config.id == TRITON_CFG
    ref = lambda x, w, b: F.gelu(F.linear(x, w, b))  # noqa: E731
    t = torch.randn_like(x)
    got = torch.func.jvp(lambda x: ops.gemm_act(x, w, b, "gelu"), (x,), (t,))[1]
    want = torch.func.jvp(lambda x: ref(x, w, b), (x,), (t,))[1]
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        dual = ops.gemm_act(fwad.make_dual(x, t), w, b, "gelu")
        torch.testing.assert_close(fwad.unpack_dual(dual).tangent, want, rtol=2e-2, atol=2e-2)
    g = torch.func.grad(lambda w: ops.gemm_act(x, w, b, "gelu").float().sum())(w)
    g_ref = torch.func.grad(lambda w: ref(x, w, b).float().sum())(w)
    torch.testing.assert_close(g, g_ref, rtol=2e-2, atol=2e-1)
    v = torch.func.vmap(lambda r: ops.gemm_act(r, w, b, "gelu"))(x.view(4, 16, k))
    torch.testing.assert_close(v.view(m, n), ref(x, w, b), rtol=2e-2, atol=2e-2)


def _dw(family, sig, m):
    """A Triton arm for every conv: the direct depthwise tile for conv1d, an implicit GEMM else."""
    from tunedb.arch import shipped_profile

    cfg = family.parse_config("dw_t64_c64_w4" if sig.op == "conv1d" else "ig_b64x64x32_w4_s3")
    assert family.invalid_reason(cfg, sig, m, shipped_profile("sm90")) is None, (cfg.id, sig)
    return cfg, "test"


def test_a_triton_conv_keeps_f_convs_layout_and_compiles_with_inductor():
    from tunedb.families.conv import ops as conv_ops

    h = dict(device="cuda", dtype=torch.float16)
    w = torch.randn(16, 1, 5, **h)
    x = torch.randn(2, 16, 50, **h)
    with launch_table.overriding(_dw):
        y = conv_ops.conv1d(x, w, None, 1, 2, 1, 16, act="silu")
        torch.testing.assert_close(y, F.silu(F.conv1d(x, w, None, 1, 2, 1, 16)), rtol=2e-2, atol=2e-2)
        assert y.is_contiguous()
        model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU()).to(**h)
        import tunedb

        tuned = tunedb.optimize(copy.deepcopy(model), families="all")
        xc = torch.randn(2, 8, 16, 16, **h).to(memory_format=torch.channels_last)
        with torch.no_grad():
            want = model(xc)
            got = torch.compile(tuned)(xc)
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_linalg_jvp_through_a_served_kernel():
    from tunedb.families.linalg import ops as la

    a = torch.randn(512, 8, 8, device="cuda", dtype=torch.float64)
    spd = a @ a.mT / 8 + torch.eye(8, device="cuda", dtype=torch.float64)
    t = torch.randn_like(spd)
    t = t + t.mT
    got = torch.func.jvp(lambda A: la.potrf(A)[0], (spd,), (t,))[1]
    want = torch.func.jvp(lambda A: torch.linalg.cholesky_ex(A)[0], (spd,), (t,))[1]
    torch.testing.assert_close(got, want)
