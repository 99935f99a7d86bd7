"""autotune(): the whole flow on CPU, against the real GEMM family and fake measurements."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from runtime_fakes import FakeMeasurer, gemm  # noqa: F401  (fixture)
from tunedb import database
from tunedb.runtime import selector
from tunedb.errors import AutotuneWarning, DatabaseError, MeasurementError
from tunedb.records import Signature
from tunedb.runtime import autotuner, launch_table
from tunedb.runtime.autotuner import autotune

SIG = Signature.parse("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=gelu|bias=1")
WIN = "b32x64x128_w4_s3_g8"


def _pick(sig, m, ids):
    return WIN if WIN in ids else ids[0]


class Publisher:
    def __init__(self):
        self.calls = []

    def __call__(self, family, arch, entries, configs):
        self.calls.append((family, arch, entries, configs))


def test_a_miss_is_measured_once_and_served_at_or_below_its_size(gemm, tmp_path):
    meas, pub = FakeMeasurer(_pick), Publisher()
    path = tmp_path / "tune.json"
    with autotune(cache=path, measurer=meas, publisher=pub, arch_family="sm90") as tuner:
        config, tier = tuner.resolve(gemm, SIG, 100)
        assert (config.id, tier) == (WIN, "autotune")
        tuner.resolve(gemm, SIG, 100)
        tuner.resolve(gemm, SIG, 97)  # same bucket (104), below the measured 100: a hit
        assert [c[1] for c in meas.calls] == [100]
        tuner.resolve(gemm, SIG, 101)  # larger size in the same bucket: a miss, measured
        assert [c[1] for c in meas.calls] == [100, 101]
    ids = meas.calls[0][2]
    assert {"default", "torch", WIN} <= set(ids)  # compile set + sentinels
    assert "fused" not in ids  # exact GELU: the tanh-GELU epilogue is not a candidate
    assert meas.calls[0][3] is not None  # the selector's choice is kept as incumbent
    data = json.loads(path.read_text())
    assert data["version"] == 3 and data["env"]["arch_family"] == "sm90"
    assert set(data["results"][SIG.format()]["104"]) == {"100", "101"}
    (family, arch, entries, configs), = pub.calls
    assert (family, arch) == ("gemm", "sm90")
    (entry,) = entries
    assert [(r.m_hi, r.config_id) for r in entry.regions] == [(100, WIN), (101, WIN)]  # no catch-all
    assert entry.source == "autotune" and set(configs) == {WIN}
    assert entry.evidence["M=100"][WIN][0] == 1.0 and entry.evidence["M=100"]["torch"] == "incorrect"


def test_a_second_context_reads_the_cache_and_measures_nothing(gemm, tmp_path):
    path = tmp_path / "tune.json"
    first = FakeMeasurer(_pick)
    with autotune(cache=path, measurer=first, publish=False, arch_family="sm90") as t:
        t.resolve(gemm, SIG, 50)
    again = FakeMeasurer(_pick)
    with autotune(cache=path, measurer=again, publisher=Publisher(), arch_family="sm90") as t:
        assert t.resolve(gemm, SIG, 49)[0].id == WIN
        assert t.resolve(gemm, SIG, 50)[0].id == WIN
    assert len(first.calls) == 1 and again.calls == []


def test_approximate_opt_in_adds_the_approximating_arm(gemm):
    meas = FakeMeasurer(_pick)
    with autotune(cache=None, measurer=meas, publish=False, arch_family="sm90", approximate=True) as t:
        t.resolve(gemm, SIG, 8)
    assert "fused" in meas.calls[0][2]


def test_disabled_or_capturing_takes_the_fallback(gemm, tmp_path, monkeypatch):
    meas = FakeMeasurer(_pick)
    with autotune(cache=None, enabled=False, measurer=meas, arch_family="sm90") as t:
        assert t.resolve(gemm, SIG, 100) is None
    with autotune(False, measurer=meas, arch_family="sm90") as t:  # autotune(False) reads as enabled=False
        assert not t.enabled
    monkeypatch.setattr(autotuner, "capturing", lambda: True)
    with autotune(cache=None, measurer=meas, arch_family="sm90") as t:
        assert t.resolve(gemm, SIG, 100) is None
        with pytest.raises(MeasurementError, match="CUDA-graph capture"):
            t.tune(gemm, SIG, 100)
    assert meas.calls == []


def test_the_op_consults_the_autotune_cache_first_while_active(gemm):
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    w, b = torch.randn(64, 32, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    assert launch_table.launcher("gemm_act", x, w, b, "gelu", 3).tier in ("model", "default")
    with autotune(cache=None, measurer=FakeMeasurer(_pick), publish=False, arch_family="sm90"):
        bound = launch_table.launcher("gemm_act", x, w, b, "gelu", 3)
        assert (bound.tier, bound.config.id) == ("autotune", WIN)
        bound.call(x, w, b, None)
    assert gemm.ran == [WIN]
    assert launch_table.launcher("gemm_act", x, w, b, "gelu", 3).tier == "default"


def test_a_cache_from_another_arch_is_not_loaded_nor_overwritten(gemm, tmp_path):
    path = tmp_path / "tune.json"
    foreign = {"version": 3, "env": {"arch_family": "sm80"},
               "results": {SIG.format(): {"104": {"100": {"config": "torch", "ms": 0.1}}}}}
    path.write_text(json.dumps(foreign))
    meas = FakeMeasurer(_pick)
    with pytest.warns(AutotuneWarning, match="not loaded.*sm80.*tune.sm90.json"):
        with autotune(cache=path, measurer=meas, publish=False, arch_family="sm90") as t:
            assert t.resolve(gemm, SIG, 100)[0].id == WIN
    assert len(meas.calls) == 1
    assert json.loads(path.read_text()) == foreign
    assert json.loads((tmp_path / "tune.sm90.json").read_text())["env"]["arch_family"] == "sm90"


def test_failed_measurement_warns_once_and_falls_back(gemm):
    meas = FakeMeasurer(fail=True)
    with autotune(cache=None, measurer=meas, publish=False, arch_family="sm90") as t:
        with pytest.warns(AutotuneWarning, match="could not measure.*M=100.*fallback"):
            assert t.resolve(gemm, SIG, 100) is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert t.resolve(gemm, SIG, 100) is None  # not retried
    assert len(meas.calls) == 1


def test_no_ok_arm_falls_back(gemm):
    meas = FakeMeasurer(lambda sig, m, ids: "nothing-wins")
    with autotune(cache=None, measurer=lambda *a: [r for r in meas(*a) if r.config_id == "torch"],
                  publish=False, arch_family="sm90") as t:
        with pytest.warns(AutotuneWarning, match="no usable arm.*torch: incorrect"):
            assert t.resolve(gemm, SIG, 100) is None


def test_winners_are_published_to_the_user_tier_at_their_measured_size(gemm, tiers_dirs):
    with autotune(cache=None, measurer=FakeMeasurer(_pick), arch_family="sm90") as t:
        t.resolve(gemm, SIG, 100)
        t.resolve(gemm, SIG, 300)
    db = database.load(tiers_dirs / "sm90" / "gemm.json")
    entry = db.entries[SIG]
    assert [(r.m_hi, r.config_id) for r in entry.regions] == [(100, WIN), (300, WIN)]
    # the exit started a new epoch: the production path serves them, never above the measured size
    assert (selector.resolve("gemm", SIG, 90).tier, selector.resolve("gemm", SIG, 90).config.id) == ("user", WIN)
    assert selector.resolve("gemm", SIG, 200).tier == "user"
    assert selector.resolve("gemm", SIG, 301).tier == "default"


def test_publishing_to_a_disabled_user_tier_warns(gemm):
    from tunedb import settings

    with settings.override(USER_DB="off"):
        with pytest.warns(AutotuneWarning, match="did not publish 1 gemm entry.*disabled"):
            with autotune(cache=None, measurer=FakeMeasurer(_pick), arch_family="sm90") as t:
                t.resolve(gemm, SIG, 100)


def test_a_large_compile_set_is_pruned_to_the_cost_models_top_k(gemm):
    from tunedb import settings

    meas = FakeMeasurer(lambda sig, m, ids: ids[0])
    with settings.override(COMPILE_SET="all"):
        with autotune(cache=None, measurer=meas, publish=False, arch_family="sm90", top_k=6) as t:
            t.resolve(gemm, SIG, 100)
            ids = t.candidates(gemm, SIG, 100)
        with autotune(cache=None, measurer=meas, publish=False, arch_family="sm90", top_k=None) as t:
            everything = t.candidates(gemm, SIG, 100)
    configs = [c for c in ids if c not in ("default", "torch", "fused")]
    assert len(configs) == 6 and len(everything) > 20
    assert {"default", "torch"} <= set(ids) and set(configs) <= set(everything)
    assert meas.calls[0][2][:6] == tuple(configs)


def test_a_cached_config_that_cannot_serve_here_falls_back_with_one_warning(gemm, tmp_path):
    path = tmp_path / "tune.json"
    rows = {"96": {"90": {"config": "b64x64x64_w99_s3_g8", "ms": 1.0}},
            "104": {"100": {"config": "fused", "ms": 1.0}}}  # fused: tanh-GELU, not approved
    path.write_text(json.dumps({"version": 3, "env": {"arch_family": "sm90"},
                                "results": {SIG.format(): rows}}))
    with autotune(cache=path, enabled=False, publish=False, arch_family="sm90", approximate=False) as t:
        with pytest.warns(AutotuneWarning, match="b64x64x64_w99_s3_g8.*cannot serve"):
            assert t.resolve(gemm, SIG, 90) is None
        with pytest.warns(AutotuneWarning, match="'fused'.*does not apply"):
            assert t.resolve(gemm, SIG, 100) is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert t.resolve(gemm, SIG, 90) is None
    with autotune(cache=path, enabled=False, publish=False, arch_family="sm90", approximate=True) as t:
        assert t.resolve(gemm, SIG, 100)[0].id == "fused"


def test_the_default_measurer_runs_the_real_protocol(gemm):
    from tunedb.measure.timers import FakeTimer

    def cost(sig, m, cid):
        return 0.5 if cid == WIN else 1.0

    timer = FakeTimer(cost, noise_sigma=0.0)
    with autotune(cache=None, publish=False, arch_family="sm90", timer=timer,
                  working_set_bytes=1 << 20) as t:
        config, tier = t.resolve(gemm, SIG, 100)
    assert (config.id, tier) == (WIN, "autotune")
    assert WIN in timer.calls and "default" in timer.calls


def test_autotune_picks_through_the_familys_pick_rule(gemm):
    """Not a plain minimum: an arm inside the gate keeps the fallback, as a build's region would."""
    from tunedb.records import Measurement, Status

    def measurer(times):
        def measure(family, sig, m, ids, incumbent):
            return [Measurement(sig, m, cid, Status.OK, median_ms=times.get(cid, 2.0), n=9) for cid in ids]
        return measure

    with autotune(cache=None, measurer=measurer({WIN: 0.97, "torch": 1.0}), publish=False,
                  arch_family="sm90") as t:
        assert t.resolve(gemm, SIG, 8)[0].id == "torch"  # 1.03x < the 1.05x gate
    with autotune(cache=None, measurer=measurer({WIN: 0.90, "torch": 1.0}), publish=False,
                  arch_family="sm90") as t:
        assert t.resolve(gemm, SIG, 8)[0].id == WIN


def test_arms_timed_at_zero_are_no_winner_and_the_fallback_serves(gemm):
    """A timer whose baselines eat the kernel reads 0 ms for every arm (session 41, an H100): the
    shape is left to the fallback with a warning that names the times, not a ValueError from
    inside the model's forward; one arm with a real time still wins over zeros."""
    from tunedb.records import Measurement, Status

    def measurer(times):
        def measure(family, sig, m, ids, incumbent):
            return [Measurement(sig, m, cid, Status.OK, median_ms=times.get(cid, 0.0), n=9) for cid in ids]
        return measure

    with pytest.warns(AutotuneWarning, match="no usable arm.*at 0.0 ms"):
        with autotune(cache=None, measurer=measurer({}), publish=False, arch_family="sm90") as t:
            assert t.resolve(gemm, SIG, 8) is None  # the launch table's own tiers serve it
            assert t.measured == []
    with autotune(cache=None, measurer=measurer({WIN: 0.5, "torch": 1.0}), publish=False,
                  arch_family="sm90") as t:
        assert t.resolve(gemm, SIG, 8)[0].id == WIN


def test_a_decode_lane_winner_is_served_at_the_sizes_it_serves(gemm):
    """triton_decode configs (M <= 16 only) are candidates at small M; a winner is served there
    (checked at the call's M, not for every M) and never offered above 16."""
    decode = "dk1_n64x256_w4_s4"
    meas = FakeMeasurer(lambda sig, m, ids: decode if decode in ids else ids[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutotuneWarning)
        with autotune(cache=None, measurer=meas, publish=False, arch_family="sm90") as t:
            assert t.resolve(gemm, SIG, 8)[0].id == decode
            assert t.resolve(gemm, SIG, 40)[0].id != decode
    assert decode in meas.calls[0][2] and decode not in meas.calls[1][2]


def test_an_unusable_cache_and_side_file_stay_as_they_are(gemm, tmp_path):
    """The cache is corrupt and so is the <stem>.<arch> file an earlier run wrote beside it:
    neither is overwritten (the side file was, after a warning); the results go to the next name."""
    path, side = tmp_path / "tune.json", tmp_path / "tune.sm90.json"
    path.write_text("{corrupt")
    side.write_text("{also corrupt")
    with pytest.warns(AutotuneWarning, match="tune.sm90.2.json"):
        with autotune(cache=path, measurer=FakeMeasurer(_pick), publish=False, arch_family="sm90") as tuner:
            tuner.resolve(gemm, SIG, 100)
    assert path.read_text() == "{corrupt" and side.read_text() == "{also corrupt"
    assert WIN in (tmp_path / "tune.sm90.2.json").read_text()


def test_an_unwritable_cache_path_is_refused_on_entry(gemm, tmp_path):
    (tmp_path / "afile").write_text("")
    meas = FakeMeasurer(_pick)
    with pytest.raises(DatabaseError, match="cannot be written"):
        with autotune(cache=tmp_path / "afile" / "tune.json", measurer=meas, publish=False, arch_family="sm90"):
            pass
    assert meas.calls == []  # nothing measured before the refusal


def test_one_tuner_re_entered_inside_itself_keeps_measuring_until_the_outer_exit(gemm, tmp_path):
    """A helper that opens the caller's tuner again: its exit must not end the caller's context
    (the override, the measuring hooks) nor flush and publish halfway through it."""
    meas, pub = FakeMeasurer(_pick), Publisher()
    tuner = autotune(cache=tmp_path / "tune.json", measurer=meas, publisher=pub, arch_family="sm90")
    with tuner:
        with tuner:
            assert len(launch_table._overrides) == 1
        assert len(launch_table._overrides) == 1 and pub.calls == []
        config, tier = tuner.resolve(gemm, SIG, 100)
        assert (config.id, tier) == (WIN, "autotune")
    assert launch_table._overrides == [] and len(pub.calls) == 1


@pytest.mark.parametrize("call", ["autotune", "prewarm"])
def test_an_unknown_keyword_is_named_with_the_allowed_ones(call):
    import tunedb

    with pytest.raises(TypeError, match=rf"{call}\(\) got an unexpected keyword argument 'foo'; .*measurer, publisher"):
        if call == "autotune":
            tunedb.autotune(foo=1)
        else:
            tunedb.prewarm(torch.nn.Linear(2, 2), torch.randn(1, 2), foo=1)
