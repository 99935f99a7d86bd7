"""The triton_decode lane's prefetch twins (`_pf{P}[_pdl]`, kernels_decode_pf.py) on the GPU: every
decode GEMM shape of the presets and the ANCHORS weights at M in {1, 4, 8, 16} against the fp32
reference with a poisoned output, inside a captured CUDA graph replayed twice (the counters and the
atomic workspace left zero); a chain of three PDL GEMMs in one graph, each reading the previous
one's output; a PDL GEMM whose *weight* is the previous PDL kernel's output (its prefetch runs
before that kernel ends: L2 coherence must give it the new bytes); the deterministic reduction
bitwise equal across runs and replays. About 40-60 s on an H200 (11 Triton compiles, then replays)."""
import pytest

torch = pytest.importorskip("torch")

from gemm_decode_checks import MS, SHAPES, check_bitwise_repeatable  # noqa: E402
from gemm_decode_checks import capture as _graph  # noqa: E402
from gemm_decode_checks import check as _check  # noqa: E402
from gemm_decode_checks import valid as _valid  # noqa: E402

from tunedb.families.gemm import FAMILY  # noqa: E402

pytestmark = pytest.mark.gpu

# split 8 with P = 2 (whole run at K=4096), one wave of fat CTAs (P = 8, normal priority), the atomic
# reduction, no PDL
CONFIGS = ("dk8_n32x256_w4_s2_pf2_pdl", "dk2_n64x256_w4_s2_pfn8_pdl", "dk8_n32x256_w4_s2_at_pf2_pdl",
           "dk4_n32x256_w4_s2_pf4")


@pytest.mark.parametrize("n,k", SHAPES)
def test_pf_configs_match_reference_in_a_graph(n, k):
    sigs = [FAMILY.make_signature("gemm", "bf16", n, k)]
    if (n, k) in ((4096, 4096), (512, 9728), (1536, 512)):
        sigs.append(FAMILY.make_signature("gemm_act", "fp16", n, k, "silu", True))
    ran = 0
    for sig in sigs:
        for m in MS:
            (x, w, b), _ = FAMILY.make_inputs(sig, m, "cuda", seed=m)
            ref = FAMILY.reference(sig, x, w, b)
            for cid in CONFIGS if sig.dt == "bf16" else CONFIGS[::3]:  # fp16: two binaries, not four
                if not _valid(cid, sig, m):
                    continue
                out = torch.empty((m, n), dtype=x.dtype, device="cuda")
                g = _graph(cid, sig, x, w, b, out)
                for _ in range(2):
                    out.fill_(float("nan"))
                    g.replay()
                    torch.cuda.synchronize()
                    _check(out, ref, f"{cid} {sig.format()} M={m}", x.dtype)
                ran += 1
    assert ran >= len(MS)  # K = 512: only the split-2 config fits (2 K tiles)


def _in_graph(calls):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    return g


def _fresh(t, seed):
    t.copy_(torch.rand(t.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) * 2 - 1)


def test_three_pdl_prefetch_gemms_chained_read_each_others_output():
    """z = C(B(A(x))), three different configs and weights, one graph; replayed on new x (C
    launches its dependents after its wait, A and B first)."""
    n, k = 14336, 4096
    sa, sb, sc = (FAMILY.make_signature("gemm", "bf16", n, k), FAMILY.make_signature("gemm", "bf16", k, n),
                  FAMILY.make_signature("gemm", "bf16", n, k))
    (x, wa, _), _ = FAMILY.make_inputs(sa, 8, "cuda", seed=1)
    (_, wb, _), _ = FAMILY.make_inputs(sb, 8, "cuda", seed=2)
    (_, wc, _), _ = FAMILY.make_inputs(sc, 8, "cuda", seed=3)
    ca, cb, cc = (FAMILY.parse_config(c) for c in (*CONFIGS[:2], "dk8_n32x256_w4_s2_at_pfw2_pdl"))
    y = torch.empty((8, n), dtype=x.dtype, device="cuda")
    z = torch.empty((8, k), dtype=x.dtype, device="cuda")
    u = torch.empty((8, n), dtype=x.dtype, device="cuda")
    g = _in_graph([lambda: FAMILY.launch(ca, sa, x, wa, None, out=y), lambda: FAMILY.launch(cb, sb, y, wb, None, out=z),
                   lambda: FAMILY.launch(cc, sc, z, wc, None, out=u)])
    for seed in (4, 5, 6):
        _fresh(x, seed)
        g.replay()
        torch.cuda.synchronize()
        _check(y, FAMILY.reference(sa, x, wa), f"A {ca.id}", x.dtype)
        _check(z, FAMILY.reference(sb, y, wb), f"B {cb.id} (seed {seed})", x.dtype)
        _check(u, FAMILY.reference(sc, z, wc), f"C {cc.id} (seed {seed})", x.dtype)


@pytest.mark.parametrize("cid", ["dk1_n16x256_w4_s2_pf4_pdl", "dk4_n16x256_w4_s2_pf1_pdl"])
def test_a_weight_written_by_the_previous_pdl_kernel_is_read_new(cid):
    """A (a `_pf_pdl` GEMM, launch_dependents at its start) writes y [16, 4096]; B's weight is y
    itself (N = 16 rows, K = 4096), so B prefetches its weight while A may still be writing it."""
    n, k = 4096, 4096
    sa, sb = FAMILY.make_signature("gemm", "bf16", n, k), FAMILY.make_signature("gemm", "bf16", 16, n)
    (x, wa, _), _ = FAMILY.make_inputs(sa, 16, "cuda", seed=1)
    (x2, _, _), _ = FAMILY.make_inputs(sb, 4, "cuda", seed=2)
    ca, cb = FAMILY.parse_config("dk8_n32x256_w4_s2_pf2_pdl"), FAMILY.parse_config(cid)
    assert _valid(cid, sb, 4)
    y = torch.empty((16, n), dtype=x.dtype, device="cuda")
    z = torch.empty((4, 16), dtype=x.dtype, device="cuda")
    g = _in_graph([lambda: FAMILY.launch(ca, sa, x, wa, None, out=y), lambda: FAMILY.launch(cb, sb, x2, y, None, out=z)])
    for seed in (3, 4, 5):
        _fresh(x, seed)
        g.replay()
        torch.cuda.synchronize()
        _check(z, FAMILY.reference(sb, x2, y), f"{cid} on the weight just written (seed {seed})", x.dtype)


@pytest.mark.parametrize("cid", ["dk16_n32x256_w4_s2_pf1_pdl", "dk4_n64x256_w8_s3_pf4_pdl"])
def test_pf_deterministic_reduction_is_bitwise_repeatable(cid):
    sig = FAMILY.make_signature("gemm_act", "bf16", 4096, 14336, "gelu", True)
    (x, w, b), _ = FAMILY.make_inputs(sig, 16, "cuda", seed=0)
    check_bitwise_repeatable(cid, sig, x, w, b)
