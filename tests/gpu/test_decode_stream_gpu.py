"""The triton_decode lane's stream kernel (`ds` configs) on the GPU: every decode GEMM shape of the
presets (Llama-3-8B, Conformer streaming) and the ANCHORS weights at M in {1, 4, 8, 16} against
the fp32 reference with a poisoned output, inside a captured CUDA graph (tensor-core and FMA
paths, deterministic and atomic reductions, 1/2/4 K tiles per CTA, PDL); a two-GEMM PDL chain
whose second kernel reads the first's output; the deterministic reduction bitwise equal across
runs and graph replays. About 30-45 s on an H200 (about 10 Triton compiles; the rest is replays)."""
import pytest

torch = pytest.importorskip("torch")

from gemm_decode_checks import MS, SHAPES, check_bitwise_repeatable  # noqa: E402
from gemm_decode_checks import capture as _graph  # noqa: E402
from gemm_decode_checks import check as _check  # noqa: E402
from gemm_decode_checks import valid as _valid  # noqa: E402

from tunedb.families.gemm import FAMILY  # noqa: E402

pytestmark = pytest.mark.gpu

# deterministic split (one K tile per CTA), atomic with 2 tiles, FMA, 4 tiles with PDL
CONFIGS = ("ds_t1_n32x256_w4", "ds_t2_n64x256_w8_at", "ds_t1_n4x1024_w4_fma", "ds_t4_n64x256_w8_pdl")


@pytest.mark.parametrize("n,k", SHAPES)
def test_stream_configs_match_reference_in_a_graph(n, k):
    sigs = [FAMILY.make_signature("gemm", "bf16", n, k)]
    if (n, k) in ((4096, 4096), (512, 9728), (1536, 512)):
        sigs.append(FAMILY.make_signature("gemm_act", "fp16", n, k, "silu", True))
    ran = 0
    for sig in sigs:
        for m in MS:
            (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", seed=m)
            ref = FAMILY.reference(sig, x, w, b)
            for cid in CONFIGS:
                if not _valid(cid, sig, m):
                    continue
                out = torch.empty((m, n), dtype=x.dtype, device="cuda")
                g = _graph(cid, sig, x, w, b, out)
                for _ in range(2):  # a second replay: the counters and the atomic workspace were left zero
                    out.fill_(float("nan"))
                    g.replay()
                    torch.cuda.synchronize()
                    _check(out, ref, f"{cid} {sig.format()} M={m}", x.dtype)
                ran += 1
    assert ran >= 12


@pytest.mark.parametrize("cid", ["ds_t1_n32x256_w4_pdl", "ds_t1_n4x1024_w4_fma_at_pdl"])
def test_pdl_chain_reads_the_previous_kernels_output(cid):
    """z = B(A(x)) in one graph, A: [n, k], B: [k, n]. Replayed on a new x, B must see the new y:
    a PDL kernel that read x before gdc_wait would see the previous replay's y."""
    n, k = 14336, 4096
    sa, sb = FAMILY.make_signature("gemm", "bf16", n, k), FAMILY.make_signature("gemm", "bf16", k, n)
    (x, wa, _), _ = FAMILY.make_inputs(sa, 8, "cuda", seed=1)
    (_, wb, _), _ = FAMILY.make_inputs(sb, 8, "cuda", seed=2)
    cfg = FAMILY.parse_config(cid)
    y = torch.empty((8, n), dtype=x.dtype, device="cuda")
    z = torch.empty((8, k), dtype=x.dtype, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        FAMILY.launch(cfg, sa, x, wa, None, out=y)
        FAMILY.launch(cfg, sb, y, wb, None, out=z)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        FAMILY.launch(cfg, sa, x, wa, None, out=y)
        FAMILY.launch(cfg, sb, y, wb, None, out=z)
    for seed in (3, 4, 5):
        x.copy_(torch.rand(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) * 2 - 1)
        g.replay()
        torch.cuda.synchronize()
        _check(y, FAMILY.reference(sa, x, wa), f"{cid} first {sa.format()}", x.dtype)
        _check(z, FAMILY.reference(sb, y, wb), f"{cid} second {sb.format()} (seed {seed})", x.dtype)


@pytest.mark.parametrize("cid", ["ds_t1_n32x256_w4", "ds_t1_n4x1024_w4_fma", "ds_t2_n64x256_w8_pdl"])
def test_deterministic_reduction_is_bitwise_repeatable(cid):
    """K = 14336: 56, 14 and 28 splits per block (groups of eight partial planes in the final sum)."""
    sig = FAMILY.make_signature("gemm_act", "bf16", 4096, 14336, "gelu", True)
    (x, w, b), _ = FAMILY.make_inputs(sig, 16, "cuda", seed=0)
    check_bitwise_repeatable(cid, sig, x, w, b)
    cfg = FAMILY.parse_config(cid)
    (x17, _, _), _ = FAMILY.make_inputs(sig, 17, "cuda", seed=0)
    with pytest.raises(ValueError, match="M <= 16"):
        FAMILY.launch(cfg, sig, x17, w, b)
