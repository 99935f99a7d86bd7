"""gemm_log_softmax on the GPU: the Triton designs (a sample of tiles and row passes) and the torch arm at odd
and CTC-head shapes against the fp32 reference, bf16 and fp16, with and without bias; the
output poisoned first (every element written); one arm of each design inside a captured CUDA
graph; the op through the selector and the swapped head module. About 40 s on an H200 (mostly
first-launch compiles)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
FAM = families.get("gemm_log_softmax")
TILES = ("rc_b16x128x64_w4_s3", "rc_b64x128x64_w4_s3", "rc_b128x256x64_w8_s3",
         "fx_b16x128x64_w4_s3", "fx_b64x128x64_w4_s3", "fx_b128x256x64_w8_s3",
         "lr_r1_c32768_w16", "lr_r1_c8192_w8", "lr_r1_c2048_w4", "lr_r4_c2048_w4")
# (M, N, K): odd N and K, a decode-sized M, CTC heads at 5k and 32k vocabularies
SHAPES = [(1, 5000, 256), (37, 1001, 200), (333, 5000, 512), (2048, 32000, 512), (4100, 8000, 320)]
DTS = {"bf16": torch.bfloat16, "fp16": torch.float16}


def run(cid, sig, args, m):
    out = torch.full((m, sig.get("N")), float("nan"), dtype=args[0].dtype, device="cuda")
    y = FAM.launch(FAM.parse_config(cid), sig, *args, out=out)
    assert y is out
    return out


def rel(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


# unit roundoff of the output dtype (half an ulp, relative): bf16 keeps 8 significant bits
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def row_sum_bound(ref, dtype):
    """How far a row of exp(y) may sum from 1 when y is log p rounded to `dtype`: each log p_i
    moves by at most u * |log p_i|, so sum_i p_i * expm1(u * |log p_i|) (at most u * ln N per
    row: 0.035 for bf16 at N = 8000, so a flat 3e-2 was no bound), plus 1e-3 for the fp32
    GEMM's own order of summation."""
    return (ref.exp() * torch.expm1(UNIT[dtype] * ref.abs())).sum(-1) + 1e-3


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dt,bias", [("bf16", 1), ("fp16", 0)])
def test_every_arm_against_fp32(m, n, k, dt, bias):
    sig = FAM.make_signature(n, k, dt, bias)
    args, _ = FAM.make_inputs(sig, m, "cuda", 0)
    ref = FAM.reference(sig, *args)
    torch_y = run("torch", sig, args, m)
    base = rel(torch_y, ref)
    allowed = row_sum_bound(ref, DTS[dt])
    assert ((torch_y.float().exp().sum(-1) - 1).abs() <= allowed).all()  # the bound holds torch's own
    for cid in TILES:
        if FAM.invalid_reason(FAM.parse_config(cid), sig, m, SM90):
            continue
        y = run(cid, sig, args, m)
        assert y.dtype == DTS[dt]
        assert not torch.isnan(y).any(), cid
        err = rel(y, ref)
        assert err <= 4 * base, (cid, err, base)
        dev = (y.float().exp().sum(-1) - 1).abs()
        assert (dev <= allowed).all(), (cid, dev.max().item(), int(dev.argmax()))


@pytest.mark.parametrize("cid", ["rc_b64x128x64_w4_s3", "fx_b64x128x64_w4_s3", "lr_r1_c2048_w4", "torch"])
def test_captured_graph_replays_fresh_inputs(cid):
    sig = FAM.make_signature(5000, 256, "bf16", 1)
    (x, w, b), _ = FAM.make_inputs(sig, 512, "cuda", 1)
    out = torch.empty(512, 5000, dtype=torch.bfloat16, device="cuda")
    cfg = FAM.parse_config(cid)
    FAM.launch(cfg, sig, x, w, b, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        FAM.launch(cfg, sig, x, w, b, out=out)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    ref = FAM.reference(sig, x, w, b)
    assert rel(out, ref) < 1e-2


def test_op_and_swapped_head_on_cuda():
    from tunedb.families.gemm_log_softmax.census import optimize
    from tunedb.families.gemm_log_softmax.ops import gemm_log_softmax

    head = torch.nn.Sequential(torch.nn.Linear(256, 5000), torch.nn.LogSoftmax(dim=-1)).cuda().to(torch.bfloat16)
    x = torch.randn(4, 60, 256, device="cuda", dtype=torch.bfloat16)
    before = head(x)
    optimize(head)
    after = head(x)
    assert after.shape == (4, 60, 5000) and after.dtype == torch.bfloat16
    torch.testing.assert_close(after, before)
    y = gemm_log_softmax(x, head[0].weight, head[0].bias)
    torch.testing.assert_close(y, before)
