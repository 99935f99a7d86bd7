"""The GEMM cost model's decode term (decode_cost.py): a weight read at the rate Little's law
allows (the bytes a config keeps in flight over the loaded latency, capped by DRAM bandwidth),
fitted by calibration.fit on the decode points of small weights and priced on large ones."""
import math

from tunedb.arch import shipped_profile
from tunedb.families.gemm import decode_cost
from tunedb.families.gemm.calibration import fit
from tunedb.families.gemm.costmodel import (ModelParams, decode_flight, predict, terms, weight_bytes)
from tunedb.records import Measurement, Signature, Status

from gemm_tiles import tile_config as cfg

ARCH = shipped_profile("sm90")
LAT, BASE = 1.2, 1.0  # the synthetic device's loaded latency and fixed cost (us)


def sig(n, k):
    return Signature.make("gemm", "gemm", "half", N=n, K=k)


def law_us(c, s, m):
    """The synthetic device: the decode law with LAT and BASE, plus the model's own fixed terms."""
    tm = terms(c, (s, m), ARCH)
    stream = decode_cost.stream_us(weight_bytes((s, m)), decode_flight(c, (s, m), ARCH), ARCH.dram_bw_gbs * 1e3, LAT, 1.0)
    return BASE + stream + tm.fixed_us


CONFIGS = [cfg(16, 32, 32, s=4), cfg(16, 64, 64, s=3), cfg(16, 128, 256, s=3), cfg(32, 64, 128, s=4),
           cfg(16, 32, 128, s=4, split=4), cfg(16, 64, 256, s=3, split=8)]


def measurements(shapes, ms):
    out = []
    for n, k in shapes:
        for m in ms:
            for c in CONFIGS:
                if isinstance(terms(c, (sig(n, k), m), ARCH), Status):
                    continue
                out.append(Measurement(sig(n, k), m, c.id, Status.OK, law_us(c, sig(n, k), m) / 1000.0))
    return out


SMALL = [(512, 512), (2048, 512), (512, 2048), (1536, 512), (512, 9728)]  # 0.5-10 MB weights


def test_fit_on_small_weights_prices_a_large_weight_by_its_tiles_in_flight():
    params = fit(measurements(SMALL, (1, 3, 9, 30)), {c.id: c for c in CONFIGS}, ARCH)
    lat, scale = params.decode["stream"]
    assert abs(lat - LAT) / LAT < 0.1 and scale == 1.0 and params.decode["combine"][0] == 0.0
    big = sig(14336, 4096)  # 117 MB: no training weight came near it
    for c in CONFIGS[:4]:
        got = predict(c, (big, 3), ARCH, params) * 1000.0
        assert abs(math.log(got / law_us(c, big, 3))) < 0.1, c.id
    # a BK=32 tile keeps a quarter of a BK=128 one's bytes in flight: latency-bound, slower
    assert predict(CONFIGS[0], (big, 3), ARCH, params) > 1.2 * predict(CONFIGS[2], (big, 3), ARCH, params)


def test_without_a_decode_fit_the_model_is_unchanged_and_large_m_ignores_it():
    big = sig(14336, 4096)
    params = fit(measurements(SMALL, (1, 3, 9, 30)), {c.id: c for c in CONFIGS}, ARCH)
    plain = ModelParams(**{**params.__dict__, "decode": {}})
    for c in CONFIGS:
        assert predict(c, (big, 256), ARCH, params) == predict(c, (big, 256), ARCH, plain)
    assert decode_cost.predict_us({}, 1e6, 1e6, 4e6) is None


def test_decode_fit_round_trips_and_old_files_load_without_it():
    params = fit(measurements(SMALL, (1, 3, 9, 30)), {c.id: c for c in CONFIGS}, ARCH)
    again = ModelParams.from_json(params.to_json())
    assert again.decode == params.decode and again.decode
    old = params.to_json()
    del old["decode"]
    loaded = ModelParams.from_json(old)
    assert loaded.decode == {}
    c, s = CONFIGS[0], sig(14336, 4096)
    assert predict(c, (s, 3), ARCH, loaded) == predict(c, (s, 3), ARCH, ModelParams(**{**again.__dict__, "decode": {}}))


def test_too_few_decode_points_fit_nothing():
    assert decode_cost.fit_stream([(1e6, 1e5, 3.0)] * 3, 4e6) == {}


def test_fit_tells_a_hard_roofline_from_latency_queued_behind_the_transfer():
    rows_max, rows_sum = [], []
    lat = 1.07  # near a grid latency (decode_cost._LAT_GRID)
    for nbytes in (1e6, 4e6, 16e6, 64e6, 117e6):
        for flight in (5e5, 2e6, 8e6, 3e7):
            bw = ARCH.dram_bw_gbs * 1e3
            rows_max.append((nbytes, flight, 0.5 + decode_cost.stream_us(nbytes, flight, bw, lat, 1.0, 0.0)))
            rows_sum.append((nbytes, flight, 0.5 + decode_cost.stream_us(nbytes, flight, bw, lat, 1.0, 1.0)))
    hard = decode_cost.fit_stream(rows_max, ARCH.dram_bw_gbs * 1e3)
    queued = decode_cost.fit_stream(rows_sum, ARCH.dram_bw_gbs * 1e3)
    assert hard["combine"][0] == 0.0 and queued["combine"][0] == 1.0
    for fitted in (hard, queued):
        assert abs(fitted["stream"][0] - lat) < 0.05 and abs(fitted["base"][0] - 0.5) < 0.05


def test_merge_keeps_the_newer_builds_decode_fit_else_the_older():
    from tunedb.families.gemm.calibration import merge

    fitted = fit(measurements(SMALL, (1, 3, 9, 30)), {c.id: c for c in CONFIGS}, ARCH)
    bare = ModelParams(**{**fitted.__dict__, "decode": {}})
    assert merge(fitted, bare).decode == fitted.decode
    other = ModelParams(**{**fitted.__dict__, "decode": {"stream": (2.0, 1.0), "base": (0.0, 0.0)}})
    assert merge(fitted, other).decode == other.decode
