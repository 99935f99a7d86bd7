"""Where a tune's measuring time goes on the GPU, step by step.

    PYTHONPATH=src python bench/tune_profile.py --log LOG.jsonl.gz [--alpha 0.5] [--out prof.json]

1. A bare start in a fresh interpreter: `import torch`, CUDA's first allocation, `import triton`,
   Triton's cache key and driver helpers, each timed (what a measuring worker pays before its
   first result).
2. Measuring workers started in turn with and without the family's warm_start thread
   (StartRequest(warm=...)), alternating so the disk cache favours neither: each one's start,
   first probe and the rest of the probes of the log's first point.
3. The protocol in this process over every point of a recorded log (its signatures, M and
   config ids, --alpha its eager share, weights cold where the log rotated copies), with and
   without the build's fallback gate, under cProfile: the prepare and rounds seconds, and the
   functions where the time goes.
Prints tables; writes JSON to --out.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rounds_replay import FALLBACK, GATE, calls, load, sole_point_signatures  # noqa: E402

BARE = """
import time
t = [time.perf_counter()]
import torch
t.append(time.perf_counter())
torch.empty(1, device="cuda")
t.append(time.perf_counter())
import triton
t.append(time.perf_counter())
from triton.runtime.cache import triton_key
triton_key()
t.append(time.perf_counter())
from triton.runtime.driver import driver
driver.active.utils
t.append(time.perf_counter())
print(" ".join(f"{b - a:.3f}" for a, b in zip(t, t[1:])))
"""
BARE_STEPS = ("import torch", "CUDA (first allocation)", "import triton", "triton_key()", "driver helpers")


def bare_start() -> dict[str, float]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", BARE], capture_output=True, text=True, check=True).stdout.split()
    res = dict(zip(BARE_STEPS, map(float, out)))
    res["process wall"] = round(time.perf_counter() - t0, 3)
    return res


def worker_start(warm: bool, point) -> dict[str, float]:
    from tunedb.measure.protocol import ProbeRequest, StartRequest
    from tunedb.measure.worker import Worker

    sig, m, arms = point
    w = Worker()
    try:
        t0 = time.perf_counter()
        res = w.run(StartRequest("gemm", warm=warm))
        t1 = time.perf_counter()
        ids = [c for c in arms if c != FALLBACK]
        first = w.run(ProbeRequest("gemm", sig, m, ids[0]))
        t2 = time.perf_counter()
        for cid in ids[1:]:
            w.run(ProbeRequest("gemm", sig, m, cid))
        t3 = time.perf_counter()
    finally:
        w.close()
    if not (res.status.ok and first.status.ok):
        raise SystemExit(f"worker start failed: {res.detail or first.detail}")
    return {"warm": warm, "start": round(t1 - t0, 3), "first probe": round(t2 - t1, 3),
            f"other {len(ids) - 1} probes": round(t3 - t2, 3), "total": round(t3 - t0, 3)}


def in_process(points, alpha: float, gate: bool, top: int) -> tuple[dict, str]:
    import torch

    from tunedb import families
    from tunedb.measure.protocol import measure_point

    fam = families.get("gemm")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    phases: dict[str, float] = {}
    rounds = []
    prof = cProfile.Profile()
    sole = sole_point_signatures(points)
    for sig, m, arms in points:
        cold = any(x.l2 == "cold" for x in arms.values())
        # as the build: the gate only decides a signature's sole point
        kw = dict(fallback_gate=(FALLBACK, GATE)) if gate and sig in sole else {}
        prof.enable()
        got = measure_point(fam, sig, m, list(arms), alpha=alpha, working_set_bytes=4 * l2 if cold else None,
                            phases=phases, **kw)
        torch.cuda.synchronize()
        prof.disable()
        rounds.append(dict(got[0].env)["rounds"])
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return {"gate": gate, "rounds": rounds, **{k: round(v, 3) for k, v in phases.items()}}, text.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", required=True, help="a tune's measurement log (.jsonl or .jsonl.gz)")
    p.add_argument("--alpha", type=float, default=0.5, help="the eager share the log was measured with")
    p.add_argument("--starts", type=int, default=2, help="workers started with and without the warm thread, each")
    p.add_argument("--top", type=int, default=30, help="cProfile rows")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    points = calls(load(args.log))
    report: dict = {"bare": bare_start()}
    print("bare start (s): " + ", ".join(f"{k} {v}" for k, v in report["bare"].items()))
    report["workers"] = []
    for i in range(2 * args.starts):
        row = worker_start(warm=i % 2 == 0, point=points[0])
        report["workers"].append(row)
        print("worker: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    report["in_process"] = []
    for gate in (False, True, False, True):  # the first pass loads every binary; compare the later two
        row, text = in_process(points, args.alpha, gate, args.top)
        report["in_process"].append(row)
        print("in process: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    print(text)  # the last pass's profile
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
