"""bench/tune_wall.py reads a tune's output back: its report lines and the timeline that
`tunedb tune` prints under TUNEDB_TIMELINE=1 (build/timeline.py), every line kept."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from tunedb.build import timeline

PATH = Path(__file__).resolve().parents[2] / "bench" / "tune_wall.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_tune_wall", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_timeline_marks_are_first_or_last_and_read_back(monkeypatch):
    monkeypatch.setattr(timeline, "_MARKS", {})
    timeline.mark("census end")
    timeline.mark("first compile done")
    first = timeline.marks()["first compile done"]
    time.sleep(0.01)
    timeline.mark("first compile done")  # the first one stays
    timeline.mark("last compile done", last=True)
    timeline.mark("last compile done", last=True)  # the latest wins
    timeline.mark("a stage of its own")
    marks = timeline.marks()
    assert marks["first compile done"] == first and marks["last compile done"] > first
    # printed in ORDER (first compile done before census end), unknown stages last
    assert list(marks) == ["first compile done", "census end", "last compile done", "a stage of its own"]
    back = timeline.parse(timeline.line())
    assert list(back) == list(marks)
    assert all(abs(back[k] - v) < 0.006 for k, v in marks.items())
    assert timeline.parse("census of whisper-base (offline): 32 point(s)") is None
    timeline.mark("mirror plan (measured profile)")  # a stage named with parentheses reads back too
    assert "mirror plan (measured profile)" in timeline.parse(timeline.line())


def test_the_clock_starts_with_the_process_not_the_import():
    """A process that spends 0.6 s before importing the module still counts them (the stages
    of a tune include its interpreter start and imports)."""
    import os
    import subprocess
    import sys

    code = ("import time; time.sleep(0.6); from tunedb.build import timeline; "
            "print(timeline.since_start())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(PATH.parents[1] / "src")})
    assert 0.6 <= float(out.stdout) < 60.0


def test_tune_wall_keeps_every_line_and_the_timeline():
    bench = _bench()
    out = [
        (3.0, "something printed early"),
        (17.0, "census of whisper-base (offline): 32 point(s) over 14 signature(s)"),
        (28.5, "measured 496 arm(s) in 11.3 s; log: /tmp/x/measurements.jsonl"),
        (28.5, "where the time went: setup 0.2 s, probes 1.9 s, prepare 5.0 s, rounds 1.0 s, requests 0.1 s, "
               "write 0.5 s, compile wait 2.4 s, the rest (partition, checkpoints) 0.2 s"),
        (28.6, "compile pool: 15 processes, 27 jobs (27 ok, 27 submitted before the census ended (0 of them not "
               "in the build's plan)), 153.4 s of compiling off the measuring path, measuring waited 2.4 s at 3 "
               "point(s)"),
        (28.6, "measured ahead during the census: 5 point(s) in 6.3 s; 4 reused by the build, 1 not in its plan "
               "(discarded); 28 measured after it in compile order; 2 dropped (timeout or launch error: measured "
               "again)"),
        (28.7, "timeline (s since process start): pool prestart 0.52, mirror plan 6.10, first compile submitted "
               "6.11, census end 16.90, last compile done 17.45, build end 28.40"),
    ] + [(29.0 + i, f"table row {i}") for i in range(40)]
    row = bench.parse_output(out, 0, 70.0)
    assert row["census_s"] == 17.0 and row["build_s"] == 11.3 and row["arms"] == 496
    assert row["phases"]["prepare"] == 5.0 and row["phases"]["compile wait"] == 2.4
    assert row["pool"]["jobs"] == 27 and row["pool"]["ahead"] == 27 and row["pool"]["compile_s"] == 153.4
    assert row["ahead"] == {"points": 5, "seconds": 6.3, "reused": 4, "discarded": 1, "filled": 28, "dropped": 2}
    assert row["timeline"] == {"pool prestart": 0.52, "mirror plan": 6.1, "first compile submitted": 6.11,
                               "census end": 16.9, "last compile done": 17.45, "build end": 28.4}
    assert len(row["lines"]) == len(out) and row["lines"][0] == [3.0, "something printed early"]
    assert len(row["tail"]) == 30
    assert bench._at(row, "mirror plan") == "6.1" and bench._at(row, "ahead first point") == "-"
