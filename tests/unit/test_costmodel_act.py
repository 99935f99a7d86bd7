"""The cost model prices an activation on both sides of the model tier's decision: torch's separate
elementwise kernel (a launch, its fixed cost and 2 x M x N x bytes of traffic), a Triton tile's
fused epilogue, and the per-kernel cost a Triton launch pays like the vendor's; calibration.fit
recovers each from measurements."""
import math
import random

import pytest

from tunedb.arch import shipped_profile
from tunedb.families.gemm import act_cost
from tunedb.families.gemm.calibration import fit
from tunedb.families.gemm.costmodel import ModelParams, predict, terms
from tunedb.records import Config, Measurement, Signature, Status

from gemm_tiles import tile_config as cfg

ARCH = shipped_profile("sm90")
TORCH = Config.sentinel("torch")
BW_US = ARCH.dram_bw_gbs * 1e3  # bytes per us


def plain(n, k):
    return Signature.make("gemm", "gemm", "half", N=n, K=k)


def acted(n, k, act, bias=1):
    return Signature.parse(f"gemm|op=gemm_act|dt=half|N={n}|K={k}|act={act}|bias={bias}")


def us(config, sig, m, params):
    return predict(config, (sig, m), ARCH, params) * 1000.0


@pytest.mark.parametrize("m,n", [(1, 14336), (54, 2048), (16384, 5120)])
def test_torch_pays_a_separate_activation_pass(m, n):
    params = ModelParams(sentinel={"torch": (0.8, 2.0)})
    k = 1280
    gemm = us(TORCH, plain(n, k), m, params)
    silu = us(TORCH, acted(n, k, "silu"), m, params)
    # unfitted, the pass is priced by structure: one more launch, the arm's per-kernel overhead,
    # and the output read and written once at the profile's DRAM bandwidth
    want = ARCH.launch_us_graph + 2.0 + 2 * m * n * 2 / BW_US
    assert silu - gemm == pytest.approx(want, rel=1e-9)
    # fitted, the pass takes its own (traffic scale, fixed us)
    fitted = ModelParams(sentinel={"torch": (0.8, 2.0), act_cost.ACT_PASS: (1.3, 1.5)})
    assert us(TORCH, acted(n, k, "gelu"), m, fitted) - us(TORCH, plain(n, k), m, fitted) == \
        pytest.approx(1.5 + 1.3 * 2 * m * n * 2 / BW_US, rel=1e-9)


def test_no_pass_without_an_activation_or_for_the_fused_arm():
    params = ModelParams(sentinel={"torch": (0.8, 2.0)})
    s = plain(2048, 512)
    # bias alone rides in addmm's epilogue
    assert us(TORCH, acted(2048, 512, "none"), 256, params) == us(TORCH, s, 256, params)
    # cuBLASLt's bias+GELU epilogue is one kernel
    fused = Config.sentinel("fused")
    assert us(fused, acted(2048, 512, "gelu"), 256, params) == us(fused, s, 256, params)


def test_triton_tiles_pay_their_fused_epilogue():
    c = cfg(64, 64, 64)
    s, m = plain(2048, 512), 4096
    params = ModelParams(latency_us=0.0, act_epilogue={"gelu": (0.5, 1e-4), "silu": (0.1, 1e-5)})
    tm = terms(c, (s, m), ARCH)
    base = us(c, s, m, params)
    gelu = us(c, acted(2048, 512, "gelu"), m, params)
    assert gelu - base == pytest.approx(tm.wave_slots * (0.5 + 1e-4 * 64 * 64), rel=1e-6)
    assert us(c, acted(2048, 512, "silu"), m, params) < gelu
    # no epilogue for act=none; an activation without a fit of its own takes the costliest fitted one
    assert us(c, acted(2048, 512, "none"), m, params) == base
    assert us(c, acted(2048, 512, "relu"), m, params) == gelu
    # nothing fitted at all (hand-made params): no epilogue cost
    assert act_cost.epilogue_pair("relu", {}) == (0.0, 0.0)


def test_a_triton_kernel_pays_the_per_kernel_cost_once_per_launch():
    s, m = plain(4096, 4096), 1024  # compute-bound: the DRAM floor does not bind
    one, split = cfg(16, 64, 128), cfg(16, 64, 128, s=4, split=4)
    without = ModelParams(latency_us=0.0)
    with_cost = ModelParams(latency_us=0.0, kernel_us=2.0)
    assert us(one, s, m, with_cost) - us(one, s, m, without) == pytest.approx(2.0)
    assert us(split, s, m, with_cost) - us(split, s, m, without) == pytest.approx(4.0)  # GEMM + reduction


def _measure(truth, configs, points, seed=5):
    rng = random.Random(seed)
    out = []
    for s, m in points:
        for c in configs:
            t = predict(c, (s, m), ARCH, truth)
            if not isinstance(t, Status):
                out.append(Measurement(s, m, c.id, Status.OK, median_ms=t * math.exp(rng.gauss(0, 0.003))))
    return out


@pytest.mark.parametrize("with_twins", [True, False])
def test_fit_recovers_the_activation_terms(with_twins):
    triton = [cfg(64, 64, 64), cfg(128, 128, 64, w=8), cfg(16, 64, 128, s=4)]
    truth = ModelParams(latency_us=0.0, sentinel={"torch": (0.75, 2.0), act_cost.ACT_PASS: (1.25, 1.4)},
                        act_epilogue={"gelu": (0.3, 2e-4)}, kernel_us=2.0)
    dims = ((512, 512), (4096, 4096), (1280, 5120), (5120, 1280))
    ms = (1, 16, 256, 2048, 8192)
    plain_pts = [(plain(n, k), m) for n, k in dims for m in ms]
    act_dims = ((2048, 512), (5120, 1280)) if not with_twins else ((1280, 5120), (5120, 1280))
    act_pts = [(acted(n, k, "gelu"), m) for n, k in act_dims for m in ms]
    meas = _measure(truth, [TORCH, *triton], plain_pts + act_pts)
    got = fit(meas, {c.id: c for c in triton}, ARCH, ModelParams(latency_us=0.0))
    scale, fixed = got.sentinel[act_cost.ACT_PASS]
    assert scale == pytest.approx(1.25, rel=0.1) and fixed == pytest.approx(1.4, abs=0.4)
    per_cta, per_elem = got.act_epilogue["gelu"]
    assert per_elem == pytest.approx(2e-4, rel=0.2)
    # the Triton kernels pay the per-kernel cost the vendor's fit measured
    assert got.kernel_us == got.sentinel["torch"][1] == pytest.approx(2.0, abs=0.3)
    # and the held-out act points are predicted as measured, both arms
    for s, m in [(acted(2048, 512, "gelu"), 3000), (acted(14336, 4096, "gelu"), 8)]:
        for c in (TORCH, triton[1]):
            assert us(c, s, m, got) == pytest.approx(us(c, s, m, truth), rel=0.1)


def test_round_trip_keeps_the_activation_terms_and_old_files_have_none():
    p = ModelParams(sentinel={"torch": (0.7, 1.5), act_cost.ACT_PASS: (1.2, 1.0)},
                    act_epilogue={"gelu": (0.4, 1e-4)}, kernel_us=1.5)
    assert ModelParams.from_json(p.to_json()) == p
    old = ModelParams.from_json({"schema": 1, "scale": 1.5})
    assert old.act_epilogue == {} and old.kernel_us == 0.0
