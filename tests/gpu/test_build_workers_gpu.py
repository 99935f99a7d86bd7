"""`tunedb build --workers N` on real GPUs (Ray actors, each measuring in its own worker process):
every signature measured once, by an actor on a GPU of the driver's SKU, into one log and one file.
Needs Ray importable (on the device: bench/ray_carry.sh's tarball on PYTHONPATH); about 60-90 s
on one H200 (Ray start, compiles, ~50 arms)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ray")

pytestmark = pytest.mark.gpu

CENSUS = Path(__file__).resolve().parents[2] / "bench" / "census" / "llama-3-8b_decode.json"


def test_workers_build_on_every_local_gpu(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    n = torch.cuda.device_count()
    # cache the arch profile from a process that exits, so the driver holds no CUDA context
    subprocess.run([sys.executable, "-c", "from tunedb import arch; arch.current_profile()"], check=True)
    cmd = [sys.executable, "-m", "tunedb", "build", "--census", str(CENSUS), "--thin", "--max-points", "2",
           "--top-k", "2", "--out", str(tmp_path / "db"), "--workers", str(n), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    res = json.loads("\n".join(lines[lines.index("{"):]))
    assert len(res["workers"]) == n and not res["lost"]
    assert len(res["plan"]) == 5 and all(w["points"] > 0 for w in res["workers"].values())
    assert sum(w["points"] for w in res["workers"].values()) >= sum(len(p["M"]) for p in res["plan"])
    assert all(0 < w["busy_fraction"] <= 1 for w in res["workers"].values())
    logged = (tmp_path / "db" / "measurements.jsonl").read_text().splitlines()
    assert len(logged) == res["arms_measured"] > 0
    from tunedb import database

    f = database.load(res["path"])
    assert len(f.entries) == 5 and all(e.source == "build" for e in f.entries.values())
