"""gemm_log_softmax's triton_rowfix lane (small M) on the CPU: its ids and its part of the family's
validity predicate, and its kernels under the Triton interpreter (fp16: the interpreter's tl.dot
mishandles bf16) against fp32, output NaN-poisoned first, ragged M and N tails, every launch mode
(two kernels, PDL, one persistent kernel with its grid barrier), partial statistics combined
over several steps, a barrier that times out writing NaN (never hanging), and the rows of
exp(y) summing to 1 within the output rounding's bound."""
from __future__ import annotations

import dataclasses
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.gemm_log_softmax import FAMILY, configs
from tunedb.families.gemm_log_softmax import configs_rowfix as rowfix

SM90 = shipped_profile("sm90")


def test_ids_round_trip_and_bad_ids():
    space = [c for c in FAMILY.config_space("sm90") if c.lane == rowfix.LANE]
    # the build space holds the two-launch modes only; the one-launch configs are the bench's
    assert {c.param("launch") for c in space} == {"two", "pdl"}
    research = rowfix.one_launch_grid()
    assert {rowfix.per_sm(c) for c in research} == {1, 2} and not set(research) & set(space)
    assert {c.param("launch") for c in space + list(research)} == set(rowfix.MODES)
    for c in space + list(research):
        assert FAMILY.parse_config(c.id) == c
    cfg = FAMILY.parse_config("rf_b64x64x64_w4_s3_one2")
    assert cfg.param("block") == (64, 64, 64) and rowfix.per_sm(cfg) == 2
    for bad in ("rf_b64x64x64_w4_s3", "rf_b64x64x64_w4_s3_one3", "rf_b48x64x64_w4_s3_two",
                "rf_b064x64x64_w4_s3_two", "rf_b64x64x64_w4_s3_pdl_x", "rf_b64x512x64_w4_s3_two"):
        with pytest.raises(ConfigError):
            FAMILY.parse_config(bad)


def test_validity_predicate_rowfix():
    sig = FAMILY.make_signature(32000, 512, "bf16", 1)
    ok = configs.parse("rf_b64x64x64_w4_s3_pdl")
    assert FAMILY.invalid_reason(ok, sig, 64, SM90) is None
    assert FAMILY.invalid_reason(ok, sig, 1024, SM90) is None
    # a small-M lane: not every M, not above 1024
    assert "M <= 1024" in FAMILY.invalid_reason(ok, sig, None, SM90)
    assert "M=2048" in FAMILY.invalid_reason(ok, sig, 2048, SM90)
    # a 256-row tile at M=64 computes mostly padding
    assert "BM=256" in FAMILY.invalid_reason(configs.parse("rf_b256x64x64_w8_s3_pdl"), sig, 64, SM90)
    # BK beyond K; accumulators beyond the register budget
    small_k = FAMILY.make_signature(32000, 40, "bf16", 0)
    assert "BK=128" in FAMILY.invalid_reason(configs.parse("rf_b64x32x128_w4_s3_pdl"), small_k, 64, SM90)
    assert "accumulators" in FAMILY.invalid_reason(rowfix.make(128, 256, 64, 4, 1, "two"), sig, 256, SM90)
    # PDL needs sm90
    sm80 = dataclasses.replace(SM90, arch_family="sm80")
    assert "sm90" in FAMILY.invalid_reason(ok, sig, 64, sm80)
    assert FAMILY.invalid_reason(configs.parse("rf_b64x64x64_w4_s3_two"), sig, 64, sm80) is None
    # one launch: two CTAs an SM must be resident at any register allocation (8 warps cannot)
    assert "registers" in FAMILY.invalid_reason(rowfix.make(128, 128, 64, 8, 3, "one2"), sig, 256, SM90)
    assert FAMILY.invalid_reason(rowfix.make(128, 128, 64, 8, 3, "one1"), sig, 256, SM90) is None
    small_smem = dataclasses.replace(SM90, smem_per_sm=100_000)
    assert "shared memory" in FAMILY.invalid_reason(configs.parse("rf_b64x32x128_w4_s3_one2"), sig, 64, small_smem)
    # every config of the lane is valid at the census' small M somewhere
    for c in FAMILY.config_space("sm90"):
        if c.lane == rowfix.LANE:
            assert FAMILY.invalid_reason(c, sig, 256, SM90) is None, c.id


def test_simplicity_orders_rowfix_with_the_one_gemm_fixups():
    rule = FAMILY.pick_rule()
    assert rule.pick({"torch": 1.0, "rf_b64x64x64_w4_s3_pdl": 0.97}).winner == "torch"
    assert rule.pick({"torch": 1.0, "rf_b64x64x64_w4_s3_pdl": 0.7}).winner == "rf_b64x64x64_w4_s3_pdl"
    assert rule.pick({"torch": 1.0, "rf_b64x64x64_w4_s3_pdl": 0.71, "lr_r1_c8192_w8": 0.70}).winner == "lr_r1_c8192_w8"


_INTERPRET = r"""
import torch
from tunedb.arch import shipped_profile
from tunedb.families.gemm_log_softmax import FAMILY, configs, launch_rowfix
from tunedb.families.gemm_log_softmax.launch import launch, make_inputs, reference
sm90 = shipped_profile("sm90")
IDS = ("rf_b16x32x32_w4_s2_two", "rf_b16x64x32_w4_s2_pdl", "rf_b32x32x32_w4_s2_one2", "rf_b16x128x32_w4_s1_one1")
# ragged M and N tails (N not a multiple of BN or of the fix-up's chunk; M not of BM), with and
# without bias; the partials read 16 at a time, so a row's T partials take several steps
launch_rowfix.stat_block = lambda t: 16
ran = set()
for n, k, m, bias in ((200, 40, 37, 1), (131, 24, 5, 0), (2500, 32, 19, 1)):
    sig = FAMILY.make_signature(n, k, "fp16", bias)
    args, _ = make_inputs(sig, m, "cpu", 1)
    ref = reference(*args)
    base = ((launch(configs.parse("torch"), sig, *args).float() - ref).norm() / ref.norm()).item()
    for cid in IDS:
        cfg = configs.parse(cid)
        if FAMILY.invalid_reason(cfg, sig, m, sm90):
            continue
        out = torch.full((m, n), float("nan"), dtype=torch.float16)
        y = launch(cfg, sig, *args, out=out)
        assert y is out and y.dtype == torch.float16
        assert not torch.isnan(y).any(), (cid, n, k, m)
        err = ((y.float() - ref).norm() / ref.norm()).item()
        assert err <= 4 * base + 1e-6, (cid, n, k, m, err, base)
        y2 = launch(cfg, sig, *args)  # no out: a fresh [.., N] tensor
        assert torch.equal(y2, out), cid
        ran.add(cid)
assert ran == set(IDS), ran
# the persistent kernel leaves its barrier counters zero for the next launch
assert all(int(c.abs().sum()) == 0 for c in launch_rowfix._COUNTERS.values()), launch_rowfix._COUNTERS
# a grid barrier that cannot complete (here: a counter left at -5, four polls allowed) does not
# hang: the output is NaN (loud; the gate refuses it) and the counters end zero again
sig = FAMILY.make_signature(200, 40, "fp16", 1)
args, _ = make_inputs(sig, 37, "cpu", 1)
launch_rowfix._COUNTERS[torch.device("cpu")] = torch.tensor([-5, 0], dtype=torch.int32)
launch_rowfix.MAX_SPINS = 4
y = launch(configs.parse("rf_b32x32x32_w4_s2_one2"), sig, *args)
assert torch.isnan(y).all(), y
assert int(launch_rowfix._COUNTERS[torch.device("cpu")].abs().sum()) == 0
launch_rowfix.MAX_SPINS = 1 << 14
# rows dominated by one logit of a few hundred: each row of exp(y) sums to 1 within the bound
# its fp16 rounding allows (the statistics are the rounded logits', as the subtraction's are)
gen = torch.Generator().manual_seed(0)
for n, k, m, bias in ((200, 40, 37, 1), (77, 16, 19, 1)):
    sig = FAMILY.make_signature(n, k, "fp16", bias)
    x = torch.randn(m, k, generator=gen).half()
    w = (torch.randn(n, k, generator=gen) * 3 * k ** -0.5).half()
    w[3] *= 40
    b = (torch.randn(n, generator=gen) * 0.5).half() if bias else None
    ref = reference(x, w, b)
    allowed = (ref.exp() * torch.expm1(2.0 ** -11 * ref.abs())).sum(-1) + 1e-3
    for cid in ("rf_b16x32x32_w4_s2_two", "rf_b16x64x32_w4_s2_one2"):
        dev = (launch(configs.parse(cid), sig, x, w, b).float().exp().sum(-1) - 1).abs()
        assert (dev <= allowed).all(), (cid, n, m, dev.max().item(), allowed.max().item())
# the measuring protocol's gate (NaN poison, second poison, tolerance) over the lane's modes
from interpret_child import gate_failures
bad = gate_failures(FAMILY, FAMILY.make_signature(150, 32, "fp16", 1), 20, ["torch", "rf_b16x32x32_w4_s2_two", "rf_b32x64x32_w4_s2_one2"])
assert not bad, bad
print("ok")
"""


@pytest.mark.slow
def test_rowfix_kernels_under_the_interpreter():
    res = interpret_child.snippet(_INTERPRET)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
