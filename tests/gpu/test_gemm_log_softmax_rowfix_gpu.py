"""gemm_log_softmax's triton_rowfix lane (small M) on the GPU: every config of its grid at CTC-head
and ragged shapes against the fp32 reference (bf16 with bias, fp16 without), the output poisoned
first, rows of exp(y) summing to 1 within the output rounding's bound; each launch mode (two
kernels, PDL, one persistent kernel with its grid barrier) inside a captured CUDA graph of
back-to-back calls on fresh inputs, replayed more than once (the barrier's counters are left zero
by every launch). About 30-50 s on an H200 (mostly first-launch compiles: about 45)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm_log_softmax import configs_rowfix as rowfix  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
FAM = families.get("gemm_log_softmax")
GRID = tuple(c.id for c in rowfix.grid())
MODES = ("rf_b64x64x64_w4_s3_two", "rf_b64x32x128_w4_s3_pdl", "rf_b64x64x64_w4_s3_one2", "rf_b128x128x64_w8_s3_one1")
# (M, N, K, dt, bias, configs): the whole grid at two census heads (bf16 with bias); one config of
# each launch mode at ragged M / N / K, a census head at M=100, the lane's top M, and in fp16
# without bias (two shapes: each new N / K divisibility is another compile of every kernel)
SHAPES = [(64, 32000, 512, "bf16", 1, GRID), (256, 16000, 512, "bf16", 1, GRID), (100, 5000, 256, "bf16", 1, MODES),
          (37, 1001, 200, "bf16", 1, MODES), (1024, 5000, 256, "bf16", 1, MODES), (64, 32000, 512, "fp16", 0, MODES),
          (37, 1001, 200, "fp16", 0, MODES)]
DTS = {"bf16": torch.bfloat16, "fp16": torch.float16}
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def rel(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def row_sum_bound(ref, dtype):
    """As tests/gpu/test_gemm_log_softmax_gpu.py: sum_i p_i * expm1(u * |log p_i|) + 1e-3."""
    return (ref.exp() * torch.expm1(UNIT[dtype] * ref.abs())).sum(-1) + 1e-3


@pytest.mark.parametrize("m,n,k,dt,bias,ids", SHAPES)
def test_rowfix_configs_against_fp32(m, n, k, dt, bias, ids):
    sig = FAM.make_signature(n, k, dt, bias)
    args, _ = FAM.make_inputs(sig, m, "cuda", 0)
    ref = FAM.reference(sig, *args)
    torch_y = FAM.launch(FAM.parse_config("torch"), sig, *args)
    base = rel(torch_y, ref)
    allowed = row_sum_bound(ref, DTS[dt])
    ran = 0
    for cid in ids:
        cfg = FAM.parse_config(cid)
        if FAM.invalid_reason(cfg, sig, m, SM90):
            continue
        out = torch.full((m, n), float("nan"), dtype=DTS[dt], device="cuda")
        y = FAM.launch(cfg, sig, *args, out=out)
        assert y is out
        assert not torch.isnan(y).any(), cid
        err = rel(y, ref)
        assert err <= 4 * base, (cid, err, base)
        dev = (y.float().exp().sum(-1) - 1).abs()
        assert (dev <= allowed).all(), (cid, dev.max().item(), int(dev.argmax()))
        ran += 1
    assert ran >= 3, ran


@pytest.mark.parametrize("cid", ["rf_b64x64x64_w4_s3_two", "rf_b64x64x64_w4_s3_pdl", "rf_b64x64x64_w4_s3_one2",
                                 "rf_b128x128x64_w8_s3_one1"])
def test_captured_graph_back_to_back_on_fresh_inputs(cid):
    """Three calls in one graph (the second call's tiles follow the first call's fix-up; a one-
    launch call finds the counters the last one left), replayed twice on fresh inputs."""
    sig = FAM.make_signature(32000, 512, "bf16", 1)
    m = 200
    (x, w, b), _ = FAM.make_inputs(sig, m, "cuda", 1)
    xs = [x.clone() for _ in range(3)]
    outs = [torch.empty(m, 32000, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    cfg = FAM.parse_config(cid)
    for xi, oi in zip(xs, outs):
        FAM.launch(cfg, sig, xi, w, b, out=oi)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for xi, oi in zip(xs, outs):
            FAM.launch(cfg, sig, xi, w, b, out=oi)
    for _ in range(2):
        for xi, oi in zip(xs, outs):
            xi.copy_(torch.randn_like(xi))
            oi.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for xi, oi in zip(xs, outs):
            ref = FAM.reference(sig, xi, w, b)
            assert not torch.isnan(oi).any(), cid
            assert rel(oi, ref) < 1e-2, cid


def test_one_launch_counters_taken_inside_a_capture_stay_the_graphs():
    """A one-launch config whose first call on the device is captured: the graph gets its own
    zeroed counters (not cached: a capture's memory returns to its pool with the graph), and
    eager calls after it allocate their own."""
    from tunedb.families.gemm_log_softmax import launch_rowfix

    sig = FAM.make_signature(5000, 256, "bf16", 1)
    (x, w, b), _ = FAM.make_inputs(sig, 64, "cuda", 2)
    cfg = FAM.parse_config("rf_b64x64x64_w4_s3_one2")
    out = torch.empty(64, 5000, dtype=torch.bfloat16, device="cuda")
    FAM.launch(cfg, sig, x, w, b, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    launch_rowfix._COUNTERS.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        FAM.launch(cfg, sig, x, w, b, out=out)
    assert not launch_rowfix._COUNTERS
    for _ in range(2):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert rel(out, FAM.reference(sig, x, w, b)) < 1e-2
    del g
    y = FAM.launch(cfg, sig, x, w, b)
    assert rel(y, FAM.reference(sig, x, w, b)) < 1e-2
    assert all(int(c.abs().sum()) == 0 for c in launch_rowfix._COUNTERS.values())
