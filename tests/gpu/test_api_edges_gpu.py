"""The public ops on CUDA at the inputs the CPU suite can only simulate: a wanted gradient
through a Triton-served call is torch's (runtime.grad_form), an empty batch returns an empty
result without a launch, tensors on two devices are a SignatureError before any kernel (not a
Triton pointer error that demotes the key to torch), and scaled_mm's leading-dim scales.
Triton arms are forced by an override (as autotune() installs one) where no table serves them.
Expected run time on the H200: about 30 s (a handful of small Triton compiles)."""
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.errors import SignatureError  # noqa: E402
from tunedb.runtime import launch_table  # noqa: E402

pytestmark = pytest.mark.gpu

PINS = {"bmm": "b64x64x32_w4_s3_g8", "conv": "dw_t64_c64_w4"}


def _triton(family, sig, m):
    """The pinned Triton config where the family's validity predicate allows it (a depthwise
    conv tile cannot run the pointwise conv beside it), else the table's own answer."""
    cid = PINS.get(family.name)
    if not cid:
        return None
    fam = families.get(family.name)
    cfg = fam.parse_config(cid)
    return None if fam.invalid_reason(cfg, sig, m, shipped_profile("sm90")) else (cfg, "test")


def _grads(fn, ref, *inputs):
    out = []
    for f in (fn, ref):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        y = f(*leaves)
        y = y[0] if isinstance(y, tuple) else y
        (y.float() * torch.linspace(0.5, 2.0, y.numel(), device=y.device).view(y.shape)).sum().backward()
        out.append([t.grad.double() for t in leaves])
    return out


def _spd(batch, n, dtype=torch.float64):
    g = torch.randn(batch, n, n, device="cuda", dtype=dtype)
    return g @ g.mT / n + torch.eye(n, device="cuda", dtype=dtype)


@pytest.mark.parametrize("n", [3, 8, 127])
def test_linalg_gradients_through_the_served_kernels(n):
    from tunedb.families.linalg import ops as la
    from tunedb.families.linalg import problems

    a, b = _spd(64, n), torch.randn(64, n, device="cuda", dtype=torch.float64)
    for op, args in (("posv", (a, b)), ("potrf", (a,)), ("gemv", (a, b))):
        # the library arm's forms: torch's gradient of a Cholesky reads A as symmetric
        ref = lambda *t, op=op: problems.torch_arm(op, *t)  # noqa: E731
        got, want = _grads(getattr(la, op), ref, *args)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-8)
    with torch.no_grad():  # without a gradient the served kernel still answers
        x, info = la.posv(a, b)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))
    assert bool((info == 0).all())


def test_linalg_empty_batch_and_two_devices():
    from tunedb.families.linalg import ops as la

    L, info = la.potrf(_spd(0, 8))
    assert L.shape == (0, 8, 8) and info.shape == (0,)
    a, b = _spd(4, 8), torch.randn(4, 8, device="cuda", dtype=torch.float64)
    for _ in range(2):  # before and after the key is bound (its front memo keys a's device only)
        with pytest.raises(SignatureError, match="one device"):
            la.posv(a, b.cpu())
        x, info = la.posv(a, b)
        torch.testing.assert_close(x, torch.linalg.solve(a, b))


def test_bmm_conv_glsm_gradients_with_triton_arms():
    from tunedb.families.bmm import ops as bmm_ops
    from tunedb.families.conv import ops as conv_ops
    from tunedb.families.gemm_log_softmax import ops as glsm_ops

    h = dict(device="cuda", dtype=torch.float16)
    with launch_table.overriding(_triton):
        a, b = torch.randn(4, 33, 40, **h), torch.randn(4, 40, 24, **h)
        bmm_ops.bmm(a, b)  # bound; then a CPU b is named, not handed to the tile
        with pytest.raises(SignatureError, match="one device"):
            bmm_ops.bmm(a, b.cpu())
        got, want = _grads(bmm_ops.bmm, torch.matmul, a, b)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
        got, want = _grads(lambda x, w: conv_ops.conv1d(x, w, None, 1, 2, 1, 16, act="silu"),
                           lambda x, w: F.silu(F.conv1d(x, w, None, 1, 2, 1, 16)),
                           torch.randn(2, 16, 50, **h), torch.randn(16, 1, 5, **h))
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    got, want = _grads(glsm_ops.gemm_log_softmax, lambda x, w: torch.log_softmax(F.linear(x, w), -1),
                       torch.randn(5, 64, **bf), torch.randn(33, 64, **bf))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


def test_empty_batches_on_cuda():
    from tunedb.families.bmm import ops as bmm_ops
    from tunedb.families.conv import ops as conv_ops
    from tunedb.families.gemm_log_softmax import ops as glsm_ops
    from tunedb.families.scaled_mm import ops as smm

    h = dict(device="cuda", dtype=torch.float16)
    assert bmm_ops.bmm(torch.randn(0, 3, 8, **h), torch.randn(0, 8, 5, **h)).shape == (0, 3, 5)
    assert conv_ops.conv1d(torch.randn(0, 16, 20, **h), torch.randn(16, 1, 5, **h), None, 1, 2, 1, 16).shape == (0, 16, 20)
    assert glsm_ops.gemm_log_softmax(torch.randn(0, 64, **h), torch.randn(33, 64, **h)).shape == (0, 33)
    q = torch.randint(-8, 8, (0, 64), dtype=torch.int8, device="cuda")
    w = torch.randint(-8, 8, (32, 64), dtype=torch.int8, device="cuda")
    y = smm.scaled_mm_int8(q, w, torch.rand(0, 1, device="cuda"), torch.rand(32, device="cuda"))
    assert y.shape == (0, 32)
    f8 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda")
    y = smm.scaled_mm_fp8(q.float().to(f8), w.float().to(f8), one, one)
    assert y.shape == (0, 32)
    torch.cuda.synchronize()


def test_scaled_mm_two_devices_and_leading_dim_scales():
    from tunedb.families.scaled_mm import ops as smm

    x = torch.randint(-8, 8, (2, 3, 64), dtype=torch.int8, device="cuda")
    w = torch.randint(-8, 8, (32, 64), dtype=torch.int8, device="cuda")
    xs, ws = torch.rand(2, 3, 1, device="cuda") + 0.5, torch.rand(32, device="cuda") + 0.5
    with pytest.raises(SignatureError, match="one device"):
        smm.scaled_mm_int8(x, w, xs.cpu(), ws)
    flat = smm.scaled_mm_int8(x.view(6, 64), w, xs.view(6, 1), ws).view(2, 3, 32)
    torch.testing.assert_close(smm.scaled_mm_int8(x, w, xs, ws), flat, rtol=0, atol=0)


def test_a_tuned_lstm_trains_like_the_module():
    from tunedb.families.rnn import census

    torch.manual_seed(0)
    plain = torch.nn.LSTM(32, 64, batch_first=True).cuda().to(torch.bfloat16)
    tuned = census.optimize(torch.nn.LSTM(32, 64, batch_first=True).cuda().to(torch.bfloat16))
    tuned.load_state_dict(plain.state_dict())
    x = torch.randn(4, 10, 32, device="cuda", dtype=torch.bfloat16)
    plain(x)[0].float().square().sum().backward()
    tuned(x)[0].float().square().sum().backward()
    for p, q in zip(plain.parameters(), tuned.parameters()):
        assert q.grad is not None
        torch.testing.assert_close(q.grad.float(), p.grad.float(), rtol=5e-2, atol=5e-2)


def test_autocast_forwards_are_the_plain_models():
    """Under autocast a conv of fp16 activations and fp32 weights ran into the op's dtype check
    (torch's conv casts), and the product mode served fp32 products that autocast runs in fp16."""
    from tunedb.families.bmm import serving
    from tunedb.families.conv import patching

    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv1d(16, 16, 5, padding=2, groups=16), torch.nn.Conv1d(16, 8, 1)).cuda()
    x = torch.randn(2, 16, 40, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        want = conv(x)
        patching.optimize(conv)
        with launch_table.overriding(_triton):
            got = conv(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)

    class Attend(torch.nn.Module):
        def forward(self, q, k):
            return torch.matmul(q, k.transpose(-1, -2))

    q, k = torch.randn(2, 4, 24, 32, device="cuda"), torch.randn(2, 4, 24, 32, device="cuda")
    model = serving.install(Attend())
    with torch.autocast("cuda", dtype=torch.float16), launch_table.overriding(_triton):
        got = model(q, k)
    assert got.dtype == torch.float16


def test_autocast_keeps_the_served_kernel_for_a_model_already_in_its_dtype():
    """An fp16 conv and fp16 products under fp16 autocast are cast to nothing: the served Triton
    arm answers (the override is asked), as outside autocast (runtime.autocast_rule)."""
    from tunedb.families.bmm import serving
    from tunedb.families.conv import patching

    asked = []

    def _count(family, sig, m):
        asked.append(family.name)
        return _triton(family, sig, m)

    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv1d(16, 16, 5, padding=2, groups=16), torch.nn.Conv1d(16, 8, 1)).cuda().half()
    x = torch.randn(2, 16, 40, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        want = conv(x)
        patching.optimize(conv)
        with torch.autocast("cuda", dtype=torch.float16), launch_table.overriding(_count):
            got = conv(x)
    assert "conv" in asked
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)

    class Attend(torch.nn.Module):
        def forward(self, q, k):
            return torch.matmul(q, k.transpose(-1, -2))

    q, k = (torch.randn(2, 4, 24, 32, device="cuda", dtype=torch.float16) for _ in range(2))
    model = serving.install(Attend())
    asked.clear()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16), launch_table.overriding(_count):
        got = model(q, k)
    assert "bmm" in asked
    torch.testing.assert_close(got, torch.matmul(q, k.transpose(-1, -2)), rtol=1e-2, atol=1e-2)
