"""The GEMM model tier's confidence (issue 18): regimes, LOSO error bands, the serving rule, the
params round trip, and held-out regret on a recorded H200 log."""
from __future__ import annotations

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


def test_rule_declines_a_shape_outside_its_regimes_work_range():
    c = cfg(64, 128, 128, lane="triton_tma")
    # the band was measured on 5-100 GFLOP points (whisper-large-v3 at M=1500)
    rows = [("triton_tma", 1500, n, k, 2, 0.0) for n, k in ((1280, 1280), (5120, 1280), (1280, 5120))]
    band = {k: (0.05, 50) for k in confidence.regimes(c.lane, 1500, 1280, 1280)}
    support = confidence.supports(rows)
    lo, hi = support["triton_tma|m1025+|ai128+"]
    assert lo == pytest.approx(math.log2(2 * 1500 * 1280 * 1280), abs=1e-3) and hi > lo
    small = (1500, 512, 512, 2)  # 0.8 GFLOP: six times below the smallest measured point
    d = confidence.serve(_ranked(1.0, 2.0, c), "torch", band, small, support=support)
    assert d.config.id == "torch" and d.declined and d.outside
    assert "outside the work range" in d.describe()
    # inside the range (and within the factor-2 slack) the band decides as before
    d = confidence.serve(_ranked(1.0, 2.0, c), "torch", band, (1500, 2048, 2048, 2), support=support)
    assert d.config == c and not d.outside
    # a model calibrated before supports were kept is not range-checked
    assert confidence.serve(_ranked(1.0, 2.0, c), "torch", band, small).config == c


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
                    support={"*|*|*": (20.0, 31.5)})
    assert ModelParams.from_json(p.to_json()) == p
    q = ModelParams(uncertainty={"triton_mma|m1|ai<16": (0.1, 10), "x|*|*": (0.5, 5)}, fitted_on=10)
    merged = calibration.merge(p, q).uncertainty
    assert calibration.merge(ModelParams(support={"a": (1.0, 2.0)}, fitted_on=1),
                             ModelParams(support={"a": (0.5, 1.5), "b": (3.0, 4.0)}, fitted_on=1)).support == \
        {"a": (0.5, 2.0), "b": (3.0, 4.0)}
    assert merged["triton_mma|m1|ai<16"] == (0.3, 50) and merged["x|*|*"] == (0.5, 5)


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
    assert len(res) == 3 * 4 * 3
    big = [r for lane, m, n, k, e, r in res if abs(r) > 1e-9]
    assert len(big) == 4 and all(r == pytest.approx(math.log(2.0)) for r in big)
    bands = confidence.bands(res)
    assert bands["*|*|*"][1] == 36
    assert bands["*|*|*"][0] == pytest.approx(confidence.upper_quantile([0.0] * 32 + [math.log(2)] * 4), abs=1e-6)
    assert confidence.upper_quantile([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9) == pytest.approx(9.0)
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
    assert ModelParams.from_json(model).uncertainty == {k: tuple(v) for k, v in model["uncertainty"].items()}


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
