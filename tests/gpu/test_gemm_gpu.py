"""GEMM on the GPU: every compile-set config over odd and large shapes, both dtypes, every activation,
against the fp32 reference with a poisoned output; split-K determinism; the torch arms."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm import FAMILY, configs  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
COMPILE_SET = [c.id for c in FAMILY.compile_set("sm90", []) if c.lane != "triton_decode"]  # M <= 16: test_gemm_decode_gpu.py
SHAPES = [(1, 80, 72), (17, 80, 520), (3, 4096, 520), (64, 256, 4096), (300, 1280, 1280), (2048, 4096, 4096)]
VARIANTS = [("gemm", "none", False), ("gemm_act", "relu", True), ("gemm_act", "gelu", True),
            ("gemm_act", "gelu_tanh", True), ("gemm_act", "silu", False), ("gemm_act", "none", True)]
CASES = [(m, n, k, dt, VARIANTS[(i * 2 + j) % len(VARIANTS)])
         for i, (m, n, k) in enumerate(SHAPES) for j, dt in enumerate(("bf16", "fp16"))]


def rel_err(y, ref):
    return ((y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def run_checked(cid, sig, m, seed=0):
    (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", seed)
    ref = FAMILY.reference(sig, x, w, b)
    base = rel_err(FAMILY.launch(FAMILY.parse_config("torch"), sig, x, w, b), ref)
    out = torch.full((m, sig.get("N")), float("nan"), dtype=x.dtype, device="cuda")
    y = FAMILY.launch(FAMILY.parse_config(cid), sig, x, w, b, out=out)
    torch.cuda.synchronize()
    assert y is out
    assert not torch.isnan(y).any(), f"{cid} left elements unwritten (NaN) for {sig} M={m}"
    err = rel_err(y, ref)
    assert err <= 4 * base + 2e-3, f"{cid} {sig} M={m}: error {err:.3e} vs torch {base:.3e}"
    return y


@pytest.mark.parametrize("cid", COMPILE_SET)
def test_compile_set_config_matches_reference(cid):
    cfg = FAMILY.parse_config(cid)
    ran = 0
    for m, n, k, dt, (op, act, bias) in CASES:
        sig = FAMILY.make_signature(op, dt, n, k, act, bias)
        if FAMILY.invalid_reason(cfg, sig, m, SM90) is not None:
            continue
        run_checked(cid, sig, m)
        ran += 1
    assert ran >= 4, f"{cid} ran on only {ran} shapes"


@pytest.mark.parametrize("act", configs.ACTS)
@pytest.mark.parametrize("cid", ["default", "b64x128x64_w4_s3_g8", "tma_b128x128x64_w8_s4_g8", "sk4_b16x64x256_w4_s3"])
def test_every_activation_on_every_lane(cid, act):
    for dt in ("bf16", "fp16"):
        sig = FAMILY.make_signature("gemm_act", dt, 1280, 1024, act, True)
        run_checked(cid, sig, 37)


def test_split_k_is_bitwise_deterministic():
    sig = FAMILY.make_signature("gemm_act", "bf16", 4096, 14336, "silu", True)
    (x, w, b), _ = FAMILY.make_inputs(sig, 16, "cuda", 3)
    for cid in ("sk4_b16x64x256_w4_s3", "sk16_b16x32x256_w4_s3"):
        cfg = FAMILY.parse_config(cid)
        first = FAMILY.launch(cfg, sig, x, w, b)
        for _ in range(3):
            assert torch.equal(FAMILY.launch(cfg, sig, x, w, b), first)


def test_leading_dims_and_non_contiguous_x():
    sig = FAMILY.make_signature("gemm_act", "bf16", 80, 520, "gelu", True)
    (x, w, b), _ = FAMILY.make_inputs(sig, 12, "cuda", 1)
    ref = FAMILY.reference(sig, x, w, b)
    for cid in ("b64x64x64_w4_s3_g8", "tma_b64x128x64_w4_s4_g8", "sk2_b32x128x128_w4_s4"):
        y3 = FAMILY.launch(FAMILY.parse_config(cid), sig, x.reshape(3, 4, 520), w, b)
        assert y3.shape == (3, 4, 80) and rel_err(y3.reshape(12, 80), ref) < 2e-2
        xs = x.t().contiguous().t()
        assert not xs.is_contiguous()
        assert rel_err(FAMILY.launch(FAMILY.parse_config(cid), sig, xs, w, b), ref) < 2e-2


def test_torch_and_fused_arms():
    sig = FAMILY.make_signature("gemm_act", "bf16", 2048, 512, "gelu_tanh", True)
    run_checked("torch", sig, 100)
    run_checked("fused", sig, 100)
    relu = FAMILY.make_signature("gemm_act", "fp16", 2048, 512, "relu", True)
    run_checked("fused", relu, 100)


def test_m_zero_returns_empty():
    sig = FAMILY.make_signature("gemm", "bf16", 256, 256)
    w = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    x = torch.empty(0, 256, device="cuda", dtype=torch.bfloat16)
    for cid in ("b64x64x64_w4_s3_g8", "tma_b64x128x64_w4_s4_g8", "sk2_b32x128x128_w4_s4"):
        assert FAMILY.launch(FAMILY.parse_config(cid), sig, x, w).shape == (0, 256)


@pytest.mark.parametrize("act,bias", [("none", True), ("gelu", True), ("silu", False), ("relu", True)])
def test_torch_arm_measured_runs_the_models_kernels(act, bias):
    """The build measures the torch arm with `out`; it must launch the kernels the model's call
    (out=None: F.linear + activation) launches, by name and count, and nothing more."""
    from torch.profiler import ProfilerActivity, profile

    sig = FAMILY.make_signature("gemm_act", "bf16", 1280, 1280, act=act, bias=bias)
    (x, w, b), _ = FAMILY.make_inputs(sig, 1500, "cuda", 0)
    arm = FAMILY.parse_config("torch")
    out = torch.empty((1500, 1280), dtype=x.dtype, device="cuda")

    def kernels(o):
        FAMILY.launch(arm, sig, x, w, b, out=o)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            FAMILY.launch(arm, sig, x, w, b, out=o)
            torch.cuda.synchronize()
        return sorted(e.name for e in prof.events() if str(e.device_type).endswith("CUDA"))

    assert kernels(out) == kernels(None)
    ref = FAMILY.reference(sig, x, w, b)
    assert rel_err(out, ref) < 2e-2
