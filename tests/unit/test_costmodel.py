"""The cost model's rules: infeasible splits, partial waves, the memory floor, monotonic M,
sentinels, ranking with a validity predicate, and calibration against known parameters."""
import math
import random
import subprocess
import sys

import pytest

from tunedb.families.gemm import costmodel
from tunedb.arch import shipped_profile
from tunedb.families.gemm.calibration import fit, geomean_error
from tunedb.families.gemm.costmodel import ModelParams, make_ranker, predict, rank, terms
from tunedb.errors import ConfigError
from tunedb.records import Config, Measurement, Signature, Status

from gemm_tiles import tile_config as cfg

ARCH = shipped_profile("sm90")


def test_import_does_not_pull_torch():
    code = "import sys, tunedb.families.gemm.costmodel; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_split_larger_than_k_tiles_is_infeasible():
    # K=256 with bk=64 has 4 K tiles: split 4 is feasible, split 8 is not.
    assert isinstance(predict(cfg(64, 64, 64, split=4), (16, 4096, 256), ARCH), float)
    assert predict(cfg(64, 64, 64, split=8), (16, 4096, 256), ARCH) is Status.INFEASIBLE


def test_too_much_shared_memory_is_infeasible():
    assert predict(cfg(256, 256, 128, s=8), (512, 512, 512), ARCH) is Status.INFEASIBLE


def test_partial_wave_ctas_do_not_share_an_sm():
    c = cfg(128, 128, 64, w=4, s=2)
    r = costmodel.occupancy(costmodel._tile_of(c), ARCH, 2)
    assert r >= 2
    # One tile: one CTA time, not r of them.
    assert terms(c, (128, 128, 4096), ARCH).wave_slots == 1
    # sms + 1 tiles fit in one (partial) wave of sms * r slots: two SMs' worth of sharing.
    n_tiles = ARCH.sms + 1
    assert terms(c, (128, 128 * n_tiles, 4096), ARCH).wave_slots == 2
    # A full wave costs r CTA times.
    full = ARCH.sms * r
    assert terms(c, (128, 128 * full, 4096), ARCH).wave_slots == r


def test_memory_floor_binds_for_skinny_gemm():
    # M=1 against a 128256x4096 weight: reading the weight at DRAM bandwidth is the floor.
    ms = predict(cfg(16, 128, 64), (1, 128256, 4096), ARCH)
    floor_ms = (128256 * 4096 * 2) / (ARCH.dram_bw_gbs * 1e9) * 1e3
    assert ms >= floor_ms * 0.999
    tm = terms(cfg(16, 128, 64), (1, 128256, 4096), ARCH)
    assert tm.floor_us == pytest.approx((4096 + 128256 * 4096 + 128256) * 2 / (ARCH.dram_bw_gbs * 1e3))


@pytest.mark.parametrize("c", [cfg(64, 64, 64), cfg(128, 256, 64, w=8), cfg(32, 64, 128, split=4)])
def test_monotonic_in_m_for_a_fixed_config(c):
    times = [predict(c, (m, 2048, 1024), ARCH) for m in range(1, 4200, 37)]
    assert all(b >= a for a, b in zip(times, times[1:]))


def test_more_flops_cost_more_at_large_shapes():
    c = cfg(128, 128, 64, w=8)
    assert predict(c, (4096, 4096, 8192), ARCH) > predict(c, (4096, 4096, 1024), ARCH)


def test_sentinels():
    sig = Signature.make("gemm", "gemm", "half", N=2048, K=1024)
    t = predict(Config.sentinel("torch"), (sig, 1024), ARCH)
    assert isinstance(t, float) and t > 0
    with pytest.raises(ConfigError, match="default_config"):
        predict(Config.sentinel("default"), (sig, 1024), ARCH)
    d = cfg(64, 64, 32)
    assert predict(Config.sentinel("default"), (sig, 1024), ARCH, default_config=lambda s, a: d) == \
        predict(d, (sig, 1024), ARCH)


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="block"):
        predict(Config("x", "triton_mma", (("block", (64, 64)),)), (8, 8, 8), ARCH)
    with pytest.raises(ConfigError, match="warps"):
        predict(Config("x", "triton_mma", (("block", (64, 64, 64)), ("warps", 0))), (8, 8, 8), ARCH)


def toy_validity(config, sig, m, arch):
    if config.is_sentinel:
        return None if config.id == "torch" else f"no {config.id} arm in the toy family"
    return "bm too large for tiny M" if m is not None and config.param("block")[0] > 2 * max(m, 16) else None


def test_rank_respects_validity_and_orders():
    configs = [cfg(bm, bn, 64, w=w) for bm in (16, 32, 64, 128) for bn in (64, 128) for w in (4, 8)]
    sentinels = [Config.sentinel(s) for s in ("fused", "default")]
    ranked = rank(configs + sentinels, 8, 4096, 4096, ARCH, k=5, validity=toy_validity)
    assert len(ranked) == 5
    assert not any(c.id in ("fused", "default") for c, _ in ranked)
    assert all(c.param("block")[0] <= 32 for c, _ in ranked)
    assert [ms for _, ms in ranked] == sorted(ms for _, ms in ranked)
    ranker = make_ranker(ARCH, None, toy_validity)
    sig = Signature.make("gemm", "gemm", "half", N=4096, K=4096)
    assert ranker(sig, 8, tuple(configs)) == ranked[0][0]
    assert ranker(sig, 8, ()) is None


def test_params_json_round_trip():
    p = ModelParams(scale=1.3, per_config={"a": (1.0, 0.5)})
    q = ModelParams.from_json(p.to_json())
    assert q == p
    with pytest.raises(ConfigError, match="schema"):
        ModelParams.from_json({"scale": 1})


def test_calibration_reduces_error_on_synthetic_data():
    # Ground truth: per-config lines unlike the arch-derived defaults; fit must recover them.
    configs = {c.id: c for c in [cfg(64, 64, 64), cfg(128, 128, 64, w=8), cfg(32, 128, 64, split=2)]}
    rng = random.Random(7)
    # Without the latency bound every point is throughput-bound: all of them inform the lines.
    truth = ModelParams(latency_us=0.0,
                        per_config={cid: (rng.uniform(1, 4), rng.uniform(0.05, 0.4)) for cid in configs})
    meas = []
    for cid, c in configs.items():
        for m in (16, 64, 256, 1024, 3000):
            for n, k in ((1024, 1024), (4096, 1024), (2048, 4096)):
                sig = Signature.make("gemm", "gemm", "half", N=n, K=k)
                true_ms = predict(c, (sig, m), ARCH, truth)
                noisy = true_ms * math.exp(rng.gauss(0, 0.01))
                meas.append(Measurement(sig, m, cid, Status.OK, median_ms=noisy))
    base = ModelParams(latency_us=0.0)
    before = geomean_error(base, meas, configs, ARCH)
    fitted = fit(meas, configs.values(), ARCH, base=base)
    after = geomean_error(fitted, meas, configs, ARCH)
    assert after < before / 3
    assert after < 0.05
    for cid, (a, b) in truth.per_config.items():
        assert fitted.per_config[cid][1] == pytest.approx(b, rel=0.1)


def test_ranks_the_gemm_family_space_with_its_predicate():
    from tunedb.families import get

    fam = get("gemm")
    sig = Signature.make("gemm", "gemm", "half", N=4096, K=14336)
    space = fam.config_space("sm90") + tuple(Config.sentinel(s) for s in fam.sentinels(sig))
    ranked = rank(space, 16, 4096, 14336, ARCH, k=16, validity=fam.invalid_reason,
                  default_config=fam.default_config)
    assert len(ranked) == 16
    assert all(fam.invalid_reason(c, sig, 16, ARCH) is None for c, _ in ranked)
    # Decode-sized M on a deep K: the model should prefer small-M tiles over 128-row ones.
    assert ranked[0][0].is_sentinel or ranked[0][0].param("block")[0] <= 64
    d = predict(Config.sentinel("default"), (sig, 16), ARCH, default_config=fam.default_config)
    assert isinstance(d, float)
