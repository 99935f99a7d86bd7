"""CPU seconds of a cold preset census, by stage, as `tunedb tune PRESET` takes it (no GPU needed).

    PYTHONPATH=src python bench/census_cpu.py --out census_cpu.json [--workload whisper-base]
        [--src src --src /path/to/other/src] [--repeat 5] [--no-tune]

Each run is a fresh Python process with a fresh TUNEDB_CACHE_DIR and TUNEDB_USER_DB. A run
times in CPU seconds of that process (time.process_time, so that other load on a shared machine
does not count), in order: `import torch`; `import tunedb.pipeline`; the mirror census (what
build/speculative.py takes first on a GPU); then the census tune asks for (impl auto,
fused, cached: what pipeline.take_census does), split into the model library's import
(presets._choose), the model build, tunedb.optimize, the probes (one forward per key under
the recorder) and the rest (traffic replay, weighting, the cache write). Unless --no-tune, a
second fresh process times the whole `python -m tunedb tune PRESET` (on a CPU: census and the
printed plan; on a GPU host it would measure: pass --no-tune there, bench/tune_wall.py times
that). Several --src trees (e.g. a checkout of main and this branch) are run
interleaved, rep by rep, so that a busy machine slows them alike; the table shows medians.
Expect about 10 s per run on a 2-core CPU (whisper-base), 2-3 s on the H200 host's cores.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, sys, time
T = {}
clock = time.process_time  # CPU seconds of this process: another process's load does not count
t0 = clock()
def lap(k):
    global t0
    t = clock(); T[k] = t - t0; t0 = t
import torch; lap("import torch")
from tunedb import pipeline
from tunedb.census import presets, probe
lap("import tunedb")
workload = sys.argv[1]
inc = {}
def timed(name, fn):  # inclusive seconds of every call of fn
    def wrapper(*a, **k):
        t = clock()
        try:
            return fn(*a, **k)
        finally:
            inc[name] = inc.get(name, 0.0) + clock() - t
    return wrapper
presets._choose = timed("library import", presets._choose)
probe._optimized = timed("optimize", probe._optimized)
probe.probe = timed("probes", probe.probe)
w = presets.workload(workload)
object.__setattr__(w, "build", timed("build", w.build))
def census(label, **kw):
    global t0
    inc.clear()
    t = clock()
    pipeline.take_census(workload, fused=True, **kw)
    total = clock() - t
    lib = inc.get("library import", 0.0)
    T[label + ": library import"] = lib
    T[label + ": build"] = inc.get("build", 0.0) - lib
    T[label + ": optimize"], T[label + ": probes"] = inc.get("optimize", 0.0), inc.get("probes", 0.0)
    T[label + ": rest"] = total - inc.get("build", 0.0) - T[label + ": optimize"] - T[label + ": probes"]
    T[label] = total
    t0 = clock()
census("mirror census", impl="mirror")  # what build/speculative.py takes first on a GPU
census("census", cached=True)  # the census tune asks for
T["python total"] = sum(T[k] for k in ("import torch", "import tunedb", "mirror census", "census"))
print("STAGES " + json.dumps(T))
"""

_PARTS = ("library import", "build", "optimize", "probes", "rest")
STAGES = ("import torch", "import tunedb", *(f"mirror census: {k}" for k in _PARTS[1:]), "mirror census",
          *(f"census: {k}" for k in _PARTS), "census", "python total")


def fresh_env(src: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(src), TUNEDB_CACHE_DIR=tempfile.mkdtemp(prefix="census-cpu-"),
                TUNEDB_USER_DB=tempfile.mkdtemp(prefix="census-cpu-user-"), COLUMNS="200")


def stages(src: Path, workload: str) -> dict[str, float]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, workload], env=fresh_env(src), capture_output=True,
                          text=True, timeout=600)
    wall = time.perf_counter() - t
    line = next((x for x in proc.stdout.splitlines() if x.startswith("STAGES ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"stage run failed under {src}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    out = json.loads(line[len("STAGES "):])
    out["process wall"] = wall
    return out


def tune_run(src: Path, workload: str) -> tuple[float, float]:
    """(wall s, CPU s) of one `python -m tunedb tune` (CPU: it and its reaped children)."""
    env = fresh_env(src)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tunedb", "tune", workload], env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"tune failed under {src}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="whisper-base")
    p.add_argument("--src", action="append", default=None, help="a source tree to put on PYTHONPATH (repeatable)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-tune", action="store_true", help="skip the whole-command runs")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.repeat < 1:
        raise SystemExit(f"--repeat={args.repeat} must be >= 1")
    srcs = [Path(s).resolve() for s in (args.src or [str(Path(__file__).resolve().parents[1] / "src")])]
    for s in srcs:
        if not (s / "tunedb" / "__init__.py").is_file():
            raise SystemExit(f"--src {s} holds no tunedb package")
    subprocess.run([sys.executable, "-c", "import torch, transformers, tunedb"], capture_output=True, check=False)
    runs: dict[str, list[dict[str, float]]] = {str(s): [] for s in srcs}
    for rep in range(args.repeat):
        for s in srcs:
            row = stages(s, args.workload)
            if not args.no_tune:
                row["tune wall"], row["tune cpu"] = tune_run(s, args.workload)
            runs[str(s)].append(row)
            print(f"#{rep + 1} {s}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    cols = list(STAGES) + ["process wall"] + ([] if args.no_tune else ["tune wall", "tune cpu"])
    medians = {s: {c: statistics.median(r[c] for r in rows) for c in cols} for s, rows in runs.items()}
    print(f"\nmedians of {args.repeat} ({args.workload}, {len(os.sched_getaffinity(0))} cores), seconds: "
          "the stages in CPU seconds of the stage process, walls in wall seconds, tune cpu in CPU seconds "
          "of the tune process and its children")
    print(f"{'stage':<30}" + "".join(f"{Path(s).parent.name + '/' + Path(s).name:>24}" for s in medians))
    for c in cols:
        print(f"{c:<30}" + "".join(f"{m[c]:>24.2f}" for m in medians.values()))
    Path(args.out).write_text(json.dumps({"workload": args.workload, "repeat": args.repeat,
                                          "cores": len(os.sched_getaffinity(0)), "runs": runs,
                                          "medians": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
