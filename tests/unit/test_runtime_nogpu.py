"""confirm() and autotune() on a machine without a CUDA GPU (issue 17): one clear warning per
process that nothing was measured and why, instead of a torch error or silence."""
from __future__ import annotations

import warnings

import pytest

import tunedb
from tunedb.errors import NoGPUWarning
from tunedb.runtime import nogpu

torch = pytest.importorskip("torch")


@pytest.fixture
def no_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(nogpu, "has_gpu", lambda: False)
    monkeypatch.setattr(nogpu, "_warned", set())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def model():
    return tunedb.optimize(torch.nn.Sequential(torch.nn.Linear(64, 64)).half())


def test_confirm_without_a_gpu_warns_once_and_judges_nothing(no_gpu):
    m, x = model(), (torch.randn(8, 64, dtype=torch.half),)
    with pytest.warns(NoGPUWarning, match="tunedb.confirm: no CUDA GPU here, so nothing was measured"):
        res = tunedb.confirm(m, x)
    assert res.verdicts == () and res.demoted == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoGPUWarning)
        tunedb.confirm(m, x)  # once per process


def test_autotune_without_a_gpu_warns_once_naming_the_cache(no_gpu):
    m = model()
    with pytest.warns(NoGPUWarning, match=r"tunedb.autotune: no CUDA GPU.*cache tune.json is not written"):
        with tunedb.autotune(cache="tune.json"):
            m(torch.randn(8, 64, dtype=torch.half))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoGPUWarning)
        with tunedb.autotune(cache="tune.json"):
            pass


def test_an_injected_timer_is_not_warned_about(no_gpu):
    from tunedb.measure.timers import FakeTimer

    with warnings.catch_warnings():
        warnings.simplefilter("error", NoGPUWarning)
        with tunedb.autotune(cache=None, timer=FakeTimer(lambda s, m, c: 0.01)):
            pass
