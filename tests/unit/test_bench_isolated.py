"""measure_point_isolated's orchestration: probes, one batch, per-arm isolation, refusals (worker faked)."""
import pytest

from tunedb.measure import protocol
from tunedb.measure.protocol import PointRequest, ProbeRequest, StartRequest, _Refused, measure_point_isolated
from tunedb.measure.worker import WorkerResult
from tunedb.errors import BusyGPUError
from tunedb.records import Measurement, Signature, Status

SIG = Signature.make("gemm", "gemm", "bf16", N=512, K=256)


class FakeWorker:
    """Answers requests by script: probe outcomes per config, and which batches crash."""

    def __init__(self, probe=None, crash_with=None, refuse=False):
        self.probe, self.crash_with, self.refuse = probe or {}, crash_with, refuse
        self.requests, self.closes = [], 0

    def close(self, wait=True):
        self.closes += 1

    def run(self, request, timeout_s=None):
        self.requests.append(request)
        if isinstance(request, ProbeRequest):
            status, detail = self.probe.get(request.config_id, (Status.OK, ""))
            return WorkerResult(status, None, detail)
        assert isinstance(request, PointRequest)
        if self.refuse:
            return WorkerResult(Status.OK, _Refused(BusyGPUError("GPU busy: pid 7")))
        if self.crash_with in request.config_ids:
            return WorkerResult(Status.LAUNCH_ERROR, None, "worker killed by signal SIGSEGV; worker restarted")
        return WorkerResult(Status.OK, (tuple(
            Measurement(SIG, request.m, c, Status.OK, 1.0 + i, 0.01, 5) for i, c in enumerate(request.config_ids)),
            {"prepare": 0.5, "rounds": 0.25}))


def test_probe_failures_cost_their_arms_only():
    w = FakeWorker(probe={"hang": (Status.TIMEOUT, "no answer within 120 s")})
    out = measure_point_isolated(w, "gemm", SIG, 64, ["default", "hang", "torch"], seed=3)
    assert [m.config_id for m in out] == ["default", "hang", "torch"]
    assert out[1].status is Status.TIMEOUT and "no answer" in out[1].detail
    assert out[0].status is Status.OK and out[2].status is Status.OK
    batches = [r.config_ids for r in w.requests if isinstance(r, PointRequest)]
    assert batches == [("default", "torch")]
    assert dict(w.requests[-1].options)["seed"] == 3
    assert w.closes == 0  # a hang's worker was already killed by the timeout


def test_a_probe_that_fails_to_launch_gets_the_next_request_a_fresh_worker():
    # a sticky CUDA error (illegal address) poisons the process: no later arm may run in it
    w = FakeWorker(probe={"evil": (Status.LAUNCH_ERROR, "CUDA error: an illegal memory access"),
                          "b1x1x1": (Status.INFEASIBLE, "out of resource: shared memory")})
    out = {m.config_id: m for m in measure_point_isolated(w, "gemm", SIG, 64, ["default", "b1x1x1", "evil", "torch"])}
    assert w.closes == 1  # the infeasible compile leaves the worker's context intact
    assert out["evil"].status is Status.LAUNCH_ERROR and out["b1x1x1"].status is Status.INFEASIBLE
    assert [c for c, m in out.items() if m.status is Status.OK] == ["default", "torch"]


def test_a_batch_that_crashes_is_split_so_one_arm_pays():
    w = FakeWorker(crash_with="evil")
    out = {m.config_id: m for m in measure_point_isolated(w, "gemm", SIG, 64, ["default", "evil", "torch"])}
    assert out["evil"].status is Status.LAUNCH_ERROR and "SIGSEGV" in out["evil"].detail
    assert out["default"].status is Status.OK and out["torch"].status is Status.OK
    batches = [r.config_ids for r in w.requests if isinstance(r, PointRequest)]
    assert batches == [("default", "evil", "torch"), ("default",), ("evil",), ("torch",)]


def test_refusal_in_the_worker_is_raised_here():
    with pytest.raises(BusyGPUError, match="pid 7"):
        measure_point_isolated(FakeWorker(refuse=True), "gemm", SIG, 64, ["default"])


class TimedWorker(FakeWorker):
    """A FakeWorker on a fake clock: starts cost 3 s, probes 0.1 s, a good batch 1 s (of which
    0.5 prepare and 0.25 rounds inside the worker), a crashing one 2 s and kills the process."""

    def __init__(self, clock, **kw):
        super().__init__(**kw)
        self.clock, self.up = clock, False

    def alive(self):
        return self.up

    def run(self, request, timeout_s=None):
        if isinstance(request, StartRequest):
            self.requests.append(request)
            self.clock[0] += 3.0
            self.up = True
            return WorkerResult(Status.OK)
        res = super().run(request, timeout_s)
        self.clock[0] += 0.1 if isinstance(request, ProbeRequest) else (1.0 if res.status.ok else 2.0)
        if not res.status.ok and isinstance(request, PointRequest):
            self.up = False  # a crash takes the process down; the next request restarts it
        return res


def test_phases_account_for_every_second_of_the_wall(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(protocol.time, "perf_counter", lambda: clock[0])
    w = TimedWorker(clock, crash_with="evil")
    phases = {}
    measure_point_isolated(w, "gemm", SIG, 64, ["default", "evil", "torch"], phases=phases)
    # batches: all three (crash), then default, evil (crash), torch alone; a start before the
    # probes and after each crash
    assert sum(isinstance(r, StartRequest) for r in w.requests) == 3
    assert phases == pytest.approx({"worker start": 9.0, "probes": 0.3, "failed requests": 4.0,
                                    "prepare": 1.0, "rounds": 0.5, "requests": 0.5})
    assert sum(phases.values()) == pytest.approx(clock[0])  # nothing falls through the cracks
    assert all("phases" not in dict(r.options) for r in w.requests if isinstance(r, PointRequest))


def test_point_request_returns_the_measurements_and_the_worker_side_phases(monkeypatch):
    seen = {}

    def fake_measure_point(family, sig, m, ids, phases=None, **kw):
        seen.update(kw)
        phases["prepare"], phases["rounds"] = 0.2, 0.1
        return tuple(Measurement(sig, m, c, Status.OK, 1.0, 0.01, 5) for c in ids)

    monkeypatch.setattr(protocol, "measure_point", fake_measure_point)
    got, phases = PointRequest("gemm", SIG, 64, ("default", "torch"), (("seed", 3),))()
    assert [x.config_id for x in got] == ["default", "torch"] and phases == {"prepare": 0.2, "rounds": 0.1}
    assert seen == {"seed": 3}


def test_phase_line_names_each_phase_and_the_rest():
    from tunedb.commands.build import phase_line

    line = phase_line({"rounds": 1.0, "write": 0.5, "worker start": 2.5, "probes": 0.25, "setup": 0.3}, 5.0)
    assert line == ("setup 0.3 s, worker start 2.5 s, probes 0.2 s, rounds 1.0 s, write 0.5 s, "
                    "the rest (partition, checkpoints) 0.5 s")


class PrestartedWorker(TimedWorker):
    """A TimedWorker whose process was prestarted: 1.5 s of its start is still to wait for."""

    def __init__(self, clock, **kw):
        super().__init__(clock, **kw)
        self.starting, self.up = True, True

    def wait_started(self):
        self.clock[0] += 1.5
        self.starting = False
        return WorkerResult(Status.OK)


def test_a_prestarted_worker_counts_only_the_wait_for_its_start(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(protocol.time, "perf_counter", lambda: clock[0])
    w = PrestartedWorker(clock)
    phases = {}
    out = measure_point_isolated(w, "gemm", SIG, 64, ["default", "torch"], phases=phases)
    assert all(m.status is Status.OK for m in out)
    assert not any(isinstance(r, StartRequest) for r in w.requests)  # it was started already
    assert phases["worker start"] == pytest.approx(1.5)
    assert sum(phases.values()) == pytest.approx(clock[0])


def test_start_request_warms_the_family_beside_torch_and_survives_its_failure(monkeypatch):
    """A worker's start runs the family's warm_start in another thread while it imports torch
    and initialises CUDA, waits for it, and never fails because of it."""
    import threading

    import torch

    import fake_family

    fam = fake_family.install()
    seen, inits = [], []
    monkeypatch.setattr(torch.cuda, "init", lambda: inits.append(threading.current_thread()))

    def warm():
        import time

        time.sleep(0.05)  # still running when torch's init returns: the start must wait for it
        seen.append(threading.current_thread())

    monkeypatch.setattr(fam, "warm_start", warm, raising=False)
    assert StartRequest("fake")() is None
    assert inits == [threading.main_thread()] and len(seen) == 1 and seen[0] is not threading.main_thread()
    StartRequest("fake", warm=False)()  # torch and CUDA alone (bench/tune_profile.py's comparison)
    assert len(inits) == 2 and len(seen) == 1

    def broken():
        raise RuntimeError("0 active drivers")

    monkeypatch.setattr(fam, "warm_start", broken, raising=False)
    StartRequest("fake")()  # the first real launch reports a broken compiler, not the start
    assert len(inits) == 3
