"""gemm_log_softmax's split_rows lane (cuBLAS's logits, then rows split into column chunks: a
statistics pass and the rowfix fix-up) on the CPU: its ids and its part of the family's validity
predicate, its place in the pick rule and the eager rule, and its kernels under the Triton
interpreter against fp32 (output NaN-poisoned first, ragged N tails, with and without bias, a
row's partials combined over several steps, every row of exp(y) summing to 1 within the output
rounding's bound, the measuring protocol's gate)."""
from __future__ import annotations

import dataclasses
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.arch import shipped_profile
from tunedb.errors import ConfigError
from tunedb.families.gemm_log_softmax import FAMILY, configs
from tunedb.families.gemm_log_softmax import configs_split as split

SM90 = shipped_profile("sm90")


def test_ids_round_trip_and_bad_ids():
    space = [c for c in FAMILY.config_space("sm90") if c.lane == split.LANE]
    assert {c.param("chunk") for c in space} == set(split.CHUNKS)
    assert {c.param("launch", "plain") for c in space} == {"plain", "pdl"}
    for c in space:
        assert FAMILY.parse_config(c.id) == c
    cfg = FAMILY.parse_config("ls_c4096_w8_pdl")
    assert (cfg.lane, cfg.param("chunk"), cfg.param("warps"), cfg.param("launch")) == (split.LANE, 4096, 8, "pdl")
    for bad in ("ls_c4096", "ls_c3000_w4", "ls_c4096_w16", "ls_c04096_w4", "ls_c4096_w4_pdl_x", "ls_c4096_w4_two"):
        with pytest.raises(ConfigError):
            FAMILY.parse_config(bad)
    with pytest.raises(ConfigError, match="C=3000 not allowed"):
        split.make(3000, 4)


def test_validity_predicate_split():
    sig = FAMILY.make_signature(16000, 512, "bf16", 1)
    ok = configs.parse("ls_c2048_w4_pdl")
    for m in (None, 1, 64, 256, 8192):  # any M: the passes are row-parallel
        assert FAMILY.invalid_reason(ok, sig, m, SM90) is None
    # a chunk past the row rounded up to a power of two would load mostly padding
    short = FAMILY.make_signature(1500, 256, "bf16", 1)
    assert "C=4096 exceeds N=1500" in FAMILY.invalid_reason(configs.parse("ls_c4096_w4"), short, 64, SM90)
    assert FAMILY.invalid_reason(configs.parse("ls_c2048_w4"), short, 64, SM90) is None
    # too many chunks a row for the fix-up's partial reads; too many values a thread
    wide = FAMILY.make_signature(2_000_000, 64, "bf16", 0)
    assert "chunks" in FAMILY.invalid_reason(configs.parse("ls_c1024_w4"), wide, 8, SM90)
    assert "values per thread" in split.reason(dataclasses.replace(ok, params=(("chunk", 16384), ("warps", 4))),
                                               sig.get("N"), SM90, lambda c, a: None)
    # PDL needs sm90; the plain twin runs anywhere
    sm80 = dataclasses.replace(SM90, arch_family="sm80")
    assert "sm90" in FAMILY.invalid_reason(ok, sig, 64, sm80)
    assert FAMILY.invalid_reason(configs.parse("ls_c2048_w4"), sig, 64, sm80) is None


def test_pick_rule_and_eager_rule():
    rule = FAMILY.pick_rule()
    # as simple as the rowfix lane: a row pass of one launch wins a tie with it
    assert rule.pick({"torch": 1.0, "ls_c2048_w4": 0.97}).winner == "torch"
    assert rule.pick({"torch": 1.0, "ls_c2048_w4": 0.7}).winner == "ls_c2048_w4"
    assert rule.pick({"torch": 1.0, "ls_c2048_w4": 0.71, "lr_r1_c8192_w8": 0.70}).winner == "lr_r1_c8192_w8"
    # eagerly, three launches lose to torch's two where its kernels are short; a long call keeps the arm
    sig = FAMILY.make_signature(16000, 512, "bf16", 1)
    cfg = configs.parse("ls_c2048_w4")
    assert FAMILY.eager_fallback(sig, 256, cfg, SM90) == "torch"
    assert FAMILY.eager_fallback(sig, 8192, cfg, SM90) is None
    assert FAMILY.eager_fallback(sig, 256, configs.parse("lr_r1_c16384_w16"), SM90) is None


_INTERPRET = r"""
import torch
from tunedb.arch import shipped_profile
from tunedb.families.gemm_log_softmax import FAMILY, configs, launch_rowfix
from tunedb.families.gemm_log_softmax.launch import launch, make_inputs, reference
sm90 = shipped_profile("sm90")
IDS = ("ls_c1024_w4", "ls_c1024_w8_pdl", "ls_c2048_w4")
# ragged N tails (N not a multiple of the chunk), with and without bias; a row's partials read
# two at a time, so the fix-up combines them over several steps
launch_rowfix.stat_block = lambda t: 2
ran = set()
for n, k, m, bias in ((2500, 40, 7, 1), (1031, 24, 5, 0), (3000, 32, 3, 1)):
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
# rows dominated by one logit of a few hundred: each row of exp(y) sums to 1 within the bound
# its fp16 rounding allows (the statistics are the rounded logits', as torch's are)
gen = torch.Generator().manual_seed(0)
for n, k, m, bias in ((2100, 40, 5, 1), (1100, 16, 3, 0)):
    sig = FAMILY.make_signature(n, k, "fp16", bias)
    x = torch.randn(m, k, generator=gen).half()
    w = (torch.randn(n, k, generator=gen) * 3 * k ** -0.5).half()
    w[3] *= 40
    b = (torch.randn(n, generator=gen) * 0.5).half() if bias else None
    ref = reference(x, w, b)
    allowed = (ref.exp() * torch.expm1(2.0 ** -11 * ref.abs())).sum(-1) + 1e-3
    dev = (launch(configs.parse("ls_c1024_w4"), sig, x, w, b).float().exp().sum(-1) - 1).abs()
    assert (dev <= allowed).all(), (n, m, dev.max().item(), allowed.max().item())
# an empty batch: no launch, an empty output
sig = FAMILY.make_signature(2500, 40, "fp16", 1)
args, _ = make_inputs(sig, 1, "cpu", 1)
empty = launch(configs.parse("ls_c1024_w4"), sig, args[0][:0], *args[1:])
assert empty.shape == (0, 2500), empty.shape
# the measuring protocol's gate (NaN poison, second poison, tolerance)
from interpret_child import gate_failures
bad = gate_failures(FAMILY, FAMILY.make_signature(1500, 32, "fp16", 1), 6, ["torch", "ls_c1024_w4"])
assert not bad, bad
print("ok")
"""


@pytest.mark.slow
def test_split_kernels_under_the_interpreter():
    res = interpret_child.snippet(_INTERPRET)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]
