"""Rule 2b of measured support (runtime/serving._bounded_between) on the device: at batches
between two measured ones where the shipped linalg table's regions have different winners, what
serving gives now (the region's kernel, where its time above beats torch's below) against what
it gave before (the library arm, torch), timed in the same run.

    python bench/linalg_between.py [--batches 512,1024,2048,8192,16384,32768] [--out F.json]

For every (cell, batch) whose served arm the rule changed: the tuned op (tunedb's linalg op,
the kernel serving) and the torch arm, each the median per-call time of 20 calls captured in a
CUDA graph over 7 replays (a torch arm that cannot be captured is timed eagerly: marked `eager`).
The table prints both and their ratio; the JSON keeps every row.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graph_timing import replay_ms  # noqa: E402


def changed_points(batches: list[int]) -> list[tuple[object, int, str]]:
    """(signature, batch, config) where rule 2b alone lets the region's config serve."""
    from tunedb.database.schema import load
    from tunedb.families import get
    from tunedb.runtime import serving

    fam = get("linalg")
    db = load(Path(serving.__file__).resolve().parents[1] / "db" / "sm90" / "linalg.json")
    real = serving._bounded_between
    out = []
    for sig, entry in sorted(db.entries.items(), key=lambda kv: str(kv[0])):
        for b in batches:
            cid = entry.lookup(b, False)
            if cid is None or serving.unsupported(fam, entry, b, cid) is not None:
                continue
            serving._bounded_between = lambda *a: False
            try:
                before = serving.unsupported(fam, entry, b, cid)
            finally:
                serving._bounded_between = real
            if before is not None:
                out.append((sig, b, cid))
    return out


def time_eager(fn, reps: int = 7, n: int = 20) -> float:
    import torch

    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / n)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="512,1024,2048,8192,16384,32768")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from tunedb.families.linalg import ops as la
    from tunedb.families.linalg import problems

    points = changed_points([int(b) for b in args.batches.split(",")])
    print(f"{len(points)} (cell, batch) points where rule 2b changed the served arm", flush=True)
    rows = []
    for sig, b, cid in points:
        (inputs, _kw) = problems.make_inputs(sig, b, "cuda", 0)
        op = getattr(la, sig.op)
        tuned = lambda: op(*inputs)  # noqa: E731
        base = lambda: problems.torch_arm(sig.op, *inputs)  # noqa: E731
        for f in (tuned, base):
            f()
        torch.cuda.synchronize()
        t_ms = replay_ms(lambda i: tuned(), 20)
        how = "graph"
        try:
            b_ms = replay_ms(lambda i: base(), 20)
        except Exception:  # noqa: BLE001 - an arm capture refuses is timed eagerly, and marked
            torch.cuda.synchronize()
            b_ms, how = time_eager(base), "eager"
        rows.append(dict(cell=str(sig), batch=b, served=cid, tuned_us=t_ms * 1e3, torch_us=b_ms * 1e3,
                         x_torch=b_ms / t_ms, torch_timing=how))
        print(f"{str(sig):40s} batch {b:6d} {cid:14s} {t_ms * 1e3:9.2f} us  torch {b_ms * 1e3:9.2f} us "
              f"({how})  x{b_ms / t_ms:6.2f}", flush=True)
    if rows:
        gm = math.exp(statistics.fmean(math.log(r["x_torch"]) for r in rows))
        worst = min(r["x_torch"] for r in rows)
        print(f"\n{len(rows)} points: served over torch geomean {gm:.2f}x, min {worst:.2f}x "
              f"({sum(r['x_torch'] < 1 for r in rows)} below 1.0x)")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
