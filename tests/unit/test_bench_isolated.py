"""measure_point_isolated's orchestration: probes, one batch, per-arm isolation, refusals (worker faked)."""
import pytest

from tunedb.bench.protocol import PointRequest, ProbeRequest, _Refused, measure_point_isolated
from tunedb.bench.worker import WorkerResult
from tunedb.errors import BusyGPUError
from tunedb.records import Measurement, Signature, Status

SIG = Signature.make("gemm", "gemm", "bf16", N=512, K=256)


class FakeWorker:
    """Answers requests by script: probe outcomes per config, and which batches crash."""

    def __init__(self, probe=None, crash_with=None, refuse=False):
        self.probe, self.crash_with, self.refuse = probe or {}, crash_with, refuse
        self.requests = []

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


def test_phases_split_the_wall_time_by_where_it_went():
    w = FakeWorker(crash_with="evil")
    phases = {}
    measure_point_isolated(w, "gemm", SIG, 64, ["default", "evil", "torch"], phases=phases)
    assert set(phases) == {"probes", "prepare", "rounds", "requests"}
    # four batches ran: the whole one and "evil" alone crashed (nothing reported), "default" and
    # "torch" alone each reported their worker-side prepare and rounds seconds
    assert phases["prepare"] == pytest.approx(0.5 * 2) and phases["rounds"] == pytest.approx(0.25 * 2)
    assert "phases" not in dict(w.requests[-1].options)  # never sent to the worker
