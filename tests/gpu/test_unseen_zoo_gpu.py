"""optimize() on models no table names (bench/unseen_zoo_models.py): on the shipped tables alone,
each model's output and its parameters' gradients stay as close to the model in fp32 as plain's
are, and a CUDA-graph replay of the optimized model computes what its eager call does.
Expected run time: about 60 s (first calls compile the kernels served)."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tunedb  # noqa: E402
from tunedb import settings  # noqa: E402
from tunedb.runtime import selector  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from unseen_zoo_models import ZOO, build  # noqa: E402

pytestmark = pytest.mark.gpu


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _grads(model, inputs) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    model.train()  # cuDNN's RNN backward runs in training mode only (no model here has dropout)
    with torch.enable_grad():
        model(*inputs).float().square().mean().backward()
    model.eval()
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float().flatten()
                      for p in model.parameters()])


@pytest.fixture(autouse=True)
def _shipped_only():
    with settings.override(USER_DB="off"):  # what a new machine serves
        selector.reload()
        yield
    selector.reload()


@pytest.mark.parametrize("name", list(ZOO))
def test_unseen_model_output_and_gradients_as_close_to_fp32_as_plain(name):
    plain, inputs = build(name)
    ref32 = copy.deepcopy(plain).float()
    in32 = tuple(t.float() if t.is_floating_point() else t for t in inputs)
    tuned = tunedb.optimize(copy.deepcopy(plain))
    with torch.no_grad():
        ref = ref32(*in32)
        err_plain, err_tuned = _rel(plain(*inputs), ref), _rel(tuned(*inputs), ref)
    # bf16 rounding of the output alone is ~2e-3; tunedb may round differently, never worse
    assert err_tuned <= max(1.5 * err_plain, 5e-3), (err_plain, err_tuned)
    g32 = _grads(ref32, in32)
    gerr_plain, gerr_tuned = _rel(_grads(plain, inputs), g32), _rel(_grads(tuned, inputs), g32)
    assert gerr_tuned <= max(1.5 * gerr_plain, 1e-2), (gerr_plain, gerr_tuned)
    assert set(tuned.state_dict()) == set(plain.state_dict())


@pytest.mark.parametrize("name", [n for n, (_, _, capturable) in ZOO.items() if capturable])
def test_unseen_model_graph_replay_matches_its_eager_call(name):
    from tunedb.measure.cudagraph import capture

    plain, inputs = build(name)
    tuned = tunedb.optimize(plain)
    with torch.no_grad():
        eager = tuned(*inputs).clone()
        keep: list = []
        graph = capture(lambda: tuned(*inputs), warmup=2, keep=keep)
        graph.replay()
        torch.cuda.synchronize()
    out = keep[-1]
    assert torch.isfinite(out.float()).all()
    assert _rel(out, eager) <= 1e-2  # cuDNN may pick another algorithm inside a capture
