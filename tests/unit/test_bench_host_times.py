"""The CUDA-graph timer's host-issue timing, on the CPU: torch.cuda.synchronize is stubbed and the
arms are plain Python, so what is checked is the bookkeeping (which call is timed, failure
isolation, statuses), not a GPU."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.measure import cudagraph  # noqa: E402
from tunedb.measure.arms import Arm, Problem  # noqa: E402
from tunedb.measure.timers import Prepared  # noqa: E402
from tunedb.records import Signature, Status  # noqa: E402

SIG = Signature.make("gemm", "gemm", "bf16", N=64, K=64)


def _session():
    return object.__new__(cudagraph.GraphSession)  # no GPU: _host_times keeps no state of its own


def test_host_time_takes_the_call_without_out_and_isolates_failures(monkeypatch):
    monkeypatch.setattr(cudagraph.torch.cuda, "synchronize", lambda *a: None)
    seen = {"model": [], "buffer": []}
    raises_later = {"n": 0}

    def model_call(args, kwargs, out):
        return lambda: seen["buffer" if out is not None else "model"].append(1)

    def needs_out(args, kwargs, out):
        if out is None:
            def fail():
                raise TypeError("writes into out")
            return fail
        return lambda: None

    def breaks_in_the_rounds(args, kwargs, out):
        def fn():
            raises_later["n"] += 1
            if raises_later["n"] > 1:  # the first (probe) call passes, a timed one does not
                raise RuntimeError("launcher rejected the allocated output: stride mismatch")
        return fn

    arms = (Arm("model", model_call), Arm("needs_out", needs_out), Arm("breaks", breaks_in_the_rounds),
            Arm("gated_out", model_call))
    problem = Problem(SIG, 8, arms)
    ok = Prepared(Status.OK, "", "warm", None, (("calls_per_graph", 8),))
    prepared = {"model": ok, "needs_out": ok, "breaks": ok,
                "gated_out": Prepared(Status.INCORRECT, "exceeds the bound", "warm")}
    got = _session()._host_times(prepared, problem, (), {}, object(), {})
    assert got["model"].status is Status.OK and got["model"].host_us >= 0
    assert seen["buffer"] == [] and len(seen["model"]) > 1  # never the out= call
    assert got["needs_out"].status is Status.OK and got["needs_out"].host_us is not None
    assert dict(got["needs_out"].info)["host_timed_with_out"] == "TypeError: writes into out"
    assert got["breaks"].status is Status.LAUNCH_ERROR and got["breaks"].host_us is None
    assert "host timing failed: RuntimeError" in got["breaks"].detail
    assert got["gated_out"] == Prepared(Status.INCORRECT, "exceeds the bound", "warm")  # left as it was
