"""The statistic a pick compared is the one serving compares (issue 19, session 17).

`tunedb linalg tune --pick low` decides a cell on each arm's lower quartile; the table keeps the
medians ([median_ms, sigma_ms, n]) and, beside them, the statistic (`_stat`) and its value per arm
(`_stat:<arm>`). runtime/serving's support rule (an arm serves a batch between two measured ones
where it beat torch at both) then compares lower quartiles with lower quartiles; a table written
before (no `_stat`) still loads and is read on its medians.
"""
from __future__ import annotations

import argparse
import json

import pytest

from tunedb.database import schema
from tunedb.families.linalg import cli, configs, ladder, pick
from tunedb.families.linalg.ladder import Cell, FakeTimer
from tunedb.records import Entry, Region, Signature
from tunedb.runtime import serving

from fake_family import FakeFamily


def _entry(evidence) -> Entry:
    sig = Signature.parse("fake|op=mm|dt=half|N=128|K=64")
    return Entry(sig, (Region(16, "a"), Region(None, "big")), evidence)


def test_point_times_reads_the_picks_statistic_and_never_mixes_it_with_medians():
    point = {"a": [2.0, 0.1, 9], "torch": [1.9, 0.1, 9], "_stat": "q25", "_stat:a": 1.5, "_stat:torch": 1.8}
    assert serving.point_times(point, "a", "torch") == (1.5, 1.8)
    old = {"a": [2.0, 0.1, 9], "torch": [1.9, 0.1, 9]}  # a table of the median rule: no _stat
    assert serving.point_times(old, "a", "torch") == (2.0, 1.9)
    partial = {**point}
    del partial["_stat:torch"]  # one arm without its statistic: medians for both
    assert serving.point_times(partial, "a", "torch") == (2.0, 1.9)
    assert serving.point_times({"a": [2.0, 0.1, 9], "torch": "incorrect"}, "a", "torch") is None


def test_support_between_measured_batches_follows_the_statistic_the_pick_used():
    """`big` won M=256 only; M=100 lies between M=16 and M=256, so `big` serves it only where it
    beat torch at both. At M=16 its median is behind torch (a burst) while its lower quartile,
    what the pick compared, is ahead: it serves. Without `_stat` the medians decide: torch."""
    fam = FakeFamily()
    # big at 256 slower than torch at 16: the bound between them (rule 2b) proves nothing here
    at_256 = {"big": [4.0, 0, 9], "torch": [8.0, 0, 9]}
    burst_16 = {"a": [1.0, 0, 9], "big": [3.5, 0.9, 9], "torch": [3.0, 0, 9]}
    low_16 = {**burst_16, "_stat": "q25", "_stat:a": 0.9, "_stat:big": 2.1, "_stat:torch": 2.9}
    assert serving.unsupported(fam, _entry({"M=16": low_16, "M=256": at_256}), 100, "big") is None
    assert serving.unsupported(fam, _entry({"M=16": burst_16, "M=256": at_256}), 100, "big") is not None
    # and the other way: medians ahead, lower quartiles behind: the pick's statistic says no
    ahead = {"a": [1.0, 0, 9], "big": [2.0, 0, 9], "torch": [3.0, 0, 9],
             "_stat": "q25", "_stat:a": 0.9, "_stat:big": 1.9, "_stat:torch": 1.8}
    assert serving.unsupported(fam, _entry({"M=16": ahead, "M=256": at_256}), 100, "big") is not None


def test_between_two_regions_the_config_serves_where_its_time_above_beats_torchs_below():
    """Rule 2b: `big` was timed only at M=256 (the other region's winner `a` at M=16); at M=100
    it takes at most its M=256 time and torch at least its M=16 time, so where the first beats
    the second by the gate `big` serves; where it does not, torch."""
    fam = FakeFamily()
    at_16 = {"a": [1.0, 0, 9], "torch": [3.0, 0, 9]}
    assert serving.unsupported(fam, _entry({"M=16": at_16, "M=256": {"big": [2.0, 0, 9], "torch": [9.0, 0, 9]}}),
                               100, "big") is None
    assert serving.unsupported(fam, _entry({"M=16": at_16, "M=256": {"big": [3.5, 0, 9], "torch": [9.0, 0, 9]}}),
                               100, "big") is not None


def _cost(cell: Cell, arm: str) -> float:
    return {"torch": 50.0, configs.EAGER_ONLY: 400.0}.get(arm, 10.0 + len(arm) * 0.1)


def _args(out, pick_rule):
    return argparse.Namespace(prebuild=False, quick=True, legs="solver", ops="potrf", dtypes=None, margin=None,
                              rounds=9, max_arms=4, build_jobs=None, dry_run=False, out=str(out), seed=0, n=None,
                              pick=pick_rule, launch_jitter_ns=None, max_rounds=None, samples=None)


def test_a_low_tune_writes_the_lower_quartiles_it_decided_on_and_the_table_loads(tmp_path):
    out = tmp_path / "low.json"
    assert cli.tune(_args(out, "low"), timer=FakeTimer(_cost, seed=5, noise=0.05), arch_family="sm90") == 0
    table = schema.load(out, "linalg", "sm90")  # the schema takes the new keys
    points = [p for e in table.entries.values() for p in e.evidence.values()]
    assert points and all(p["_stat"] == pick.LOW_STAT for p in points)
    for p in points:
        arms = [a for a, v in p.items() if not a.startswith("_") and isinstance(v, list) and a != configs.EAGER_ONLY]
        assert serving.STAT_KEY + configs.EAGER_ONLY not in p  # never decides a cell, never served
        assert arms and all(isinstance(p[serving.STAT_KEY + a], float) for a in arms)
        # noise 5%: the lower quartile sits below the median for the arms
        assert sum(p[serving.STAT_KEY + a] < p[a][0] for a in arms) >= len(arms) - 1


def test_the_lower_quartile_in_the_evidence_is_the_one_the_pick_compared():
    cell = Cell("potrf", "fp32", 8, 4096)
    res = ladder.measure_cell(FakeTimer(_cost, seed=6, noise=0.05), cell, ("torch", "warp_p2_w1", "lane_p4_w1"),
                              decide="low")
    from tunedb.families.linalg import table

    point = table._evidence(res, "ring")
    for arm, samples in res.samples.items():
        assert arm != configs.EAGER_ONLY
        assert point[serving.STAT_KEY + arm] == pytest.approx(pick.quantile(samples, 0.25) * 4096 / 1e6, abs=1e-6)


def test_a_median_tune_writes_no_statistic_and_an_old_table_still_loads(tmp_path):
    out = tmp_path / "median.json"
    assert cli.tune(_args(out, "median"), timer=FakeTimer(_cost, seed=5), arch_family="sm90") == 0
    raw = json.loads(out.read_text())
    assert not any(k.startswith("_stat") for e in raw["entries"].values() for p in e["evidence"].values() for k in p)
    shipped = schema.load(cli.target("system", "sm90"), "linalg", "sm90")  # s15 E's: medians only
    assert shipped.entries
