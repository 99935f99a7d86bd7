"""gemm_log_softmax's split_rows lane on the GPU: every config of its grid at the three CTC-head
vocabularies and ragged shapes against the fp32 reference (bf16 with bias, fp16 without), the
output poisoned first, rows of exp(y) summing to 1 within the output rounding's bound; plain and
PDL configs inside a captured CUDA graph of back-to-back calls on fresh inputs, replayed twice.
About 30 s on an H200 (first-launch compiles of two small kernels a config and divisibility)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm_log_softmax import configs_split as split  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
FAM = families.get("gemm_log_softmax")
GRID = tuple(c.id for c in split.grid())
FEW = ("ls_c1024_w4", "ls_c2048_w8_pdl", "ls_c4096_w4_pdl")
# (M, N, K, dt, bias, configs): the whole grid at the census heads (bf16 with bias); a few at ragged
# M / N / K, a large M, and in fp16 without bias
SHAPES = [(256, 16000, 512, "bf16", 1, GRID), (64, 32000, 512, "bf16", 1, GRID), (256, 5000, 256, "bf16", 1, GRID),
          (37, 1001, 200, "bf16", 1, FEW), (4096, 5000, 256, "bf16", 1, FEW), (100, 32000, 512, "fp16", 0, FEW),
          (37, 1001, 200, "fp16", 0, FEW)]
DTS = {"bf16": torch.bfloat16, "fp16": torch.float16}
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def rel(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def row_sum_bound(ref, dtype):
    """As tests/gpu/test_gemm_log_softmax_gpu.py: sum_i p_i * expm1(u * |log p_i|) + 1e-3."""
    return (ref.exp() * torch.expm1(UNIT[dtype] * ref.abs())).sum(-1) + 1e-3


@pytest.mark.parametrize("m,n,k,dt,bias,ids", SHAPES)
def test_split_configs_against_fp32(m, n, k, dt, bias, ids):
    sig = FAM.make_signature(n, k, dt, bias)
    args, _ = FAM.make_inputs(sig, m, "cuda", 0)
    ref = FAM.reference(sig, *args)
    base = rel(FAM.launch(FAM.parse_config("torch"), sig, *args), ref)
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


@pytest.mark.parametrize("cid", ["ls_c2048_w4", "ls_c2048_w4_pdl", "ls_c4096_w8_pdl"])
def test_captured_graph_back_to_back_on_fresh_inputs(cid):
    """Three calls in one graph (each call's statistics pass follows the previous call's fix-up),
    replayed twice on fresh inputs."""
    sig = FAM.make_signature(16000, 512, "bf16", 1)
    m = 200
    (x, w, b), _ = FAM.make_inputs(sig, m, "cuda", 1)
    xs = [x.clone() for _ in range(3)]
    outs = [torch.empty(m, 16000, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
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
