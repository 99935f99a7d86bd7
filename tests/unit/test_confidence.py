"""The GEMM model tier's confidence (issue 18): regimes, LOSO error bands, the serving rule, the
params round trip, and held-out regret on a recorded H200 log."""
from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import pytest

from tunedb.arch import shipped_profile
from tunedb.families import get as get_family
from tunedb.families.gemm import calibration, confidence
from tunedb.families.gemm.costmodel import ModelParams, make_decider, predict
from tunedb.records import Config, Measurement, Signature, Status

ARCH = shipped_profile("sm90")
FAMILY = get_family("gemm")
TORCH = Config.sentinel("torch")
ROOT = Path(__file__).resolve().parents[2]


def cfg(bm: int, bn: int, bk: int, w: int = 4, s: int = 3, lane: str = "triton_mma") -> Config:
    return Config(f"b{bm}x{bn}x{bk}_w{w}_s{s}", lane, (("block", (bm, bn, bk)), ("warps", w), ("stages", s)))


def sig(n: int, k: int) -> Signature:
    return Signature.make("gemm", "gemm", "half", N=n, K=k)


def test_regimes_split_lane_m_range_and_intensity():
    keys = confidence.regimes("triton_splitk", 1, 19000, 3600)
    assert keys[0] == "triton_splitk|m1|ai<16"
    assert keys[-1] == "*|*|*"
    assert confidence.m_range(16) == "m2-16" and confidence.m_range(17) == "m17-128"
    assert confidence.m_range(1025) == "m1025+"
    assert confidence.ai_bucket(4096, 4096, 4096) == "ai128+"


def _ranked(t_cfg: float, t_torch: float, c: Config) -> list[tuple[Config, float]]:
    return sorted([(c, t_cfg), (TORCH, t_torch)], key=lambda x: x[1])


def test_rule_serves_the_fallback_inside_the_band_and_the_config_outside():
    c = cfg(64, 64, 64)
    shape = (8, 4096, 4096, 2)
    band = {k: (math.log(1.10), 50) for k in confidence.regimes(c.lane, *shape)}
    inside = confidence.serve(_ranked(1.0, 1.08, c), "torch", band, shape)  # +8% < 10% band
    assert inside.config.id == "torch" and inside.declined and inside.best == c
    outside = confidence.serve(_ranked(1.0, 1.20, c), "torch", band, shape)  # +20% > 10% band
    assert outside.config == c and not outside.declined
    assert "+20% predicted, error band 10%, n=50" in outside.describe()
    # predicted slower than torch: torch serves, and that is no decline
    slower = confidence.serve(_ranked(1.2, 1.0, c), "torch", band, shape)
    assert slower.config.id == "torch" and not slower.declined


def test_rule_declines_a_regime_with_too_few_samples_and_a_model_without_bands():
    c = cfg(64, 64, 64)
    shape = (8, 4096, 4096, 2)
    sparse = {k: (0.0, confidence.MIN_SAMPLES - 1) for k in confidence.regimes(c.lane, *shape)}
    d = confidence.serve(_ranked(1.0, 3.0, c), "torch", sparse, shape)
    assert d.config.id == "torch" and d.declined and d.band is None
    assert confidence.serve(_ranked(1.0, 3.0, c), "torch", {}, shape).config.id == "torch"
    # a sparse fine regime reads through a coarser one that has the samples
    merged = {**sparse, "*|*|*": (0.05, 500)}
    d = confidence.serve(_ranked(1.0, 3.0, c), "torch", merged, shape)
    assert d.config == c and d.regime == "*|*|*"
    # without the fallback among the candidates the fastest serves: nothing to fall back to
    assert confidence.serve([(c, 1.0)], "torch", {}, shape).config == c


def test_rule_declines_a_shape_outside_its_regimes_support():
    c = cfg(64, 128, 128, lane="triton_tma")
    # the band was measured at M=1500 on (N, K) = (1280, 1280), (5120, 1280), (1280, 5120)
    rows = [("triton_tma", 1500, n, k, 2, 0.0) for n, k in ((1280, 1280), (5120, 1280), (1280, 5120))]
    band = {k: (0.05, 50) for k in confidence.regimes(c.lane, 1500, 1280, 1280)}
    support = confidence.supports(rows)
    assert support["triton_tma|m1025+|ai128+"][0] == pytest.approx(
        (math.log2(1500), math.log2(1280), math.log2(1280)), abs=1e-3)
    small = (1500, 512, 512, 2)  # N and K 2.5x below every measured point
    d = confidence.serve(_ranked(1.0, 2.0, c), "torch", band, small, support=support)
    assert d.config.id == "torch" and d.declined and d.outside
    assert "no shape its error band triton_tma|m1025+|ai128+ was measured on lies within a factor 2" in d.describe()
    # within a factor 2 of a measured point in M, N and K the band decides as before
    d = confidence.serve(_ranked(1.0, 2.0, c), "torch", band, (2500, 2048, 1024, 2), support=support)
    assert d.config == c and not d.outside
    # per axis the point lies inside the measured ranges (M 1500, N 1280-5120, K 1280-5120), but
    # no measured point is near it in all three at once: N and K both large was never measured
    d = confidence.serve(_ranked(1.0, 2.0, c), "torch", band, (1500, 5120, 5120, 2), support=support)
    assert d.config.id == "torch" and d.outside
    # an M range of its own: M=100 is 15x below the measured M even where N and K match
    d = confidence.serve(_ranked(1.0, 2.0, c), "torch", {"*|*|*": (0.05, 50)}, (100, 1280, 1280, 2),
                         support=support)
    assert d.config.id == "torch" and d.outside
    # hand-made params without a support (None) are not checked; an empty support declines all
    assert confidence.serve(_ranked(1.0, 2.0, c), "torch", band, small).config == c
    assert confidence.serve(_ranked(1.0, 2.0, c), "torch", band, small, support={}).config.id == "torch"


def test_rule_serves_only_when_the_gains_lower_bound_clears_the_margin():
    """The band is subtracted from the predicted gain: +20% predicted with a 10% band is a gain
    of at least about 9%, which clears a 5% margin; +14% is at least about 3.6%, which does not,
    although it exceeds the band and the margin each on its own (the rule before)."""
    c = cfg(64, 64, 64)
    shape = (8, 4096, 4096, 2)
    band = {k: (math.log(1.10), 50) for k in confidence.regimes(c.lane, *shape)}
    assert confidence.serve(_ranked(1.0, 1.20, c), "torch", band, shape, margin=0.05).config == c
    d = confidence.serve(_ranked(1.0, 1.14, c), "torch", band, shape, margin=0.05)
    assert d.config.id == "torch" and d.declined


def test_quantile_bound_is_an_order_statistic_that_needs_enough_samples():
    # with q = 0.9 and 90% confidence the largest of n values bounds the quantile once
    # 1 - 0.9^n >= 0.9: n >= 22, the regime's minimum sample count
    assert confidence.MIN_SAMPLES == 22
    assert confidence.quantile_bound(list(range(21))) is None
    assert confidence.quantile_bound(list(range(22))) == 21
    # with more samples a lower order statistic suffices, but never below the sample quantile
    xs = [float(i) for i in range(200)]
    bound = confidence.quantile_bound(xs)
    assert 0.9 * 199 <= bound < 199
    # thousands of residuals (every config of a build): no underflow, the bound nears the quantile
    assert 0.9 * 4999 <= confidence.quantile_bound([float(i) for i in range(5000)]) < 0.92 * 4999
    # one heavy tail value among many small ones widens the band of a small regime to it
    tail = [0.01] * 25 + [1.2]
    assert confidence.quantile_bound(tail) == 1.2
    assert confidence.bands([("triton_mma", 8, 4096, 4096, 2, r) for r in tail])["*|*|*"] == (1.2, 26)
    # a sparse regime stores its largest residual and its count (band_for skips it)
    assert confidence.bands([("triton_mma", 8, 4096, 4096, 2, r) for r in (0.1, 0.3)])["*|*|*"] == (0.3, 2)


def test_a_separate_activation_is_a_regime_of_its_own():
    """Where torch runs the activation as a second kernel, the speedup over it is another
    quantity: residuals of such signatures never set a plain GEMM's band or support, nor the
    reverse, at any level."""
    assert confidence.epilogue_kind("silu") == confidence.ACT and confidence.epilogue_kind("none") == ""
    keys = confidence.regimes("triton_mma" + confidence.ACT, 42, 2048, 512)
    assert keys[-1] == "*+act|*|*" and all("+act" in k for k in keys)
    # the act twin measured near the point, with small residuals; the plain GEMM nowhere near it
    rows = [("triton_mma" + confidence.ACT, 42, 2048, 512, 2, 0.0)] * 30
    unc, sup = confidence.bands(rows), confidence.supports(rows)
    c = cfg(64, 32, 128)
    shape = (42, 1536, 512, 2)
    act = confidence.serve(_ranked(1.0, 2.0, c), "torch", unc, shape, support=sup, epilogue=confidence.ACT)
    assert act.config == c and act.regime.startswith("triton_mma+act|m17-128|")
    plain = confidence.serve(_ranked(1.0, 2.0, c), "torch", unc, shape, support=sup)
    assert plain.config.id == "torch" and plain.declined and plain.band is None


def test_related_groups_link_signatures_that_share_a_hidden_size():
    a, b, c, d = sig(512, 2048), sig(2048, 512), sig(1536, 512), sig(4096, 14336)
    groups = calibration.related_groups([a, b, c, d])
    assert groups[a] == groups[b] == groups[c] != groups[d]


def test_decider_and_model_pick_use_the_rule():
    s = sig(4096, 4096)
    c = cfg(64, 64, 64)
    t_c, t_t = predict(c, (s, 8), ARCH), predict(TORCH, (s, 8), ARCH)
    gain = math.log(t_t / t_c)
    keys = confidence.regimes(c.lane, 8, 4096, 4096)
    wide = ModelParams(uncertainty={k: (abs(gain) + 0.5, 100) for k in keys})
    narrow = ModelParams(uncertainty={k: (0.0, 100) for k in keys}, torch_margin=0.0)
    assert make_decider(ARCH, wide, None)(s, 8, (c, TORCH)).config.id == "torch"
    want = c.id if gain > 0 else "torch"
    assert make_decider(ARCH, narrow, None)(s, 8, (c, TORCH)).config.id == want
    assert FAMILY.cost_model(ARCH, wide.to_json()).pick(s, 8, (c, TORCH)).id == "torch"


def test_params_round_trip_with_bands_and_merge_keeps_the_wider():
    p = ModelParams(uncertainty={"triton_mma|m1|ai<16": (0.3, 40), "*|*|*": (0.2, 900)}, fitted_on=10,
                    support={"*|*|*": ((0.0, 12.0, 12.0), (3.0, 11.0, 13.0))})
    assert ModelParams.from_json(p.to_json()) == p
    q = ModelParams(uncertainty={"triton_mma|m1|ai<16": (0.1, 10), "x|*|*": (0.5, 5)}, fitted_on=10)
    merged = calibration.merge(p, q).uncertainty
    pa, pb, pc = (1.0, 2.0, 3.0), (0.5, 1.5, 2.0), (3.0, 4.0, 5.0)
    assert calibration.merge(ModelParams(support={"a": (pa,)}, fitted_on=1),
                             ModelParams(support={"a": (pb,), "b": (pc,)}, fitted_on=1)).support == \
        {"a": (pb, pa), "b": (pc,)}
    assert merged["triton_mma|m1|ai<16"] == (0.3, 50) and merged["x|*|*"] == (0.5, 5)
    # bands written with the earlier [min, max] work-range support, or none: the tier declines
    old = {**p.to_json(), "support": {"*|*|*": [20.0, 31.5]}}
    assert ModelParams.from_json(old).uncertainty == {}
    assert ModelParams.from_json({k: v for k, v in p.to_json().items() if k != "support"}).uncertainty == {}


def _meas(s: Signature, m: int, cid: str, ms: float) -> Measurement:
    return Measurement(signature=s, m=m, config_id=cid, status=Status.OK, median_ms=ms)


def test_loso_residuals_and_quantile_on_a_synthetic_log():
    """Fake timer logs: three signatures whose measured times are the model's own prediction
    except one config at one signature, measured 2x slower than predicted. Left out, each
    signature is scored by a model fitted on the other two; the slow config's residual is the
    log-2 over-prediction, everything else near zero, so the upper quantile of its regime grows."""
    configs = {c.id: c for c in (cfg(64, 64, 64), cfg(128, 128, 64, w=8), cfg(64, 128, 64))}
    rows = []
    sigs = (sig(4096, 4096), sig(2048, 8192), sig(8192, 2048))
    for i, s in enumerate(sigs):
        for m in (1024, 2048, 4096, 8192):
            rows.append(_meas(s, m, "torch", predict(TORCH, (s, m), ARCH)))
            for cid, c in configs.items():
                slow = 2.0 if (i == 0 and cid == "b64x64x64_w4_s3") else 1.0
                rows.append(_meas(s, m, cid, slow * predict(c, (s, m), ARCH)))
    seen: list[int] = []

    def fitter(train, cfgs, arch):
        seen.append(len({r.signature for r in train}))
        return ModelParams()  # the structure itself: the residuals are then exactly known

    top: list = []
    res = calibration.loso_residuals(rows, configs, ARCH, fitter=fitter, picked=top)
    assert len(top) == 3 * 4 and all(t in res for t in top)  # one per point: its predicted-fastest config
    assert seen == [2, 2, 2]  # one fit per held-out signature, never on itself
    # held out by group: one fit per group, on the other group's signatures only
    seen.clear()
    grouped = calibration.loso_residuals(rows, configs, ARCH, fitter=fitter,
                                         group_of=lambda s: s == sigs[0])
    assert sorted(seen) == [1, 2] and len(grouped) == len(res)
    assert len(res) == 3 * 4 * 3
    big = [r for lane, m, n, k, e, r in res if abs(r) > 1e-9]
    assert len(big) == 4 and all(r == pytest.approx(math.log(2.0)) for r in big)
    bands = confidence.bands(res)
    assert bands["*|*|*"][1] == 36
    # 4 of 36 residuals (11%) are log 2: the bound on the 0.9-quantile is one of them
    assert bands["*|*|*"][0] == pytest.approx(math.log(2.0), abs=1e-6)
    # a signature alone has nobody to be held out against
    assert calibration.loso_residuals([r for r in rows if r.signature == sigs[0]], configs, ARCH) == []


def test_calibrate_hook_writes_bands_into_the_model_object():
    configs = {c.id: c for c in (cfg(64, 64, 64), cfg(128, 128, 64, w=8))}
    rows = []
    for s in (sig(4096, 4096), sig(2048, 8192), sig(8192, 2048)):
        for m in (1, 8, 64, 1024, 4096):
            rows.append(_meas(s, m, "torch", 1.1 * predict(TORCH, (s, m), ARCH)))
            rows += [_meas(s, m, cid, predict(c, (s, m), ARCH)) for cid, c in configs.items()]
    model = FAMILY.calibrate(ARCH, rows, configs, None)
    assert model["uncertainty"]["*|*|*"][1] == 15  # one residual per held-out point: its predicted-fastest config
    params = ModelParams.from_json(model)
    assert params.uncertainty == {k: tuple(v) for k, v in model["uncertainty"].items()}
    assert len(params.support["*|*|*"]) == 15  # the 15 points the residuals came from
    # the calibrated model's regimes decline a shape far from every point their bands were measured
    # on, even with a band of 0 (here: torch priced 5x slower than the config at N = K = 256);
    # without its local band (test_confidence_local.py: that one serves it) torch serves
    zero = dataclasses.replace(params, uncertainty={k: (0.0, 100) for k in params.uncertainty},
                               sentinel={"torch": (5.0, 50.0)}, local={})
    decide = make_decider(ARCH, zero, None)
    far = decide(sig(256, 256), 8, tuple(configs.values()) + (TORCH,))
    assert far.config.id == "torch" and far.outside
    near = decide(sig(4096, 4096), 8, tuple(configs.values()) + (TORCH,))
    assert near.config.id != "torch" and not near.outside


LOG = ROOT / "bench/results/h200_oracle_whisper-base_s2.jsonl.gz"


@pytest.mark.skipif(not LOG.is_file(), reason="the recorded oracle log is not in this checkout")
def test_heldout_regret_with_the_rule_is_no_worse_than_torch():
    """Exhaustive-oracle log from the H200: held out per signature, the model tier with the rule
    is never worse than always-torch in geomean, and never worse than the rule-less tier."""
    sys.path.insert(0, str(ROOT / "bench"))
    import confidence_regret

    res = confidence_regret.run(LOG)
    sel = res["selectors"]
    assert res["points"] >= 10 and sel["rule"]["unmeasured"] == 0
    assert sel["rule"]["geomean"] <= sel["torch"]["geomean"] + 1e-12
    assert sel["rule"]["geomean"] <= sel["margin only"]["geomean"] + 1e-12


def test_model_pick_notes_decisions_for_the_report():
    from tunedb.runtime import report, serving

    c = cfg(64, 64, 64)
    shape = (8, 4096, 4096, 2)
    band = {k: (math.log(1.10), 50) for k in confidence.regimes(c.lane, *shape)}

    class Fake:
        def __init__(self, t_torch: float) -> None:
            self.t_torch = t_torch

        def decide(self, sig, m, candidates):
            return confidence.serve(_ranked(1.0, self.t_torch, c), "torch", band, shape)

    s1, s2 = sig(4096, 4096), sig(4096, 8192)
    serving.forget_decisions()
    try:
        assert serving.model_pick(Fake(1.5), s1, 8, (c, TORCH), family="gemm") == c
        assert serving.model_pick(Fake(1.05), s2, 8, (c, TORCH), family="gemm").id == "torch"
        line = serving.confidence_line("gemm")
        assert "2 unmeasured shape(s), 1 served a predicted-faster config, 1 declined" in line
        lines = report.confidence_lines()
        assert any("M=8: model: b64x64x64_w4_s3 (+50% predicted, error band 10%, n=50)" in l for l in lines)
    finally:
        serving.forget_decisions()
