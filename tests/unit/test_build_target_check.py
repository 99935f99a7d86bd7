"""A build checks its target file before measuring (issue 17): a corrupt, other-arch or
unwritable target used to be found only by the final write, after all the measuring."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedb import pipeline, settings
from tunedb.measure.timers import FakeTimer
from tunedb.errors import CorruptDatabaseError, DatabaseError, ValidatorMismatchError
from tunedb.records import Point, ShapeSet, Signature

DATA = Path(__file__).resolve().parents[1] / "data" / "db"
QKV = Signature.make("gemm", "gemm", "half", N=512, K=256)


class CountingTimer(FakeTimer):
    """The fake timer, counting how often the build asked it for a time."""

    calls = 0

    def __init__(self):
        def cost(sig, m, cid):
            CountingTimer.calls += 1
            return 0.010 if cid == "torch" else 0.011

        super().__init__(cost, seed=1)


@pytest.fixture
def out(tmp_path):
    CountingTimer.calls = 0
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path / "out"


def build(out: Path, **kw):
    opts = pipeline.BuildOptions(out=str(out), simulate=True, top_k=2, **kw)
    return pipeline.build([("c", ShapeSet((Point(QKV, 16, 1.0, 4),)))], opts, timer=CountingTimer())


def target(out: Path) -> Path:
    path = out / "sm90" / "gemm.json"
    path.parent.mkdir(parents=True)
    return path


def test_a_corrupt_target_stops_the_build_before_measuring(out):
    target(out).write_text('{"schema": 1, "kernel_fam')
    with pytest.raises(CorruptDatabaseError, match="nothing was measured.*--fresh"):
        build(out)
    assert CountingTimer.calls == 0
    assert not (out / "measurements.jsonl").exists()


def test_an_other_arch_target_stops_the_build_before_measuring(out):
    raw = json.loads((DATA / "a.json").read_text())
    raw["arch_family"] = "sm80"
    target(out).write_text(json.dumps(raw))
    with pytest.raises(ValidatorMismatchError, match="arch_family.*nothing was measured"):
        build(out)
    assert CountingTimer.calls == 0


def test_a_target_that_is_a_directory_stops_the_build(out):
    target(out).mkdir()
    with pytest.raises(DatabaseError, match="is a directory.*nothing was measured"):
        build(out)
    assert CountingTimer.calls == 0


def test_fresh_replaces_a_corrupt_target(out):
    path = target(out)
    path.write_text("not json")
    res = build(out, fresh=True)
    assert res.path == path and CountingTimer.calls > 0


def test_dry_run_does_not_touch_the_target(out):
    build(out, dry_run=True)
    assert not out.exists()
