"""The triton_decode lane on the GPU: every decode GEMM shape of the presets (Llama-3-8B, Conformer
streaming) and the ANCHORS weights at M in {1, 4, 8, 16}, bf16 and fp16, against the fp32 reference
with a poisoned output, inside a captured CUDA graph, with and without PDL; a two-GEMM chain whose
second kernel reads the first's output (PDL must not let it read early); determinism.
About 2-3 minutes on an H200 (Triton compiles ~10 binaries; the rest is graph replays)."""
import pytest

torch = pytest.importorskip("torch")

from gemm_decode_checks import MS, SHAPES, capture  # noqa: E402
from gemm_decode_checks import check as _check  # noqa: E402
from gemm_decode_checks import valid as _valid  # noqa: E402

from tunedb.families.gemm import FAMILY  # noqa: E402

pytestmark = pytest.mark.gpu

# deterministic without split, deterministic split, atomic split; each without and with PDL
FAMILIES = [("dk1_n64x256_w4_s4", "dk1_n64x256_w4_s4_pdl"),
            ("dk4_n32x256_w4_s4", "dk4_n32x256_w4_s4_pdl"),
            ("dk8_n32x256_w4_s4_at", "dk8_n32x256_w4_s4_at_pdl")]


def _graph_run(cid, sig, x, w, b, out):
    """One warm-up launch, then the launch captured in a CUDA graph and replayed on a poisoned out."""
    g = capture(cid, sig, x, w, b, out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("n,k", SHAPES)
def test_decode_lane_matches_reference_in_a_graph(n, k):
    ran = 0
    for i, dt in enumerate(("bf16", "fp16")):
        op, act, bias = (("gemm", "none", False), ("gemm_act", "silu", True))[i]
        sig = FAMILY.make_signature(op, dt, n, k, act, bias)
        for m in MS:
            (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", seed=m)
            ref = FAMILY.reference(sig, x, w, b)
            for pair in FAMILIES:
                for cid in pair:
                    if not _valid(cid, sig, m):
                        continue
                    out = torch.empty((m, n), dtype=x.dtype, device="cuda")
                    _check(_graph_run(cid, sig, x, w, b, out), ref, f"{cid} {sig.format()} M={m}", x.dtype)
                    ran += 1
    assert ran >= 16


@pytest.mark.parametrize("pair", FAMILIES)
@pytest.mark.parametrize("n,k", [(4096, 4096), (14336, 4096), (512, 2048)])
def test_pdl_chain_reads_the_previous_kernels_output(pair, n, k):
    """z = B(A(x)) in one graph, A: [n, k], B: [k, n]. Replayed on a second x, B must see the new y:
    a PDL kernel that read x before gdc_wait would see the first replay's y."""
    for cid in pair:
        sa = FAMILY.make_signature("gemm", "bf16", n, k)
        sb = FAMILY.make_signature("gemm", "bf16", k, n)
        (x, wa, _), _ = FAMILY.make_inputs(sa, 8, "cuda", seed=1)
        (_, wb, _), _ = FAMILY.make_inputs(sb, 8, "cuda", seed=2)
        ca, cb = FAMILY.parse_config(cid), FAMILY.parse_config(cid)
        if not (_valid(cid, sa, 8) and _valid(cid, sb, 8)):
            continue
        y = torch.empty((8, n), dtype=x.dtype, device="cuda")
        z = torch.empty((8, k), dtype=x.dtype, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            FAMILY.launch(ca, sa, x, wa, None, out=y)
            FAMILY.launch(cb, sb, y, wb, None, out=z)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            FAMILY.launch(ca, sa, x, wa, None, out=y)
            FAMILY.launch(cb, sb, y, wb, None, out=z)
        for seed in (3, 4, 5):
            x.copy_((torch.rand(x.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) * 2 - 1))
            g.replay()
            torch.cuda.synchronize()
            _check(y, FAMILY.reference(sa, x, wa), f"{cid} first {sa.format()}", x.dtype)
            _check(z, FAMILY.reference(sb, y, wb), f"{cid} second {sb.format()} (seed {seed})", x.dtype)


def test_deterministic_reduction_is_bitwise_repeatable_and_m_above_16_refused():
    sig = FAMILY.make_signature("gemm_act", "bf16", 4096, 14336, "gelu", True)
    (x, w, b), _ = FAMILY.make_inputs(sig, 16, "cuda", seed=0)
    cfg = FAMILY.parse_config("dk16_n32x256_w4_s4_pdl")
    first = FAMILY.launch(cfg, sig, x, w, b).clone()
    for _ in range(5):
        assert torch.equal(FAMILY.launch(cfg, sig, x, w, b), first)
    (x17, _, _), _ = FAMILY.make_inputs(sig, 17, "cuda", seed=0)
    with pytest.raises(ValueError, match="M <= 16"):
        FAMILY.launch(cfg, sig, x17, w, b)
