"""The triton_decode lane's GEMV kernel (`gv` configs) on the GPU: fp8 per-tensor and row-wise scales
(block scales at 4096x4096) against the fp32 product of the dequantized operands over odd and
Llama-3-8B widths at M = 1, 3, 4, 8, 16 (the FMA path where its predicate admits M, the tensor-core
path everywhere; within 4x torch._scaled_mm's own error, as the family's GPU tests), int8 bitwise
equal to the exact product, and back-to-back calls (splits sharing the launcher's counters, PDL
twins overlapping their predecessor) inside one captured CUDA graph, each output bitwise equal to
its eager run. About 40-55 s on the H200, most of it compiling (~55 kernel variants)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
INT8, FP8 = families.get("scaled_mm"), families.get("scaled_mm_fp8")
IDS = ("gv1_n16x512_w4_s5", "gv2_n8x128_w2_s3", "gv4_n8x512_w2_s3_pdl", "gv2_n4x512_w2_s3", "gv3_n16x256_w4_s5",
       # the tensor-core path (w @ x^T): one warp per 16 rows, 32 rows on 4 warps, wgmma slabs
       "gv1_n16x512_w1_s5_mma_pdl", "gv4_n32x256_w4_s5_mma", "gv2_n32x256_w2_s3_mma", "gv4_n64x256_w4_s4_mma",
       "gv3_n128x128_w4_s5_mma_pdl", "gv2_n64x128_w4_s5_mma")
SHAPES = [(80, 200), (4096, 4096), (6144, 4096), (4096, 14336)]  # N, K
MS = (1, 3, 4, 8, 16)


def valid(fam, sig, m):
    return [c for c in IDS if fam.invalid_reason(fam.parse_config(c), sig, m, SM90) is None]


@pytest.mark.parametrize("n, k, scale", [(n, k, "row") for n, k in SHAPES] + [(4096, 4096, "tensor"),
                                                                              (4096, 4096, "block")])
def test_fp8_gv_against_fp32_reference(n, k, scale):
    sig = FP8.make_signature("scaled_mm", n, k, "bf16", scale)
    for m in MS if scale == "row" else (1, 16):
        args, _ = FP8.make_inputs(sig, m, "cuda", seed=m + n)
        ref = FP8.reference(sig, *args)
        peak = ref.abs().max()
        base = ((ref.to(torch.bfloat16).float() - ref).abs().max() / peak).item()
        if FP8.invalid_reason(FP8.parse_config("torch"), sig, m, SM90) is None:
            y = FP8.launch(FP8.parse_config("torch"), sig, *args)
            base = max(base, ((y.float() - ref).abs().max() / peak).item())
        ran = valid(FP8, sig, m)
        if k >= 4096:  # the FMA path runs at M <= 4 (at K=200 its splits outnumber the K tiles)
            assert any(not c.endswith(("_mma", "_mma_pdl")) for c in ran) == (m <= 4), ran
            # every tensor-core slab (block scales: those whose K block divides 128)
            want = [c for c in IDS if "_mma" in c and (scale != "block" or "x128_" in c)]
            assert [c for c in want if c not in ran] == [] and want, ran
        for cid in ran:
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            y = FP8.launch(FP8.parse_config(cid), sig, *args, out=out)
            torch.cuda.synchronize()
            assert y.data_ptr() == out.data_ptr() and not torch.isnan(y).any(), f"{cid} M={m}: left NaN"
            err = ((y.float() - ref).abs().max() / peak).item()
            assert err <= 4 * base + 1e-4, f"{cid} {sig} M={m}: error {err:.3e} vs baseline {base:.3e}"


@pytest.mark.parametrize("n, k", [(80, 200), (4096, 4096)])
def test_int8_gv_bitwise_exact(n, k):
    sig = INT8.make_signature("scaled_mm", n, k, "bf16")
    for m in (1, 4, 16):
        x, w, sx, sw = INT8.make_inputs(sig, m, "cuda", seed=m)[0]
        # the integer product is exact in fp64 and rounds to fp32 as the int32 accumulator does
        acc = (x.double() @ w.double().t()).float()
        want = acc.mul_(sx.reshape(-1, 1)).mul_(sw.reshape(1, -1)).to(torch.bfloat16)
        for cid in valid(INT8, sig, m):
            for call in range(2):  # the second call finds the split counters reset
                y = INT8.launch(INT8.parse_config(cid), sig, x, w, sx, sw)
                torch.cuda.synchronize()
                assert torch.equal(y, want), f"{cid} N={n} K={k} M={m} call {call}: not bitwise"


@pytest.mark.parametrize("cid", ["gv4_n8x512_w2_s3_pdl", "gv1_n16x512_w4_s5", "gv3_n16x256_w4_s5",
                                 "gv1_n16x512_w1_s5_mma_pdl", "gv4_n64x256_w4_s4_mma"])
def test_gv_back_to_back_in_a_graph(cid):
    """Four calls on different inputs in one captured graph (PDL lets each start under the previous;
    split configs share one workspace and counters): each output bitwise equal to its eager run
    (so every call left the counters zero for the next), over three replays."""
    m = 16 if "_mma" in cid else 1
    sig = FP8.make_signature("scaled_mm", 4096, 4096, "bf16", "row")
    inputs = [FP8.make_inputs(sig, m, "cuda", seed=20 + i)[0] for i in range(4)]
    run = FP8.launcher(FP8.parse_config(cid), sig)
    want = [run(*a, None).clone() for a in inputs]  # eager, also compiles and allocates
    outs = [torch.empty((m, 4096), dtype=torch.bfloat16, device="cuda") for _ in inputs]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for a, o in zip(inputs, outs):
            run(*a, o)
    for _ in range(3):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for i, (o, w) in enumerate(zip(outs, want)):
            assert torch.equal(o, w), f"{cid} call {i}: not bitwise equal after a replay"


@pytest.mark.parametrize("cid, m", [("gv4_n8x512_w2_s3_pdl", 1), ("gv1_n16x512_w1_s5_mma_pdl", 16),
                                    ("gv3_n128x128_w4_s5_mma_pdl", 4)])
def test_gv_pdl_chain_reads_what_the_previous_kernel_wrote(cid, m):
    """A model's chain in one graph: row quantizer -> gv (PDL) -> quantizer of its output -> gv ...
    Each PDL GEMM loads its first weight tile before gdc_wait and x after it, so every link must
    equal the eager chain bit for bit (a read of x before its writer finished would not)."""
    from tunedb.families.scaled_mm.launch import quantize_rows

    sig = FP8.make_signature("scaled_mm", 4096, 4096, "bf16", "row")
    weights = [FP8.make_inputs(sig, 1, "cuda", seed=40 + i)[0][1:4:2] for i in range(4)]  # (w, sw)
    run = FP8.launcher(FP8.parse_config(cid), sig)
    x0 = torch.randn((m, 4096), device="cuda").to(torch.bfloat16)

    def chain(x):
        outs = []
        for w, sw in weights:
            q, s = quantize_rows(x, "fp8")
            x = run(q, w, s, sw, None)
            outs.append(x)
        return outs

    want = [o.clone() for o in chain(x0)]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = chain(x0)
    for _ in range(3):
        for o in got:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for i, (o, w) in enumerate(zip(got, want)):
            assert torch.equal(o, w), f"{cid} link {i}: not bitwise equal to the eager chain"


@pytest.mark.parametrize("cid", ["gv4_n32x256_w4_s5_mma", "gv3_n16x256_w4_s5"])
def test_a_split_launcher_first_called_inside_a_capture(cid):
    """A launcher whose first call is captured (its split counters and workspace made, and zeroed,
    only inside the graph) keeps no buffers from the capture: an eager call before any replay makes
    its own zeroed ones and is exact; the graph's replay is exact too."""
    sig = INT8.make_signature("scaled_mm", 1024, 4096, "bf16")
    m = 16 if "_mma" in cid else 1
    x, w, sx, sw = INT8.make_inputs(sig, m, "cuda", seed=7)[0]
    acc = (x.double() @ w.double().t()).float()
    want = acc.mul_(sx.reshape(-1, 1)).mul_(sw.reshape(1, -1)).to(torch.bfloat16)
    assert INT8.invalid_reason(INT8.parse_config(cid), sig, m, SM90) is None
    run = INT8.launcher(INT8.parse_config(cid), sig)
    INT8.launch(INT8.parse_config(cid), sig, x, w, sx, sw)  # compiles through another launcher
    out = torch.empty((m, 1024), dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run(x, w, sx, sw, out)
    for _ in range(2):
        assert torch.equal(run(x, w, sx, sw, None), want), f"{cid}: eager call after the capture"
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want), f"{cid}: replay"
