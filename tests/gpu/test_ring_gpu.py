"""The input ring in the CUDA-graph timer: every timed launch of an in-place op runs on a fresh
slot, restored outside the timed region (run on the device: about 10 s)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.families.contract import VerifyRule  # noqa: E402
from tunedb.measure.arms import Arm, Problem  # noqa: E402
from tunedb.measure.cudagraph import CudaGraphTimer  # noqa: E402
from tunedb.measure.protocol import measure_problem  # noqa: E402
from tunedb.records import Signature, Status  # noqa: E402

pytestmark = pytest.mark.gpu
SIG = Signature.make("ringtest", "inc", "fp32", n=4096)


def _problem(ids=("inc", "inc2")):
    def make_inputs(device, seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        return (torch.rand(64, 4096, generator=g).to(device),), {}

    def make(times):
        return lambda args, kwargs, out: (lambda: args[0].add_(1.0) if times == 1 else args[0].add_(0.5).add_(0.5))

    arms = tuple(Arm(cid, make(1 if cid == "inc" else 2)) for cid in ids)
    return Problem(SIG, 64, arms, make_inputs=make_inputs, reference=lambda a, k: a[0].double() + 1.0,
                   baseline_id="inc", policy="ring", verify=VerifyRule("tolerance"))


def test_each_timed_launch_runs_on_a_restored_slot():
    timer = CudaGraphTimer()
    session = timer.open(_problem(), seed=0, working_set_bytes=None)
    try:
        assert all(p.status.ok for p in session.prepared.values()), session.prepared
        inputs = session.inputs
        assert inputs.policy == "ring" and inputs.depth >= 8
        for _ in range(3):
            times = session.sample(["inc", "inc2"])
            assert all(isinstance(t, float) and t > 0 for t in times.values())
            torch.cuda.synchronize()
            # the last replay ran once per slot since the restore before it: every slot is its
            # pristine input + 1, never + 2 (a launch on an earlier launch's output)
            for (args, _), pristine in zip(inputs.sets, inputs.pristine):
                torch.testing.assert_close(args[0], pristine[0] + 1.0)
    finally:
        session.close()


def test_ring_problem_measures_through_the_protocol():
    out = {m.config_id: m for m in measure_problem(_problem(), timer=CudaGraphTimer(), max_rounds=6)}
    assert all(m.status is Status.OK for m in out.values()), {c: m.detail for c, m in out.items()}
    assert dict(out["inc"].env)["inputs"] == "ring"
