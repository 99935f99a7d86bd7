"""`tunedb build --replay LOG` (build/replay.py): a table rebuilt from a recorded measurement log
on a machine without the GPU, with the recorded build's plan and numbers (session 13 lost a device
call's table while its log came back)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedb import pipeline, settings
from tunedb.errors import BuildError
from tunedb.records import Point, ShapeSet, Signature

QKV = Signature.make("gemm", "gemm", "half", N=512, K=256)
CENSUS = [("c", ShapeSet((Point(QKV, 16, 1.0, 4), Point(QKV, 256, 1.0, 4))))]


@pytest.fixture
def recorded(tmp_path):
    """A simulated build's file and its log, the log restamped as if an H200 had measured it."""
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        res = pipeline.build(CENSUS, pipeline.BuildOptions(out=str(tmp_path / "a"), simulate=True, top_k=4))
    log = tmp_path / "a" / "measurements.jsonl"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    for line in lines:
        line["provenance"].update(torch="2.11.0+cu130", triton="3.6.0", cuda="13.0", gpu_name="NVIDIA H200")
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path, res, log


def replay(tmp_path: Path, log: Path, census=CENSUS, **kw):
    opts = pipeline.BuildOptions(out=str(tmp_path / "b"), replay=str(log), **kw)
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        return pipeline.build(census, opts)


def test_a_replay_writes_the_recorded_builds_regions_from_its_numbers(recorded):
    tmp_path, first, log = recorded
    # the plan is the log's, not this machine's ranking (another --top-k is refused: session 53)
    again = replay(tmp_path, log)
    a, b = (json.loads(r.path.read_text()) for r in (first, again))
    assert a["entries"].keys() == b["entries"].keys()
    for sig, entry in a["entries"].items():
        assert b["entries"][sig]["regions"] == entry["regions"]
        assert b["entries"][sig]["evidence"] == entry["evidence"]
    assert again.arms_measured == first.arms_measured
    # the file names the environment that measured, not this machine's
    assert b["validators"]["torch"] == "2.11.0+cu130" and b["validators"]["sku"] == "NVIDIA H200"
    assert b["validators"]["impl_hash"] == a["validators"]["impl_hash"]
    replayed = [json.loads(x) for x in (tmp_path / "b" / "measurements.jsonl").read_text().splitlines()]
    assert replayed and all(r["provenance"]["gpu_name"] == "NVIDIA H200" for r in replayed)


def test_a_point_the_log_lacks_stops_the_replay_naming_it(recorded):
    tmp_path, _, log = recorded
    census = [("c", ShapeSet((Point(QKV, 16, 1.0, 4), Point(QKV, 4096, 1.0, 4))))]
    with pytest.raises(BuildError, match="no measurement of .*N=512.* at M=4096"):
        replay(tmp_path, log, census=census, fill=False)


def test_replay_refuses_simulate_and_a_missing_log(recorded, tmp_path):
    with pytest.raises(BuildError, match="--replay rebuilds from a log's numbers"):
        replay(tmp_path, recorded[2], simulate=True)
    with pytest.raises(BuildError, match="no such measurement log"):
        replay(tmp_path, tmp_path / "nope.jsonl")


def test_a_log_of_several_builds_replays_the_latest_that_measured_the_census(tmp_path):
    """--out DIR appends every build written there to one log: the replay takes the latest run
    that measured the census's points, not the run with the most records."""
    wide = Signature.make("gemm", "gemm", "half", N=256, K=512)
    big = [("c", ShapeSet((*CENSUS[0][1].points, Point(wide, 16, 1.0, 4), Point(wide, 256, 1.0, 4))))]
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        pipeline.build(big, pipeline.BuildOptions(out=str(tmp_path / "a"), simulate=True, top_k=4, seed=1,
                                                  noise=0.3, fresh=True))
        last = pipeline.build(CENSUS, pipeline.BuildOptions(out=str(tmp_path / "a"), simulate=True, top_k=4,
                                                            seed=9, noise=0.3, fresh=True))
    again = replay(tmp_path, tmp_path / "a" / "measurements.jsonl", fresh=True)
    want, got = (json.loads(r.path.read_text())["entries"] for r in (last, again))
    assert got.keys() == want.keys()
    for sig, entry in want.items():
        assert got[sig]["evidence"] == entry["evidence"]


def test_a_build_log_records_its_implementation_and_arch_and_the_replay_keeps_them(recorded):
    tmp_path, _, log = recorded
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert {line["provenance"]["arch"] for line in lines} == {"sm90"}
    assert all(line["provenance"]["impl_hash"] for line in lines)
    # measured under other kernels: the replayed table says so (it reads stale here)
    for line in lines:
        line["provenance"]["impl_hash"] = "0123456789ab"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    written = json.loads(replay(tmp_path, log).path.read_text())
    assert written["validators"]["impl_hash"] == "0123456789ab"
    # built for another arch: the replay refuses to write it into this one's file
    for line in lines:
        line["provenance"]["arch"] = "sm80"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(BuildError, match="measured for sm80 .*pass --arch sm80"):
        replay(tmp_path, log)


def test_a_simulated_builds_log_replays_as_simulated_and_never_into_a_tier(recorded):
    """The log's measurements carry the fake timer (--simulate): the replay's entries are marked
    simulated, as that build's were, and the tiers refuse them (they served as measured)."""
    tmp_path, _, log = recorded
    again = replay(tmp_path, log)
    assert {e["source"] for e in json.loads(again.path.read_text())["entries"].values()} == {"simulated"}
    opts = pipeline.BuildOptions(out="user", replay=str(log))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        with pytest.raises(BuildError, match="simulated log .* refuses --out user"):
            pipeline.build(CENSUS, opts)
    assert not (tmp_path / "user").exists() or not list((tmp_path / "user").rglob("*.json"))


def test_a_link_loop_at_the_target_is_refused_not_replaced(recorded):
    tmp_path, _, log = recorded
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "gemm.json").symlink_to("gemm.json")
    opts = pipeline.BuildOptions(out=str(loop / "gemm.json"), replay=str(log))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        with pytest.raises(Exception, match="unreadable|symbolic links|cannot be resolved"):
            pipeline.build(CENSUS, opts)
    assert (loop / "gemm.json").is_symlink()
