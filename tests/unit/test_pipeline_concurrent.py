"""Two `tunedb build --simulate` processes of different censuses into one directory keep both."""
from __future__ import annotations

import os
import subprocess
import sys

from tunedb import database
from tunedb.census import write_census
from tunedb.records import Point, ShapeSet, Signature

A = Signature.make("gemm", "gemm", "half", N=512, K=256)
B = Signature.make("gemm", "gemm", "half", N=1024, K=768)


def test_two_concurrent_builds_into_one_directory(tmp_path):
    files = []
    for name, sig in (("a", A), ("b", B)):
        path = tmp_path / f"{name}.json"
        write_census(path, ShapeSet((Point(sig, 16, 0.5, 4), Point(sig, 48, 0.5, 4)), name, (("mode", "offline"),)))
        files.append(path)
    env = dict(os.environ, TUNEDB_USER_DB=str(tmp_path / "user"), TUNEDB_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-m", "tunedb", "build", "--census", str(f), "--out", str(tmp_path / "out"),
                               "--simulate", "--top-k", "4", "--run-id", f"run-{i}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, f in enumerate(files)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "wrote " in out and "measurement log:" in out
    db = database.load(tmp_path / "out" / "sm90" / "gemm.json")
    assert set(db.entries) == {A, B}
    assert all(e.source == "simulated" for e in db.entries.values())
    assert not (tmp_path / "user").exists()  # simulated results never go into a tier
    # both runs appended to the one log beside the file, each under its own run id
    from tunedb.measure.log import read_log

    runs = {r.run_id for r in read_log(tmp_path / "out" / "measurements.jsonl")}
    assert runs == {"run-0", "run-1"}
