"""The protocol loop against the fake timer: interleaving, robustness, failures, busy GPUs."""
import sys
import types

import pytest

from tunedb.measure.arms import Arm, Problem
from tunedb.measure.protocol import best, measure_point, measure_problem, refuse_capture
from tunedb.measure.timers import FakeTimer, rotation_copies
from tunedb.errors import BusyGPUError, CaptureActiveError
from tunedb.records import Signature, Status

SIG = Signature.make("gemm", "gemm", "bf16", N=4096, K=4096)


def problem(*ids):
    return Problem(SIG, 128, tuple(Arm(c) for c in ids))


def test_same_seed_same_interleaving_different_seed_differs():
    ids = ("default", "torch", "a", "b", "c", "d")
    orders = []
    for seed in (11, 11, 12):
        timer = FakeTimer(lambda s, m, c: 1.0, noise_sigma=0.0)
        measure_problem(problem(*ids), timer=timer, seed=seed, min_rounds=6, max_rounds=6)
        orders.append(timer.calls)
    assert orders[0] == orders[1]
    assert orders[0] != orders[2]
    first_round = orders[0][:len(ids)]
    assert sorted(first_round) == sorted(ids)  # every arm once per round


def test_median_absorbs_drift_and_outliers():
    costs = {"default": 1.00, "fast": 0.97}
    timer = FakeTimer(lambda s, m, c: costs[c], noise_sigma=0.01, drift=0.0005,
                      outlier_rate=0.2, outlier_scale=5.0, seed=5)
    out = {x.config_id: x for x in measure_problem(
        problem(*costs), timer=timer, min_rounds=40, max_rounds=40)}
    ratio = out["fast"].median_ms / out["default"].median_ms
    assert ratio == pytest.approx(0.97, abs=0.01)
    assert best(list(out.values())).config_id == "fast"
    # drift over the run is 4%, outliers are 5x: the median stays near the true cost
    assert out["default"].median_ms == pytest.approx(1.02, abs=0.03)
    mean = sum(out["default"].samples) / out["default"].n
    assert mean > 1.3  # what a mean would have reported
    # the raw samples keep the outliers; the estimate does not
    assert max(out["default"].samples) > 3.0
    assert out["default"].sigma_ms < 0.1


def test_noisy_rounds_stop_once_the_losers_are_clearly_behind():
    """3% noise: no median pins to 0.5%, yet arms 15-40% behind the leader settle the point early;
    a close race (2%) keeps sampling to the cap."""
    far = {"default": 1.37, "torch": 1.0, "tma": 1.17}
    timer = FakeTimer(lambda s, m, c: far[c], noise_sigma=0.03, seed=2)
    out = measure_problem(problem(*far), timer=timer, min_rounds=5, max_rounds=40)
    assert max(dict(x.env)["rounds"] for x in out) < 15
    assert best(list(out)).config_id == "torch"
    close = {"default": 1.02, "torch": 1.0}
    timer = FakeTimer(lambda s, m, c: close[c], noise_sigma=0.03, seed=2)
    out = measure_problem(problem(*close), timer=timer, min_rounds=5, max_rounds=40)
    assert max(dict(x.env)["rounds"] for x in out) == 40


def test_failed_arms_keep_their_status_and_never_get_a_time():
    costs = {"default": 1.0, "bad": Status.COMPILE_ERROR, "wrong": Status.INCORRECT}
    out = {x.config_id: x for x in measure_point(
        None, SIG, 64, list(costs), timer=FakeTimer(lambda s, m, c: costs[c]))}
    assert out["default"].status is Status.OK and out["default"].median_ms == pytest.approx(1.0, rel=0.05)
    for cid in ("bad", "wrong"):
        assert out[cid].status is costs[cid]
        assert out[cid].median_ms is None and out[cid].objective(0.5) is None


def test_an_arm_timed_at_zero_has_no_valid_time_and_a_build_skips_it():
    """A timer whose baselines take the whole arm reads 0 ms per call (session 41, an H100): that
    is no time at all, never the fastest arm; the build's objective table leaves it out."""
    from tunedb.build.partition import objective_table

    costs = {"default": 1.0, "zero": 0.0}
    out = {x.config_id: x for x in measure_point(
        None, SIG, 64, list(costs), timer=FakeTimer(lambda s, m, c: costs[c], noise_sigma=0.0))}
    assert out["default"].status is Status.OK
    assert out["zero"].status is Status.TIMEOUT and out["zero"].median_ms is None
    assert "no valid timing" in out["zero"].detail
    import dataclasses
    old_log = dataclasses.replace(out["default"], config_id="zero", median_ms=0.0)  # written before the check
    assert objective_table([out["default"], old_log]) == {(64, "default"): pytest.approx(1.0)}


def test_alpha_weighs_host_issue_time():
    costs = {"default": 0.010, "torch": 0.009}
    host = {"default": 2.0, "torch": 6.0}  # microseconds
    timer = FakeTimer(lambda s, m, c: costs[c], host_us=lambda s, m, c: host[c], noise_sigma=0.0)
    ms = measure_problem(problem(*costs), timer=timer, min_rounds=3, max_rounds=3)
    assert best(ms, alpha=0.0).config_id == "torch"
    assert best(ms, alpha=1.0).config_id == "default"
    assert {m.config_id: m.host_us for m in ms} == host


def test_rotation_copies_and_l2_state():
    l2 = 60 * 2**20
    assert rotation_copies(10 * 2**20, l2, 10 * 2**20) == 1
    assert rotation_copies(4 * 2**30, l2, 32 * 2**20) == 5  # ceil(120/32) + 1
    # what each call touches beside its weights passes through L2 too (whisper's 1280x1280 at
    # M=12000: 3.1 MiB of weight, 58.6 MiB of activations): fewer copies evict a weight
    w, act = 1280 * 1280 * 2, 2 * 12000 * 1280 * 2
    assert rotation_copies(4 * 2**30, l2, w) == 40 and rotation_copies(4 * 2**30, l2, w, act) == 21
    # a call that evicts L2 by itself still needs a second copy: the next call would reread a
    # weight the last one just read
    assert rotation_copies(4 * 2**30, l2, w, 3 * l2) == 2
    assert rotation_copies(l2 // 2, l2, w, 3 * l2) == 1
    timer = FakeTimer(lambda s, m, c: 1.0, l2_bytes=l2)
    cold = measure_problem(problem("default"), timer=timer, working_set_bytes=2 * l2, max_rounds=5)
    warm = measure_problem(problem("default"), timer=timer, working_set_bytes=l2 // 2, max_rounds=5)
    assert cold[0].l2 == "cold" and warm[0].l2 == "warm"


class ScriptedEnv:
    """Foreign processes by round: appear at round `at`, leave after `leave` checks."""

    def __init__(self, initial=(), appear_at=None, pid=4242, leave_after=None):
        self.checks, self.initial, self.appear_at = 0, frozenset(initial), appear_at
        self.pid, self.leave_after = pid, leave_after

    def snapshot(self):
        return {"sm_clock_mhz": 1980, "temp_c": 40}

    def foreign_pids(self):
        self.checks += 1
        pids = set(self.initial)
        if self.appear_at is not None and self.checks >= self.appear_at:
            if self.leave_after is None or self.checks < self.appear_at + self.leave_after:
                pids.add(self.pid)
        return frozenset(pids)


def test_busy_gpu_is_refused_unless_allowed():
    env = ScriptedEnv(initial=[999])
    timer = FakeTimer(lambda s, m, c: 1.0, env=env)
    with pytest.raises(BusyGPUError, match="999.*allow_busy"):
        measure_problem(problem("default"), timer=timer)
    ms = measure_problem(problem("default"), timer=timer, allow_busy=True, max_rounds=5)
    assert ms[0].contended and ms[0].status is Status.OK
    assert dict(ms[0].env)["foreign_pids"] == "999"
    assert dict(ms[0].env)["sm_clock_mhz"] == 1980


def test_newcomer_invalidates_the_round_and_arms_are_remeasured():
    env = ScriptedEnv(appear_at=3, leave_after=2)  # present at checks 3 and 4 (one round + one wait)
    timer = FakeTimer(lambda s, m, c: 1.0, noise_sigma=0.0, env=env)
    ms = measure_problem(problem("default", "a"), timer=timer, min_rounds=6, max_rounds=6,
                         busy_wait_s=5.0)
    for m in ms:
        assert m.n == 6 and not m.contended
        assert dict(m.env)["invalidated_rounds"] == 1
    assert len(timer.calls) == 14  # 7 rounds sampled, one thrown away


def test_newcomer_that_stays_refuses_or_marks_contended():
    env = ScriptedEnv(appear_at=3)
    timer = FakeTimer(lambda s, m, c: 1.0, env=env)
    with pytest.raises(BusyGPUError, match="appeared during"):
        measure_problem(problem("default"), timer=timer, max_rounds=8, busy_wait_s=0.3)
    env = ScriptedEnv(appear_at=3)
    ms = measure_problem(problem("default"), timer=FakeTimer(lambda s, m, c: 1.0, env=env),
                         allow_busy=True, min_rounds=6, max_rounds=6)
    assert ms[0].contended and ms[0].n == 6


def test_capture_is_refused(monkeypatch):
    cuda = types.SimpleNamespace(is_available=lambda: True, is_current_stream_capturing=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    with pytest.raises(CaptureActiveError, match="CUDA-graph capture"):
        refuse_capture()
    with pytest.raises(CaptureActiveError):
        measure_problem(problem("default"), timer=FakeTimer(lambda s, m, c: 1.0))


def test_bad_arguments_are_named():
    timer = FakeTimer(lambda s, m, c: 1.0)
    with pytest.raises(ValueError, match="alpha=2"):
        measure_problem(problem("default"), timer=timer, alpha=2)
    with pytest.raises(ValueError, match="min_rounds"):
        measure_problem(problem("default"), timer=timer, min_rounds=9, max_rounds=3)
    with pytest.raises(ValueError, match="distinct"):
        problem("a", "a")


def test_fallback_gate_ends_a_point_the_fallback_wins_and_records_why():
    """The build's gate (a config must beat torch by 5%) ends the rounds as soon as no arm can;
    without it the same point samples on; a config that may pass the gate is measured out."""
    costs = {"default": 1.30, "torch": 1.0, "tma": 1.07, "mma": 1.12}

    def run(table, **kw):
        timer = FakeTimer(lambda s, m, c: table[c], noise_sigma=0.03, seed=4)
        return {x.config_id: x for x in measure_problem(problem(*table), timer=timer, **kw)}

    plain = run(costs)
    gated = run(costs, fallback_gate=("torch", 1.05))
    assert dict(gated["torch"].env)["rounds"] == 5 < dict(plain["torch"].env)["rounds"]
    assert dict(gated["torch"].env)["stop"] == "fallback gate"
    assert dict(plain["torch"].env)["stop"] in ("settled", "cap")
    assert best(list(gated.values())).config_id == "torch"
    assert all(x.n >= 5 for x in gated.values())  # every arm keeps min_rounds samples
    # a config 10% ahead of the fallback: the gate cannot decide, the usual rule does
    fast = run({"torch": 1.0, "tma": 0.90}, fallback_gate=("torch", 1.05))
    assert dict(fast["tma"].env)["stop"] != "fallback gate"
    assert best(list(fast.values())).config_id == "tma"
    with pytest.raises(ValueError, match="fallback_gate"):
        run(costs, fallback_gate=("torch", 0.9))


def test_a_point_with_no_live_arm_says_so():
    out = measure_problem(problem("a", "b"), timer=FakeTimer(lambda s, m, c: Status.INFEASIBLE))
    assert all(x.status is Status.INFEASIBLE for x in out)
    assert {dict(x.env)["stop"] for x in out} == {"no live arm"}
