"""gemm_log_softmax's triton_overlap arm (one persistent launch, fix-ups LAG tiles behind the GEMM
tiles; docs/glsm_gap.md) on the GPU: every config of its grid at a CTC head against the fp32
reference (bf16 with bias), one config at ragged and fp16 shapes, grids smaller than the SMs
(CTAs that wait on each other's row blocks), leading dimensions; the output poisoned with NaN
first (a fix-up whose wait ran out writes NaN), rows of exp(y) summing to 1 within the output
rounding's bound; and three back-to-back calls captured in one CUDA graph, replayed twice on
fresh inputs (each call's counters are zeroed by its own memset). About 30-50 s on an H200
(mostly ~14 first-launch compiles)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm_log_softmax import configs_overlap as co  # noqa: E402
from tunedb.families.gemm_log_softmax.launch_overlap import overlap_arm  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
FAM = families.get("gemm_log_softmax")
GRID = tuple(c.id for c in co.grid())
ONE = ("ov_b128x128x64_w8_s3",)
# (M, N, K, dt, bias, configs): the whole grid at a census head; one config at the other census
# vocabularies (N = 5000: not a multiple of 16, the vector hint), ragged M / N / K, and fp16 without bias
SHAPES = [(1024, 32000, 512, "bf16", 1, GRID), (4096, 5000, 256, "bf16", 1, ONE), (300, 16000, 512, "bf16", 1, ONE),
          (1000, 1001, 200, "bf16", 1, ONE), (777, 5000, 256, "fp16", 0, ONE)]
DTS = {"bf16": torch.bfloat16, "fp16": torch.float16}
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def rel(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def row_sum_bound(ref, dtype):
    """As tests/gpu/test_gemm_log_softmax_gpu.py: sum_i p_i * expm1(u * |log p_i|) + 1e-3."""
    return (ref.exp() * torch.expm1(UNIT[dtype] * ref.abs())).sum(-1) + 1e-3


def check(y, ref, base, dtype, what):
    assert not torch.isnan(y).any(), what
    err = rel(y, ref)
    assert err <= 4 * base, (what, err, base)
    dev = (y.float().exp().sum(-1) - 1).abs()
    assert (dev <= row_sum_bound(ref, dtype)).all(), (what, dev.max().item(), int(dev.argmax()))


@pytest.mark.parametrize("m,n,k,dt,bias,ids", SHAPES)
def test_overlap_configs_against_fp32(m, n, k, dt, bias, ids):
    sig = FAM.make_signature(n, k, dt, bias)
    args, _ = FAM.make_inputs(sig, m, "cuda", 0)
    ref = FAM.reference(sig, *args)
    base = rel(FAM.launch(FAM.parse_config("torch"), sig, *args), ref)
    for cid in ids:
        cfg = co.parse(cid)
        assert co.reason(cfg, n, k, m, SM90) is None, cid
        out = torch.full((m, n), float("nan"), dtype=DTS[dt], device="cuda")
        y = overlap_arm(cfg, *args, out=out)
        assert y is out
        check(y, ref, base, DTS[dt], cid)


@pytest.mark.parametrize("grid", [1, 5, 33])
def test_grids_smaller_than_the_sms_wait_on_each_other(grid):
    """Fewer CTAs than SMs: a CTA's fix-up waits on row blocks other CTAs finish (LAG = grid + T),
    and with grid 1 one CTA does every tile and every fix-up in order."""
    sig = FAM.make_signature(16000, 512, "bf16", 1)
    m = 1000
    args, _ = FAM.make_inputs(sig, m, "cuda", 3)
    ref = FAM.reference(sig, *args)
    base = rel(FAM.launch(FAM.parse_config("torch"), sig, *args), ref)
    out = torch.full((m, 16000), float("nan"), dtype=torch.bfloat16, device="cuda")
    overlap_arm(co.parse(ONE[0]), *args, out=out, grid=grid)
    check(out, ref, base, torch.bfloat16, f"grid {grid}")


def test_leading_dimensions_and_a_new_output():
    sig = FAM.make_signature(5000, 256, "bf16", 1)
    (x, w, b), _ = FAM.make_inputs(sig, 4 * 150, "cuda", 4)
    x3 = x.view(4, 150, 256)
    y = overlap_arm(co.parse(ONE[0]), x3, w, b)
    assert y.shape == (4, 150, 5000) and y.dtype == torch.bfloat16
    ref = FAM.reference(sig, x, w, b)
    base = rel(FAM.launch(FAM.parse_config("torch"), sig, x, w, b), ref)
    check(y.view(600, 5000), ref, base, torch.bfloat16, "leading dims")


@pytest.mark.parametrize("cid", ["ov_b128x256x64_w8_s3", "ov_b64x128x64_w4_s4"])
def test_captured_graph_back_to_back_on_fresh_inputs(cid):
    """Three calls in one graph (each with its own counters' memset), replayed twice on fresh inputs."""
    sig = FAM.make_signature(32000, 512, "bf16", 1)
    m = 600
    (x, w, b), _ = FAM.make_inputs(sig, m, "cuda", 1)
    xs = [x.clone() for _ in range(3)]
    outs = [torch.empty(m, 32000, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    cfg = co.parse(cid)
    for xi, oi in zip(xs, outs):
        overlap_arm(cfg, xi, w, b, out=oi)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for xi, oi in zip(xs, outs):
            overlap_arm(cfg, xi, w, b, out=oi)
    for _ in range(2):
        for xi, oi in zip(xs, outs):
            xi.copy_(torch.randn_like(xi))
            oi.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for xi, oi in zip(xs, outs):
            ref = FAM.reference(sig, xi, w, b)
            base = rel(FAM.launch(FAM.parse_config("torch"), sig, xi, w, b), ref)
            check(oi, ref, base, torch.bfloat16, cid)
