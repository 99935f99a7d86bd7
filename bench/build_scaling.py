"""How a build scales over GPUs (issue 22): the Llama-3-8B decode census built with --workers N
for each N given, each in a fresh `tunedb build` process on a local Ray cluster; wall time,
points/s, arms/s, each GPU's busy fraction, and each file's regions against the 1-GPU file
(`tunedb diff`'s region changes; exit 0 = same regions). --workers takes GPU counts, and
a count suffixed "k" (e.g. 2k) is that build again with one measuring actor SIGKILLed --kill-after
S seconds in (the build must still finish: the signature the actor held is re-queued on another).
Prints a table and writes DIR/build_scaling.json.

    python bench/build_scaling.py --workers 1,2 --out /tmp/scaling            # full census (~24 min on 1 H200)
    python bench/build_scaling.py --workers 1 --quick --out /tmp/scaling      # one GPU, < 3 min
    python bench/build_scaling.py --workers 1,2,2k --quick --kill-after 20 --out /tmp/scaling
    python bench/build_scaling.py --workers 1,2,2k --max-points 6 --top-k 4 --kill-after 30 --out /tmp/s
    python bench/build_scaling.py --workers 1,2,4,8,8k --census bench/census/llama-3-8b_decode.json \
        --census bench/census/whisper-large-v3_offline.json --top-k 8 --out /tmp/s8   # issue 23
    python bench/build_scaling.py --workers 1,2 --simulate --simulate-delay 20 --out /tmp/s  # CPU

Needs Ray importable (pip install 'tunedb[ray]'; on the device: bench/ray_carry.sh's tarball on
PYTHONPATH). --quick: 2 points per signature, cost-model top-4 (about 90 arms); --max-points N /
--top-k K thin the census the same way at other sizes (every build of one run gets the same points).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CENSUS = ROOT / "bench" / "census" / "llama-3-8b_decode.json"
QUICK = ["--thin", "--max-points", "2", "--top-k", "4"]


def actor_pids() -> list[int]:
    """This user's Ray measuring-actor processes (Ray titles them ray::MeasuringActor...)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if d.stat().st_uid != os.getuid():
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith("ray::MeasuringActor"):
            out.append(int(d.name))
    return sorted(out)


def kill_one_actor(after_s: float, done: threading.Event, killed: list[int]) -> None:
    """SIGKILL one measuring actor `after_s` seconds after the actors appear (Ray's start is
    not the build's)."""
    while not actor_pids():
        if done.wait(0.05):
            return
    if done.wait(after_s):
        return
    pids = actor_pids()
    if pids:
        os.kill(pids[-1], signal.SIGKILL)
        killed.append(pids[-1])


def build(n: int, kill: bool, args: argparse.Namespace, out: Path) -> dict:
    run_id = f"scaling-w{n}{'k' if kill else ''}-{int(time.time())}"
    cmd = [sys.executable, "-m", "tunedb", "build", *[a for c in args.census for a in ("--census", c)], "--out", str(out),
           "--fresh", "--workers", str(n), "--run-id", run_id, "--json"]
    if args.quick:
        cmd += QUICK
    elif args.max_points or args.top_k:
        cmd += (["--thin", "--max-points", str(args.max_points)] if args.max_points else [])
        cmd += (["--top-k", str(args.top_k)] if args.top_k else [])
    if args.simulate:
        cmd += ["--simulate", "--simulate-delay", str(args.simulate_delay)]
    if args.gate_noise is not None:
        cmd += ["--gate-noise", str(args.gate_noise)]
    killed: list[int] = []
    done = threading.Event()
    killer = None
    if kill:
        killer = threading.Thread(target=kill_one_actor, args=(args.kill_after, done, killed), daemon=True)
        killer.start()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    done.set()
    if proc.returncode != 0:
        raise SystemExit(f"--workers {n} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    # Ray's raylet may print a line about the killed actor to stdout: the JSON starts at "{"
    lines = proc.stdout.splitlines()
    res = json.loads("\n".join(lines[lines.index("{"):]))
    points = sum(len(r["M"]) for r in res["plan"])
    # measuring time: first signature handed out to last result (Ray's start and the write excluded)
    secs = res["phase_seconds"]["actors"]
    return {"workers": n, "killed": kill, "wall_s": round(wall, 2), "build_s": res["seconds"], "measure_s": round(secs, 3),
            "ray_start_s": round(res["phase_seconds"]["ray start"], 3), "points": points,
            "arms": res["arms_measured"], "points_per_s": round(points / secs, 3),
            "arms_per_s": round(res["arms_measured"] / secs, 3),
            "busy": {w: v["busy_fraction"] for w, v in res["workers"].items()},
            "killed_pid": killed[0] if killed else None, "lost": res["lost"], "path": res["path"]}


def compare(a: str, b: str) -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    from region_agreement import agreement

    from tunedb import database

    got = agreement(database.load(a), database.load(b))
    rc = subprocess.run([sys.executable, "-m", "tunedb", "diff", a, b], capture_output=True, text=True).returncode
    return {"identical": got["identical"], "shared": got["shared"], "diff_rc": rc,
            "points_same": got["points_same"], "points": got["points"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2",
                    help="comma-separated GPU counts; Nk = N GPUs with one actor killed (default 1,2)")
    ap.add_argument("--kill-after", type=float, default=20.0, metavar="S",
                    help="for an Nk build: SIGKILL one actor S seconds after the actors start (default 20)")
    ap.add_argument("--out", required=True, help="directory for the files and build_scaling.json")
    ap.add_argument("--census", action="append", default=None,
                    help="a census file; repeat it to build several together (default: the Llama-3-8B decode census)")
    ap.add_argument("--quick", action="store_true", help="2 points per signature, top-4 (about 90 arms)")
    ap.add_argument("--max-points", type=int, default=0, metavar="N", help="thin to N points per signature")
    ap.add_argument("--top-k", type=int, default=0, metavar="K", help="cost-model candidates per point")
    ap.add_argument("--gate-noise", type=float, default=None, metavar="X", help="tunedb build --gate-noise X")
    ap.add_argument("--simulate", action="store_true", help="fake timer (CPU)")
    ap.add_argument("--simulate-delay", type=float, default=20.0, metavar="MS",
                    help="--simulate: sleep per arm on the actors (default 20)")
    args = ap.parse_args(argv)
    args.census = args.census or [str(CENSUS)]
    runs = []
    for x in (x.strip() for x in args.workers.split(",")):
        if not x:
            continue
        kill = x.endswith("k")
        if not x.rstrip("k").isdigit() or int(x.rstrip("k")) < 1 or (kill and int(x[:-1]) < 2):
            ap.error(f"--workers entry {x!r}: a GPU count >= 1, or Nk with N >= 2 (N GPUs, one actor killed)")
        runs.append((int(x.rstrip("k")), kill))
    out = Path(args.out)
    if not args.simulate:
        # Cache this GPU's arch profile from a process that then exits: a driver that measured
        # it itself would hold a CUDA context on GPU 0, which actor 0's gate counts as foreign.
        subprocess.run([sys.executable, "-c", "from tunedb import arch; arch.current_profile()"], check=True)
    rows, seen = [], {}
    for n, kill in runs:
        name = f"w{n}{'k' if kill else ''}"
        seen[name] = seen.get(name, 0) + 1
        # a repeated entry (e.g. 1,2,2k,2) is a second build of the same points: the run's own noise floor
        rows.append(build(n, kill, args, out / (name if seen[name] == 1 else f"{name}_{seen[name]}")))
        rows[-1]["repeat"] = seen[name]
        print(f"--workers {n}{' (one actor killed)' if kill else ''}: measured in {rows[-1]['measure_s']:.1f} s",
              file=sys.stderr)
    base = next((r for r in rows if r["workers"] == 1 and not r["killed"]), rows[0])
    for r in rows:
        r["speedup"] = round(base["measure_s"] / r["measure_s"], 3)
        r["vs_1gpu"] = compare(base["path"], r["path"]) if r is not base else None
    for r in rows:  # each repeat against its own first build: two builds of one kind, one run
        first = next(x for x in rows if (x["workers"], x["killed"], x.get("repeat")) == (r["workers"], r["killed"], 1))
        r["vs_first_of_kind"] = compare(first["path"], r["path"]) if r.get("repeat", 1) > 1 and first is not base else None
    print(f"{'GPUs':>4} {'measure s':>9} {'wall s':>7} {'points':>6} {'pts/s':>7} {'arms/s':>7} "
          f"{'speedup':>7} {'busy per GPU':<20} {'regions vs 1 GPU':<30} killed")
    for r in rows:
        busy = " ".join(f"{100 * v:.0f}%" for v in r["busy"].values())
        cmp_ = (f"{r['vs_1gpu']['identical']}/{r['vs_1gpu']['shared']} sigs, "
                f"{100 * r['vs_1gpu']['points_same'] / max(1, r['vs_1gpu']['points']):.1f}% pts, rc {r['vs_1gpu']['diff_rc']}"
                if r["vs_1gpu"] else "-")
        print(f"{str(r['workers']) + ('k' if r['killed'] else '') + ('#' + str(r['repeat']) if r.get('repeat', 1) > 1 else ''):>4} {r['measure_s']:>9.1f} {r['wall_s']:>7.1f} {r['points']:>6} {r['points_per_s']:>7.2f} "
              f"{r['arms_per_s']:>7.1f} {r['speedup']:>7.2f} {busy:<20} {cmp_:<30} "
              f"{r['killed_pid'] or '-'}{' (lost: ' + str(len(r['lost'])) + ')' if r['lost'] else ''}")
        if r.get("vs_first_of_kind"):
            v = r["vs_first_of_kind"]
            print(f"     against the first {r['workers']}-GPU build of this run: {v['identical']}/{v['shared']} sigs, "
                  f"{100 * v['points_same'] / max(1, v['points']):.1f}% pts")
    out.mkdir(parents=True, exist_ok=True)
    (out / "build_scaling.json").write_text(json.dumps({"census": args.census, "quick": args.quick, "max_points": args.max_points, "top_k": args.top_k,
                                                         "gate_noise": args.gate_noise,
                                                         "simulate": args.simulate, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
