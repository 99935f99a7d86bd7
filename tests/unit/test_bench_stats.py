"""Robust statistics, seeded interleaving and successive halving of the protocol."""
import random

import pytest

from tunedb.measure import stats
from tunedb.measure.arms import Arm, Problem
from tunedb.measure.protocol import measure_problem
from tunedb.measure.timers import FakeTimer
from tunedb.records import Signature, Status

SIG = Signature.make("gemm", "gemm", "half", N=512, K=256)


def test_median_and_mad_sigma_known_values():
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    # deviations from 3: 2,1,0,1,97 -> MAD 1
    assert stats.mad_sigma([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(1.4826)
    with pytest.raises(ValueError):
        stats.median([])


def test_mad_sigma_matches_normal_sigma_and_ignores_outliers():
    rng = random.Random(1)
    xs = [rng.gauss(10.0, 0.5) for _ in range(4000)]
    assert stats.mad_sigma(xs) == pytest.approx(0.5, rel=0.06)
    polluted = xs + [1e6] * 200
    assert stats.mad_sigma(polluted) == pytest.approx(0.5, rel=0.12)


def test_converged_needs_min_samples_and_tight_median():
    assert not stats.converged([1.0, 1.0], rel_tol=0.01, min_n=5)
    assert stats.converged([1.0] * 5, rel_tol=0.01, min_n=5)
    noisy = [1.0, 2.0, 0.5, 1.5, 3.0]
    assert not stats.converged(noisy, rel_tol=0.01, min_n=5)


def test_round_order_is_seeded():
    ids = [f"c{i}" for i in range(12)]
    a = [stats.round_order(ids, r) for r in [random.Random(7)] for _ in range(5)]
    b = [stats.round_order(ids, r) for r in [random.Random(7)] for _ in range(5)]
    c = [stats.round_order(ids, r) for r in [random.Random(8)] for _ in range(5)]
    assert a == b
    assert a != c
    assert all(sorted(o) == sorted(ids) for o in a)


def test_halve_keeps_better_half_and_protected():
    scores = {"default": 9.0, "inc": 8.0, "a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    kept = stats.halve(scores, protected={"default", "inc"})
    assert set(kept) == {"default", "inc", "a", "b"}
    assert stats.halve({"a": 1.0}, protected=()) == ("a",)


def test_halving_rounds_schedule():
    assert stats.halving_rounds(5, 40) == frozenset({5, 10, 20})
    assert stats.halving_rounds(5, 5) == frozenset()


def test_protocol_halving_keeps_default_and_incumbent_to_the_end():
    costs = {"default": 2.0, "inc": 1.9, **{f"c{i}": 1.0 + 0.05 * i for i in range(8)}}
    timer = FakeTimer(lambda s, m, c: costs[c], noise_sigma=0.05, seed=3)
    problem = Problem(SIG, 64, tuple(Arm(c) for c in costs))
    out = {x.config_id: x for x in measure_problem(
        problem, timer=timer, incumbent="inc", min_rounds=4, max_rounds=32, rel_tol=1e-9)}
    rounds = dict(out["default"].env)["rounds"]
    assert rounds == 16  # two halvings, then c0 clearly ahead of c1 (1.05) stops it before the cap
    assert out["default"].n == rounds and out["inc"].n == rounds
    assert out["c0"].n == rounds  # the leader survives every halving
    assert out["c7"].n == 4  # the slowest free arm goes at the first halving
    assert all(x.status is Status.OK for x in out.values())


def test_settled_stops_on_losers_clearly_behind_but_not_on_a_close_race():
    import random

    rng = random.Random(3)

    def noisy(mu, n=10, sigma=0.03):  # 3% spread: a median never pins to 0.5% in 10 samples
        return [mu * (1 + sigma * rng.gauss(0, 1)) for _ in range(n)]

    far = {"torch": noisy(62.0), "default": noisy(85.0), "tma": noisy(73.0)}
    scores = {c: stats.median(v) for c, v in far.items()}
    assert not any(stats.converged(v, 0.005, 5) for v in far.values())
    assert stats.settled(far, scores, 0.005, 5)
    close = {"torch": noisy(62.0), "tma": noisy(63.0)}
    assert not stats.settled(close, {c: stats.median(v) for c, v in close.items()}, 0.005, 5)
    early = {c: v[:5] for c, v in far.items()}  # 5 samples: too few to call anyone clearly behind
    assert not stats.settled(early, {c: stats.median(v) for c, v in early.items()}, 0.005, 5)
    assert stats.settled({}, {}, 0.005, 5)
    exact = {"a": [1.0] * 5, "b": [1.0] * 5}  # converged ties are settled too
    assert stats.settled(exact, {"a": 1.0, "b": 1.0}, 0.005, 5)
    assert not stats.settled({"a": [1.0] * 4, "b": [2.0] * 4}, {"a": 1.0, "b": 2.0}, 0.005, 5)


def test_gate_decided_only_when_no_arm_can_pass_the_fallbacks_gate():
    rng = random.Random(5)

    def noisy(mu, n=5, sigma=0.02):
        return [mu * (1 + sigma * rng.gauss(0, 1)) for _ in range(n)]

    def decided(samples, fallback="torch", speedup=1.05, min_n=5):
        scores = {c: stats.median(v) for c, v in samples.items()}
        return stats.gate_decided(samples, scores, fallback, speedup, min_n)

    # cuBLAS 6-30% ahead (whisper-large-v3's M=12000 points): decided from 5 samples, where
    # settled() still needs 10 to call anyone behind
    ahead = {"torch": noisy(62.0), "tma": noisy(66.0), "default": noisy(85.0)}
    assert decided(ahead)
    assert not stats.settled(ahead, {c: stats.median(v) for c, v in ahead.items()}, 0.005, 5)
    # a config 2% faster than torch still cannot pass a 1.05x gate once the noise is small
    tight = {"torch": [1.00, 1.001, 0.999, 1.0, 1.0], "tma": [0.98, 0.981, 0.979, 0.98, 0.98]}
    assert decided(tight)
    assert not decided(tight, speedup=1.01)  # ...but it can pass a 1.01x gate
    # one that might be 5% faster keeps sampling
    assert not decided({"torch": noisy(62.0), "tma": noisy(59.5)})
    # too few samples, or no fallback among the live arms: never decided
    assert not decided({c: v[:4] for c, v in ahead.items()})
    assert not decided({"tma": noisy(66.0), "default": noisy(85.0)})
