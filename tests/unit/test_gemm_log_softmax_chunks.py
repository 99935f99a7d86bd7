"""gemm_log_softmax's chunked_rows lane on the CPU: its ids and its part of the family's validity
predicate (a chunk's logits within L2's share, the row pass's own rules, PDL on one stream and on
sm90 only, every M valid so the table's regions have no holes), its place in the space, the
compile set and the pick rule; and its launch through the family under the Triton interpreter
(fp16: the interpreter's tl.dot mishandles bf16) against fp32 with ragged last chunks, one and
two streams (two run as one where there is no CUDA, touching no CUDA API), the measuring
protocol's gate over it."""
from __future__ import annotations

import dataclasses
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.gemm_log_softmax import FAMILY, configs
from tunedb.families.gemm_log_softmax import configs_chunks as chunks

SM90 = shipped_profile("sm90")


def test_ids_round_trip_and_bad_ids():
    space = [c for c in FAMILY.config_space("sm90") if c.lane == chunks.LANE]
    assert len(space) == len(chunks.grid()) == 36
    assert FAMILY.config_space("sm90", lanes=[chunks.LANE]) == tuple(space)
    for c in space:
        assert FAMILY.parse_config(c.id) == c
    cfg = FAMILY.parse_config("lc_m512_st2_r1_c32768_w16_p1")
    assert (cfg.param("chunk_rows"), cfg.param("streams"), cfg.param("rows"), cfg.param("chunk"),
            cfg.param("warps"), cfg.param("persist"), cfg.param("launch")) == (512, 2, 1, 32768, 16, 1, None)
    pdl = FAMILY.parse_config("lc_m256_st1_r1_c8192_w8_pdl")
    assert pdl.param("launch") == "pdl" and chunks.row_pass(pdl).id == "lr_r1_c8192_w8_pdl"
    assert {(c.param("streams"), c.param("launch")) for c in space} == {(1, None), (1, "pdl"), (2, None)}
    with pytest.raises(ConfigError, match="R=300"):
        FAMILY.parse_config("lc_m300_st1_r1_c8192_w8")
    with pytest.raises(ConfigError, match="st=3"):
        FAMILY.parse_config("lc_m512_st3_r1_c8192_w8")
    with pytest.raises(ConfigError, match="one stream"):
        FAMILY.parse_config("lc_m512_st2_r1_c8192_w8_pdl")
    with pytest.raises(ConfigError, match="C=5000"):  # the row pass's own grammar
        FAMILY.parse_config("lc_m512_st1_r1_c5000_w8")
    for bad in ("lc_m512_r1_c8192_w8", "lc_m0512_st1_r1_c8192_w8", "lc_m512_st1_lr_r1_c8192_w8", "lc_m512_st1"):
        with pytest.raises(ConfigError):
            FAMILY.parse_config(bad)


def test_validity_predicate_chunks():
    sig = {n: FAMILY.make_signature(n, k, "bf16", 1) for n, k in ((5000, 256), (16000, 512), (32000, 512))}
    p = FAMILY.parse_config
    # the chunk's logits within 0.55 of the 60 MiB L2: R <= 512 at N = 32000, 1024 at 16000, 2048 at 5000
    assert FAMILY.invalid_reason(p("lc_m512_st2_r1_c32768_w16_p1"), sig[32000], 8192, SM90) is None
    why = FAMILY.invalid_reason(p("lc_m1024_st2_r1_c32768_w16_p1"), sig[32000], 8192, SM90)
    assert "1024 rows x N=32000" in why and "L2" in why
    assert FAMILY.invalid_reason(p("lc_m1024_st1_r1_c16384_w16"), sig[16000], 8192, SM90) is None
    assert "L2" in FAMILY.invalid_reason(p("lc_m2048_st1_r1_c16384_w16"), sig[16000], 8192, SM90)
    assert FAMILY.invalid_reason(p("lc_m2048_st1_r1_c8192_w8"), sig[5000], 8192, SM90) is None
    small_l2 = dataclasses.replace(SM90, l2_bytes=20 << 20)
    assert "L2" in FAMILY.invalid_reason(p("lc_m512_st1_r1_c8192_w8"), sig[16000], 8192, small_l2)
    # M <= R is valid (one chunk): a region measured at a larger M serves it without a hole
    for m in (None, 1, 64, 256, 512, 513):
        assert FAMILY.invalid_reason(p("lc_m512_st2_r1_c8192_w8"), sig[16000], m, SM90) is None, m
    # the row pass's own rules: a chunk of columns beyond the row; a persistent pass holds whole rows;
    # R rows a program need that many rows (of the chunk)
    assert "C=16384" in FAMILY.invalid_reason(p("lc_m512_st1_r1_c16384_w16"), sig[5000], 4096, SM90)
    assert "whole rows" in FAMILY.invalid_reason(p("lc_m256_st1_r1_c16384_w8_p2"), sig[32000], 4096, SM90)
    assert "R=4" in FAMILY.invalid_reason(chunks.make(256, 1, 4, 8192, 16), sig[5000], 3, SM90)
    # PDL needs sm90; the plain twin does not
    sm80 = dataclasses.replace(SM90, arch_family="sm80")
    assert "sm90" in FAMILY.invalid_reason(p("lc_m512_st1_r1_c8192_w8_pdl"), sig[16000], 4096, sm80)
    assert FAMILY.invalid_reason(p("lc_m512_st2_r1_c8192_w8"), sig[16000], 4096, sm80) is None
    # the census: 12 configs at N = 5000, 18 at 16000 and 32000, at every M
    for n, want in ((5000, 12), (16000, 18), (32000, 18)):
        for m in (64, 256, 1024, 4096, 8192):
            got = [c for c in chunks.grid() if FAMILY.invalid_reason(c, sig[n], m, SM90) is None]
            assert len(got) == want, (n, m, len(got))


def test_compile_set_and_pick_rule():
    ids = ("lc_m512_st2_r1_c8192_w8", "lc_m256_st1_r1_c32768_w16_p1_pdl", "lc_bogus")
    got = {c.id for c in FAMILY.compile_set("sm90", ids)}
    assert {"lc_m512_st2_r1_c8192_w8", "lc_m256_st1_r1_c32768_w16_p1_pdl", "torch", "default"} <= got
    assert "lc_bogus" not in got
    assert configs.simplicity("lc_m512_st2_r1_c8192_w8") == configs.simplicity("rf_b64x64x64_w4_s3_pdl") == 2
    rule = FAMILY.pick_rule()
    # within noise the one-launch-pair linear_rows arm is kept over a chunked one
    assert rule.pick({"torch": 1.0, "lr_r1_c8192_w8": 0.80, "lc_m512_st2_r1_c8192_w8": 0.795}).winner == "lr_r1_c8192_w8"
    assert rule.pick({"torch": 1.0, "lr_r1_c8192_w8": 0.80, "lc_m512_st2_r1_c8192_w8": 0.70}).winner == \
        "lc_m512_st2_r1_c8192_w8"


def test_eager_fallback_where_the_chunks_launches_outrun_torch():
    sig = FAMILY.make_signature(16000, 512, "bf16", 1)
    p = FAMILY.parse_config
    # one chunk (M <= R), on either stream setting: torch's own two launches; it serves
    assert FAMILY.eager_fallback(sig, 64, p("lc_m256_st2_r1_c8192_w8"), SM90) is None
    assert FAMILY.eager_fallback(sig, 256, p("lc_m256_st1_r1_c8192_w8"), SM90) is None
    # 32 chunks of 256 rows at M = 8192: 64 launches, ~460 us of host issue > torch's ~350 us floor
    assert FAMILY.eager_fallback(sig, 8192, p("lc_m256_st1_r1_c8192_w8"), SM90) == "torch"
    # 8 chunks of 1024 on two streams: 32 host calls, ~230 us, under it
    assert FAMILY.eager_fallback(sig, 8192, p("lc_m1024_st2_r1_c8192_w8"), SM90) is None
    # four chunks at M = 1024: torch's floor is ~45 us; 8 launches (~58 us) outrun it
    assert FAMILY.eager_fallback(sig, 1024, p("lc_m256_st1_r1_c8192_w8"), SM90) == "torch"
    # other lanes are never flagged
    assert FAMILY.eager_fallback(sig, 8192, p("lr_r1_c8192_w8"), SM90) is None
    assert FAMILY.eager_fallback(sig, 8192, p("torch"), SM90) is None


_INTERPRET = r"""
import torch
from tunedb.arch import shipped_profile
from tunedb.families.gemm_log_softmax import FAMILY, configs_chunks as chunks
from tunedb.families.gemm_log_softmax.launch import launch, make_inputs, reference
sm90 = shipped_profile("sm90")
# no CUDA here: a two-stream config must run as one stream without touching a CUDA stream API
def boom(*a, **k):
    raise AssertionError("a CUDA stream API was called on CPU tensors")
torch.cuda.Stream = torch.cuda.current_stream = torch.cuda.stream = boom
# small row passes (the grammar's smallest chunks) so the interpreter runs quickly; R = 128
# rows a chunk with M = 260: three chunks, the last 4 rows
IDS = [chunks.make(128, s, r, c, w, pdl=pdl, persist=pp)
       for s, r, c, w, pdl, pp in ((1, 1, 1024, 4, False, None), (2, 2, 1024, 4, False, None),
                                   (1, 2, 1024, 4, True, None), (2, 1, 1024, 4, False, 2))]
ran = 0
for n, k, m, bias in ((300, 16, 260, 1), (1500, 16, 130, 0)):
    sig = FAMILY.make_signature(n, k, "fp16", bias)
    args, _ = make_inputs(sig, m, "cpu", 1)
    ref = reference(*args)
    base = ((launch(FAMILY.parse_config("torch"), sig, *args).float() - ref).norm() / ref.norm()).item()
    for cfg in IDS:
        if cfg.param("persist") and cfg.param("chunk") < n:
            continue  # a persistent pass holds whole rows
        out = torch.full((m, n), float("nan"), dtype=torch.float16)
        y = launch(cfg, sig, *args, out=out)
        assert y is out and not torch.isnan(y).any(), (cfg.id, n, m)
        err = ((y.float() - ref).norm() / ref.norm()).item()
        assert err <= 4 * base + 1e-6, (cfg.id, n, k, m, err, base)
        ran += 1
assert ran == 7, ran
cfg, sig = IDS[1], FAMILY.make_signature(300, 16, "fp16", 1)
args, _ = make_inputs(sig, 260, "cpu", 1)
y2 = launch(cfg, sig, args[0].view(2, 130, 16), *args[1:])  # leading dims, no out
assert y2.shape == (2, 130, 300) and torch.equal(y2.view(260, 300), launch(cfg, sig, *args)), cfg.id
from interpret_child import gate_failures
bad = gate_failures(FAMILY, sig, 260, ["torch", IDS[1].id])
assert not bad, bad
print("ok")
"""


@pytest.mark.slow
def test_chunked_lane_under_the_interpreter():
    res = interpret_child.snippet(_INTERPRET, timeout=600)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
