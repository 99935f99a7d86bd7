"""prewarm(): measure uncovered must-tune points (weakest, heaviest first), publish, strict mode."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime_fakes import FakeMeasurer, gemm  # noqa: F401  (fixture)
from tunedb import database
from tunedb.runtime import selector
from tunedb.errors import UncoveredShapeError
from tunedb.records import Entry, Point, Region, ShapeSet, Signature
from tunedb.families.gemm.patching import optimize
from tunedb.runtime.prewarm import prewarm

A = Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32")
B = Signature.parse("gemm|op=gemm_act|dt=bf16|N=128|K=64|act=silu|bias=1")
WIN = "b32x64x128_w4_s3_g8"


def _pick(sig, m, ids):
    return WIN if WIN in ids else ids[0]


def _census():
    return ShapeSet((
        Point(A, 16, weight=1.0, must_tune=True),
        Point(A, 64, weight=5.0, must_tune=True),
        Point(B, 32, weight=3.0, must_tune=True),
        Point(B, 500, weight=9.0, must_tune=False),  # not captured: prewarm leaves it
    ))


def test_measures_uncovered_must_tune_points_heaviest_first_and_publishes(gemm, tiers_dirs):
    cfg = gemm.parse_config(WIN)
    database.write_entries("user", "gemm", "sm90", [Entry(A, (Region(16, WIN),))], [cfg])
    selector.reload()
    meas = FakeMeasurer(_pick)
    result = prewarm(_census(), budget_s=60, measurer=meas, arch_family="sm90")
    assert [(str(sig), m) for sig, m, _ids, _inc in meas.calls] == [(str(A), 64), (str(B), 32)]
    assert {(str(p.signature), p.m) for p in result.measured} == {(str(A), 64), (str(B), 32)}
    assert result.uncovered == () and not result.budget_exhausted
    # published, and a new epoch started: the user tier now answers every must-tune point
    for sig, m in ((A, 16), (A, 64), (B, 32)):
        assert selector.resolve("gemm", sig, m).tier == "user"
    assert selector.resolve("gemm", B, 500).tier == "default"
    assert "3 must-tune points, 2 measured, 0 uncovered" in result.summary()


def test_strict_raises_on_points_left_uncovered_after_the_budget(gemm):
    meas = FakeMeasurer(_pick)
    with pytest.raises(UncoveredShapeError, match=r"3 must-tune points.*budget exhausted.*N=128.*M=32"):
        prewarm(_census(), budget_s=0, strict=True, measurer=meas, arch_family="sm90")
    assert meas.calls == []
    result = prewarm(_census(), budget_s=0, measurer=meas, arch_family="sm90")
    assert len(result.uncovered) == 3 and result.budget_exhausted


def test_strict_passes_when_every_point_got_covered(gemm):
    result = prewarm(list(_census().points), budget_s=60, strict=True, measurer=FakeMeasurer(_pick),
                     arch_family="sm90")
    assert len(result.measured) == 3 and result.uncovered == ()


def test_example_inputs_are_run_to_find_the_points(gemm):
    model = optimize(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32, bias=False)))
    model = model.to(torch.bfloat16)
    meas = FakeMeasurer(_pick)
    result = prewarm(model, (torch.randn(2, 5, 32, dtype=torch.bfloat16),), budget_s=60,
                     measurer=meas, arch_family="sm90")
    assert sorted((str(p.signature), p.m, p.calls) for p in result.points) == [
        ("gemm|op=gemm_act|dt=bf16|N=64|K=32|act=gelu|bias=1", 10, 1),
        ("gemm|op=gemm|dt=bf16|N=32|K=64", 10, 1),
    ]
    assert len(meas.calls) == 2 and result.uncovered == ()


def test_a_model_without_tuned_ops_is_a_clear_error(gemm):
    with pytest.raises(ValueError, match="no tuned-op call.*optimize"):
        prewarm(nn.Linear(4, 4), (torch.randn(1, 4),), measurer=FakeMeasurer())
    with pytest.raises(ValueError, match="budget_s=-1"):
        prewarm(_census(), budget_s=-1)


def test_prewarm_compiles_every_point_in_the_pool_before_measuring_it(gemm, tiers_dirs, tmp_path, monkeypatch):
    """With a compile pool (TUNEDB_COMPILE_JOBS), each point's non-sentinel candidates are
    compiled before its measurement starts; configs `tunedb prebuild` compiled are left out."""
    from test_compile_pool import MarkerJob
    from tunedb.records import SENTINELS

    root = tmp_path / "compiled"
    root.mkdir()
    name = lambda sig, cid: f"{abs(hash(str(sig))) % 10**8}-{cid}"  # noqa: E731
    monkeypatch.setattr(gemm, "compile_jobs", lambda arch, sig, ids: [MarkerJob(str(root), name(sig, c), 0.02)
                                                                       for c in ids], raising=False)
    prebuilt = {"b64x64x32_w4_s3_g8"}
    monkeypatch.setattr(gemm, "prebuilt_configs", lambda arch: prebuilt, raising=False)
    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", "2")
    early = []

    class Checking(FakeMeasurer):
        def __call__(self, family, sig, m, config_ids, incumbent):
            early.extend(c for c in config_ids if c not in SENTINELS and c not in prebuilt
                         and not (root / name(sig, c)).exists())
            return super().__call__(family, sig, m, config_ids, incumbent)

    meas = Checking(_pick)
    result = prewarm(_census(), budget_s=60, measurer=meas, arch_family="sm90")
    assert len(meas.calls) == 3 and len(result.measured) == 3
    assert not early
    compiled = {p.name for p in root.iterdir()}
    assert compiled and not any(n.endswith("b64x64x32_w4_s3_g8") for n in compiled)
