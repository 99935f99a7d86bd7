"""gemm_log_softmax's chunked_rows lane on the GPU: every config of the lane valid at a census
head (bf16 with bias at N = 5000 / 16000 / 32000; fp16 without bias) against the fp32 reference
within 4x the torch arm's error, rows of exp(y) summing to 1 within the output rounding's bound,
output NaN-poisoned first, at M with a short last chunk and at M <= R (one chunk); the one-stream,
PDL and two-stream variants inside a captured CUDA graph of back-to-back calls replayed on fresh
inputs (the two-stream graph forks each chunk's row pass onto the side stream and joins it);
a two-stream call from a non-default stream (the side stream waits on the caller's). About
30-50 s on an H200 (about 16 row-pass compiles: VEC, one or two sweeps, persistent, GDC)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb import families  # noqa: E402
from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.gemm_log_softmax import configs_chunks as chunks  # noqa: E402
from glsm_checks import rel, replays_on_fresh_inputs, torch_err  # noqa: E402

pytestmark = pytest.mark.gpu

SM90 = shipped_profile("sm90")
FAM = families.get("gemm_log_softmax")
DTS = {"bf16": torch.bfloat16, "fp16": torch.float16}
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}




# (M, N, K, dt, bias): short last chunks (2100 = 8 x 256 + 52; 1100; 1500), one chunk (200 <= R)
@pytest.mark.parametrize("m,n,k,dt,bias", [(2100, 5000, 256, "bf16", 1), (200, 5000, 256, "bf16", 1),
                                           (1500, 16000, 512, "bf16", 1), (1100, 32000, 512, "bf16", 1),
                                           (700, 16000, 512, "fp16", 0)])
def test_every_chunked_config_against_fp32(m, n, k, dt, bias):
    sig = FAM.make_signature(n, k, dt, bias)
    args, _ = FAM.make_inputs(sig, m, "cuda", m + n)
    ref = FAM.reference(sig, *args)
    base = torch_err(sig, args, ref)
    allowed = (ref.exp() * torch.expm1(UNIT[DTS[dt]] * ref.abs())).sum(-1) + 1e-3
    out = torch.empty((m, n), dtype=DTS[dt], device="cuda")
    ran = 0
    for cfg in chunks.grid():
        if FAM.invalid_reason(cfg, sig, m, SM90):
            continue
        out.fill_(float("nan"))
        y = FAM.launch(cfg, sig, *args, out=out)
        torch.cuda.synchronize()
        assert y is out and not torch.isnan(y).any(), cfg.id
        assert rel(y, ref) <= 4 * base, (cfg.id, rel(y, ref), base)
        dev = (y.float().exp().sum(-1) - 1).abs()
        assert (dev <= allowed).all(), (cfg.id, dev.max().item())
        ran += 1
    assert ran >= 12


@pytest.mark.parametrize("cid,n,k", [("lc_m256_st1_r1_c8192_w8", 16000, 512), ("lc_m256_st1_r1_c8192_w8_pdl", 16000, 512),
                                     ("lc_m256_st2_r1_c8192_w8", 16000, 512),
                                     ("lc_m512_st2_r1_c32768_w16_p1", 32000, 512),
                                     ("lc_m512_st1_r1_c32768_w16_p1_pdl", 32000, 512)])
def test_chunked_configs_in_a_captured_graph_on_fresh_inputs(cid, n, k):
    sig = FAM.make_signature(n, k, "bf16", 1)
    cfg = FAM.parse_config(cid)
    m = 1100  # several chunks and a short last one
    assert FAM.invalid_reason(cfg, sig, m, SM90) is None
    replays_on_fresh_inputs(cfg, sig, m, n, cid)  # the side stream is made by the warm-up, outside the capture


def test_two_streams_from_a_non_default_stream():
    sig = FAM.make_signature(16000, 512, "bf16", 1)
    cfg = FAM.parse_config("lc_m256_st2_r1_c8192_w8")
    m = 1300
    args, _ = FAM.make_inputs(sig, m, "cuda", 5)
    ref = FAM.reference(sig, *args)
    caller = torch.cuda.Stream()
    caller.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(caller):
        out = torch.full((m, 16000), float("nan"), dtype=torch.bfloat16, device="cuda")
        torch.cuda._sleep(50_000_000)  # the caller's stream is busy: a pass that did not wait on it reads NaN
        y = FAM.launch(cfg, sig, *args, out=out)
        y2 = y.clone()  # on the caller's stream: after the joined passes
    caller.synchronize()
    assert not torch.isnan(y2).any() and rel(y2, ref) <= 4 * torch_err(sig, args, ref)


def test_the_op_serves_a_host_bound_chunked_pick_eagerly_with_torch_and_captured_with_itself(tiers_dirs):
    """runtime.dispatch applies the family's eager_fallback: 64 chunks of 128 rows at M = 8192 are
    host-bound eagerly at any launch cost above 3 us (torch serves), and the chunked config serves
    the capture (its first run: the row pass compiles inside the capture); both match fp32.
    About 5-10 s."""
    from tunedb import database
    from tunedb.families.gemm_log_softmax.ops import gemm_log_softmax
    from tunedb.records import Entry, Region
    from tunedb.runtime import dispatch, selector

    sig = FAM.make_signature(16000, 512, "bf16", 1)
    cfg = FAM.parse_config("lc_m128_st1_r1_c8192_w8")
    database.write_entries("user", FAM.name, "sm90", [Entry(sig, (Region(None, cfg.id),))], [cfg])
    selector.reload()
    assert FAM.eager_fallback(sig, 8192, cfg, selector.current_arch()[1]) == "torch"
    args, _ = FAM.make_inputs(sig, 8192, "cuda", 3)
    ref = FAM.reference(sig, *args)
    eager = gemm_log_softmax(*args)
    b = dispatch.bound(FAM.name, "gemm_log_softmax", *args)
    assert (b.tier, b.config.id, b.eager) == ("user", cfg.id, "torch")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = gemm_log_softmax(*args)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(eager, FAM.launch(FAM.parse_config("torch"), sig, *args))
    assert torch.equal(captured, FAM.launch(cfg, sig, *args))
    assert rel(captured, ref) <= 4 * torch_err(sig, args, ref)
