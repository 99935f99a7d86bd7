"""Wall time of `tunedb tune WORKLOAD` cold and warm, with and without the compile pool.

    PYTHONPATH=src python bench/tune_wall.py --out tune_wall.json [--workload whisper-base]
        [--runs pool-cold,pool-warm,serial-cold,serial-warm] [--timeout 150] [--compile-jobs N]

Each run is a fresh `python -m tunedb tune` process. Cold: a fresh TUNEDB_CACHE_DIR (arch
profile, runs), TUNEDB_USER_DB and TRITON_CACHE_DIR, so every kernel compiles; warm: the same
run again on the caches its cold run left. 'serial' sets TUNEDB_COMPILE_JOBS=0 (each kernel
compiles at its first probe, as before the pool); 'pool' leaves the pool to size itself (or
--compile-jobs N: N processes, e.g. to see whether half as many compile as fast). Prints
a table of wall time, census, and the build's compile/measure split (from tune's own report
lines); writes JSON to --out. --repeat R runs the whole list R times on fresh caches and adds
the median per run name. Before the first run an untimed `import torch, transformers, triton,
tunedb` warms the OS page cache: "cold" here means cold tunedb and Triton caches (every kernel
compiles), not a machine whose Python packages were never read from disk (session 11: the same
cold run took 30.3 s after other work and 35.1 s as a fresh machine's first command). Expect about 3 minutes on the H200 for the four runs (the serial
cold run alone about 115 s); `--runs pool-cold,pool-warm` takes under a minute.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from tunedb.build import timeline  # noqa: E402 - the tune's own timeline line, read back (no torch)

PHASE = re.compile(r"([a-z][a-z ()]*?) ([0-9.]+) s")
AHEAD = re.compile(r"(\d+) submitted before the census ended \((\d+) of them not in")
MEASURED_AHEAD = re.compile(r"measured ahead during the census: (\d+) point\(s\) in ([0-9.]+) s; (\d+) reused by "
                            r"the build, (\d+) not in its plan(?:.*?; (\d+) measured after it)?")
POOL = re.compile(r"compile pool: (\d+) processes, (\d+) jobs \((\d+) ok.*?([0-9.]+) s of compiling.*?waited ([0-9.]+) s")


def run_tune(workload: str, dirs: dict[str, Path], pool: bool, timeout: float,
             compile_jobs: int | None = None) -> dict:
    env = dict(os.environ, TUNEDB_CACHE_DIR=str(dirs["cache"]), TUNEDB_USER_DB=str(dirs["user"]),
               TRITON_CACHE_DIR=str(dirs["triton"]), COLUMNS="400", PYTHONUNBUFFERED="1", TUNEDB_TIMELINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    if pool and compile_jobs:
        env["TUNEDB_COMPILE_JOBS"] = str(compile_jobs)
    elif pool:
        env.pop("TUNEDB_COMPILE_JOBS", None)
    else:
        env["TUNEDB_COMPILE_JOBS"] = "0"
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tunedb", "tune", workload], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    try:
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = "timeout"
    return parse_output(lines, rc, time.perf_counter() - start)


def parse_output(lines: list[tuple[float, str]], rc: int | str, wall: float) -> dict:
    """One run's row from its output lines, each with its time since the process was started:
    the census line's time, tune's report lines (phases, pool, the pass measured ahead), its
    timeline (stage: seconds since its start; TUNEDB_TIMELINE=1) and every line kept."""
    row: dict = {"rc": rc, "wall_s": round(wall, 2), "census_s": None, "phases": {}, "pool": {}, "ahead": {},
                 "timeline": {}}
    for t, text in lines:
        if text.startswith("census of ") and row["census_s"] is None:
            row["census_s"] = round(t, 2)
        if text.startswith("where the time went:"):
            row["phases"] = {k.strip(): float(v) for k, v in PHASE.findall(text.split(":", 1)[1])}
        if text.startswith("measured ") and not text.startswith("measured ahead"):
            m = re.search(r"in ([0-9.]+) s", text)
            row["build_s"] = float(m.group(1)) if m else None
            m = re.search(r"measured (\d+) arm", text)
            row["arms"] = int(m.group(1)) if m else None
        m = MEASURED_AHEAD.search(text)  # points measured during the census (build/speculative.py)
        if m:
            row["ahead"] = {"points": int(m.group(1)), "seconds": float(m.group(2)), "reused": int(m.group(3)),
                            "discarded": int(m.group(4)), "filled": int(m.group(5) or 0)}
            dropped = re.search(r"; (\d+) dropped", text)
            row["ahead"]["dropped"] = int(dropped.group(1)) if dropped else 0
        m = POOL.search(text)
        if m:
            row["pool"] = dict(zip(("processes", "jobs", "ok", "compile_s", "wait_s"),
                                   (int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4)),
                                    float(m.group(5)))))
            ahead = AHEAD.search(text)  # compiles started from a mirror census's plan (build/speculative.py)
            row["pool"]["ahead"] = int(ahead.group(1)) if ahead else 0
            row["pool"]["ahead_unused"] = int(ahead.group(2)) if ahead else 0
        stages = timeline.parse(text)
        if stages is not None:
            row["timeline"] = stages
    ph = row["phases"]
    # compiling on the measuring path: serial, the first probes compile; with the pool, the waits
    row["compile_on_path_s"] = round(ph.get("probes", 0.0) + ph.get("compile wait", 0.0), 2)
    row["measure_s"] = round(sum(ph.get(k, 0.0) for k in ("prepare", "rounds", "requests")), 2)
    row["lines"] = [[round(t, 3), text] for t, text in lines]
    row["tail"] = [text for _, text in lines[-30:]]
    return row


def _at(row: dict, stage: str) -> str:
    t = row.get("timeline", {}).get(stage)
    return "-" if t is None else f"{t:.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="whisper-base")
    p.add_argument("--runs", default="pool-cold,pool-warm,serial-cold,serial-warm",
                   help="comma-separated, in order: {pool,serial}-{cold,warm}; a warm run follows its cold one")
    p.add_argument("--timeout", type=float, default=150.0, help="per run, seconds")
    p.add_argument("--compile-jobs", type=int, default=None,
                   help="pool runs: this many compile processes (default: the pool sizes itself)")
    p.add_argument("--repeat", type=int, default=1, help="run the list this many times (fresh caches each)")
    p.add_argument("--no-prewarm", action="store_true", help="skip the untimed page-cache warm-up import")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    for r in runs:
        if r not in ("pool-cold", "pool-warm", "serial-cold", "serial-warm"):
            raise SystemExit(f"--runs: {r!r} is not one of pool-cold, pool-warm, serial-cold, serial-warm")
    if args.compile_jobs is not None and args.compile_jobs < 1:
        raise SystemExit(f"--compile-jobs={args.compile_jobs} must be >= 1 (the 'serial' runs turn the pool off)")
    if args.repeat < 1:
        raise SystemExit(f"--repeat={args.repeat} must be >= 1")
    report = {"workload": args.workload, "cores": len(os.sched_getaffinity(0)), "compile_jobs": args.compile_jobs,
              "repeat": args.repeat, "runs": {}}
    if not args.no_prewarm:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, transformers, triton, tunedb"], check=False,
                       capture_output=True)
        report["prewarm_s"] = round(time.perf_counter() - t0, 2)
        print(f"page-cache warm-up import: {report['prewarm_s']} s (untimed)", flush=True)
    for rep in range(args.repeat):
        base = Path(tempfile.mkdtemp(prefix="tune-wall-"))
        for name in runs:
            kind, temp = name.split("-")
            label = name if args.repeat == 1 else f"{name}#{rep + 1}"
            dirs = {k: base / kind / k for k in ("cache", "user", "triton")}
            if temp == "warm" and not dirs["triton"].exists():
                print(f"{label}: no cold run of {kind} before it; its caches start empty", file=sys.stderr)
            if temp == "warm":  # the user tier would serve the last run's picks: measure again from none
                subprocess.run(["rm", "-rf", str(dirs["user"])], check=False)
            row = run_tune(args.workload, dirs, pool=kind == "pool", timeout=args.timeout,
                           compile_jobs=args.compile_jobs)
            report["runs"][label] = row
            Path(args.out).write_text(json.dumps(report, indent=1))  # what ran so far, should a later run hang
            print(f"{label}: rc {row['rc']}, wall {row['wall_s']} s, census {row['census_s']} s, phases {row['phases']}, "
                  f"pool {row['pool']}, ahead {row['ahead']}", flush=True)
            if row["timeline"]:
                print(f"  timeline: {row['timeline']}", flush=True)
            if row["rc"] != 0:
                print("\n".join(row["tail"]), file=sys.stderr)
    if args.repeat > 1:
        report["median_wall_s"] = {n: statistics.median(report["runs"][f"{n}#{i + 1}"]["wall_s"]
                                                        for i in range(args.repeat)) for n in runs}
    hdr = (f"{'run':<12}{'rc':>4}{'wall s':>8}{'census':>8}{'build':>7}{'compile*':>9}{'measure':>8}{'pool jobs':>10}{'pool cpu s':>11}{'ahead':>9}"
           f"{'plan@':>7}{'compiled@':>10}{'census@':>8}")
    print("\n" + hdr)
    for name, r in report["runs"].items():
        pool = r["pool"]
        print(f"{name:<12}{str(r['rc']):>4}{r['wall_s']:>8.1f}{(r['census_s'] or 0):>8.1f}{(r.get('build_s') or 0):>7.1f}"
              f"{r['compile_on_path_s']:>9.1f}{r['measure_s']:>8.1f}{str(pool.get('jobs', '-')):>10}"
              f"{str(pool.get('compile_s', '-')):>11}"
              f"{(str(r['ahead']['reused']) + '/' + str(r['ahead']['points'])) if r.get('ahead') else '-':>9}"
              + "".join(f"{_at(r, k):>{w}}" for k, w in (("mirror plan", 7), ("last compile done", 10),
                                                            ("census end", 8))))
    print("compile*: compiling on the measuring path (serial: the probes, which compile each kernel at its "
          "first launch; pool: the waits for the pool). measure: prepare + rounds + requests (the build's own). "
          "ahead: points measured during the census that the build reused / measured (a cold preset tune). "
          "plan@, compiled@, census@: seconds since tune's start at which the mirror plan was ready, the last "
          "compile finished and the census ended (its timeline; every stage is in the JSON).")
    for n, w in report.get("median_wall_s", {}).items():
        print(f"median {n} over {args.repeat}: {w:.1f} s")
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if all(r["rc"] == 0 for r in report["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
