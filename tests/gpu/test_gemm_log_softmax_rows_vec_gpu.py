"""gemm_log_softmax's row pass with the divisibility hint (VEC) and the linear_rows PDL twins on
the GPU: the row pass over rounded logits against float64 within half an ulp of the output
(vocabularies that are multiples of 8 but not 16, such as 5000, where the hint turns 2-byte
accesses into 16-byte ones; an odd N where it cannot), the pdl twins, the persistent prefetching passes (`_p{P}`) and the rowfix lane with the
hint against the fp32 reference at the census heads (bf16 with bias, fp16 without) with rows of
exp(y) summing to 1 within the output rounding's bound, and the pdl twin inside a captured CUDA
graph of back-to-back calls on fresh inputs (its row pass waits on cuBLAS's GEMM). About 40-60 s
on an H200 (about 60 first-launch compiles)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm_log_softmax.launch import row_vec, rows_pass  # noqa: E402
from glsm_checks import rel, replays_on_fresh_inputs  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
FAM = families.get("gemm_log_softmax")
DTS = {"bf16": torch.bfloat16, "fp16": torch.float16}
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}  # unit roundoff: u|x| bounds half an ulp of x
PDL = ("lr_r1_c2048_w8_pdl", "lr_r1_c8192_w8_pdl", "lr_r1_c8192_w16_pdl", "lr_r1_c16384_w8_pdl",
       "lr_r1_c16384_w16_pdl")
STREAM = ("lr_r1_c8192_w8_p4", "lr_r4_c8192_w16_p2", "lr_r1_c16384_w8_p2", "lr_r1_c16384_w16_p1",
          "lr_r1_c32768_w16_p1", "lr_r1_c8192_w8_p4_pdl")
RF = ("rf_b64x32x128_w4_s3_pdl", "rf_b64x64x64_w4_s3_pdl", "rf_b64x128x64_w4_s3_pdl", "rf_b64x64x64_w4_s3_two")


# (M, N, dt): three compile classes (bf16 and fp16 at N % 16 != 0, bf16 at N % 16 == 0)
@pytest.mark.parametrize("m,n,dt", [(300, 5000, "bf16"), (2000, 5000, "bf16"), (37, 5000, "fp16"),
                                    (700, 16000, "bf16"), (9, 4099, "bf16"), (5, 1000, "fp16")])
def test_row_pass_against_float64(m, n, dt):
    dtype = DTS[dt]
    gen = torch.Generator(device="cuda").manual_seed(m + n)
    lg = (torch.randn((m, n), generator=gen, device="cuda") * 3).to(dtype)
    lg[:, 7] += 40  # one dominant logit a row: its lse is near it, the rest far below
    ref = torch.log_softmax(lg.double(), dim=-1)
    assert row_vec(n, lg) == (8 if n % 8 == 0 else 1)
    tol = UNIT[dtype] * ref.abs() + 1e-5  # the output's rounding (half an ulp) and fp32's few ulps
    for r, c, w, p in ((1, 2048, 8, None), (1, 8192, 8, None), (2, 8192, 8, None), (1, 16384, 16, None),
                       (1, 8192, 8, 4), (4, 8192, 16, 2), (1, 16384, 8, 2)):
        if p and c < n:
            continue  # a persistent pass holds whole rows
        for vec, pdl in ((None, False), (1, True)):  # the hint (where N allows it), and the old kernel under PDL
            y = torch.full_like(lg, float("nan"))
            rows_pass(lg, y, r, c, w, pdl=pdl, vec=vec, persist=p)
            err = (y.double() - ref).abs()
            assert not torch.isnan(y).any() and (err <= tol).all(), (r, c, w, p, vec, pdl, err.max().item())
        if p:  # in place: a block is stored only after it was read (and prefetches never cross programs)
            z = lg.clone()
            rows_pass(z, z, r, c, w, persist=p)
            assert ((z.double() - ref).abs() <= tol).all(), (r, c, w, p)


@pytest.mark.parametrize("m,n,k,dt,bias", [(64, 5000, 256, "bf16", 1), (256, 5000, 256, "bf16", 1),
                                           (1024, 5000, 256, "bf16", 1), (64, 32000, 512, "bf16", 1),
                                           (256, 16000, 512, "bf16", 1), (100, 5000, 256, "fp16", 0),
                                           (2048, 32000, 512, "bf16", 1), (4096, 5000, 256, "fp16", 0)])
def test_pdl_rows_and_rowfix_with_the_hint_against_fp32(m, n, k, dt, bias):
    sig = FAM.make_signature(n, k, dt, bias)
    args, _ = FAM.make_inputs(sig, m, "cuda", 1)
    ref = FAM.reference(sig, *args)
    base = rel(FAM.launch(FAM.parse_config("torch"), sig, *args), ref)
    allowed = (ref.exp() * torch.expm1(UNIT[DTS[dt]] * ref.abs())).sum(-1) + 1e-3
    ran = 0
    for cid in PDL + STREAM + (RF if n % 16 else ()):  # rowfix: where the hint changes its kernels
        cfg = FAM.parse_config(cid)
        if FAM.invalid_reason(cfg, sig, m, SM90):
            continue
        out = torch.full((m, n), float("nan"), dtype=DTS[dt], device="cuda")
        y = FAM.launch(cfg, sig, *args, out=out)
        assert y is out and not torch.isnan(y).any(), cid
        assert rel(y, ref) <= 4 * base, (cid, rel(y, ref), base)
        dev = (y.float().exp().sum(-1) - 1).abs()
        assert (dev <= allowed).all(), (cid, dev.max().item())
        ran += 1
    assert ran >= 3


@pytest.mark.parametrize("cid", ["lr_r1_c8192_w8_pdl", "lr_r1_c2048_w8_pdl", "lr_r1_c8192_w8_p4_pdl"])
def test_pdl_row_pass_in_a_captured_graph_on_fresh_inputs(cid):
    sig = FAM.make_signature(5000, 256, "bf16", 1)
    cfg = FAM.parse_config(cid)
    m = 256
    replays_on_fresh_inputs(cfg, sig, m, 5000, cid)  # its row pass waits on cuBLAS's GEMM (PDL)
