"""Run-time regressions: a refused autotune cache keeps its redirected results across runs, a
cached winner this process cannot run is re-measured, optimize() reads mixins before fusing, and
tunedb's own lookups (prewarm) count no calls."""
import json
import warnings

import torch
from torch import nn

import tunedb
from runtime_fakes import FakeMeasurer, gemm  # noqa: F401  (fixture)
from tunedb.runtime import selector
from tunedb.records import Point, Signature
from tunedb.runtime.autotuner import autotune
from tunedb.runtime.prewarm import prewarm

SIG = Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32")
ACT = Signature.parse("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=gelu|bias=1")
def test_redirected_results_survive_a_second_run(gemm, tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"version": 3, "env": {"arch_family": "sm80"}, "results": {}}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m1 = FakeMeasurer()
        with autotune(cache=path, measurer=m1, publish=False, arch_family="sm90") as t:
            t.resolve(gemm, SIG, 64)
        m2 = FakeMeasurer()
        with autotune(cache=path, measurer=m2, publish=False, arch_family="sm90") as t:
            t.resolve(gemm, SIG, 200)   # a different shape measured in run 2
            t.resolve(gemm, SIG, 64)    # run 1 measured this one already
    alt = json.loads((tmp_path / "tune.sm90.json").read_text())
    assert m2.calls and [c[1] for c in m2.calls] == [200], f"run 2 re-measured: {[c[1] for c in m2.calls]}"
    assert "64" in json.dumps(alt["results"]), alt


def test_unusable_cached_winner_is_remeasured(gemm, tmp_path):
    path = tmp_path / "tune.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with autotune(cache=path, measurer=FakeMeasurer(lambda s, m, ids: "fused"), publish=False,
                      arch_family="sm90", approximate=True) as t:
            assert t.resolve(gemm, ACT, 64)[0].id == "fused"
        meas = FakeMeasurer()
        with autotune(cache=path, measurer=meas, publish=False, arch_family="sm90", approximate=False) as t:
            got = t.resolve(gemm, ACT, 64)
    assert meas.calls, f"exact run never measured the shape; resolve() -> {got}"


class ExtraAct:  # a mixin after nn.Module in the MRO
    def post(self, y):
        return self.act(y)  # applies the same activation again


class Block(nn.Module, ExtraAct):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.post(self.act(self.fc(x)) - 0.5)


def test_mixin_method_use_blocks_fusion():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 8)
    want = model(x)
    tuned = tunedb.optimize(model, inplace=False)
    assert not isinstance(tuned.act, nn.Identity), "activation used by a mixin method was blanked"
    torch.testing.assert_close(tuned(x), want)


def test_prewarm_makes_no_calls(gemm):
    selector.reset_counters()
    pts = [Point(SIG, 64, must_tune=True), Point(SIG, 128, must_tune=True)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prewarm(pts, measurer=FakeMeasurer(), publisher=lambda *a: None, arch_family="sm90")
    c = selector.counters()
    assert c == {}, f"no tuned op ran, yet counters say {c}\n{selector.tuning_report()}"


def test_prewarm_without_anything_to_tune_says_what_it_needs():
    import pytest

    with pytest.raises(TypeError, match="example inputs"):
        prewarm(nn.Linear(4, 4), None)
