"""Replay recorded measurement logs through the protocol under two stopping rules: the GPU time
spent in timing rounds and whether each point's winner stays the same.

    PYTHONPATH=src python bench/rounds_replay.py LOG[.gz][:SKIP] ...

`old`: rounds stop when every live arm's median is pinned to REL_TOL (or at the cap);
`new`: stats.settled, which also stops when the other arms are clearly behind the leader.
Each point (signature, M) of the log is measured again with ReplayTimer (the recorded samples,
cycled), alpha 0.5 (e2e's census); the GPU time of a round is each live arm's recorded median x
its calls per graph. SKIP drops the log's first lines (an earlier run appended to the same log).
Pure Python: runs on the CPU.
"""
from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunedb.bench import protocol, stats  # noqa: E402
from tunedb.bench.arms import Arm, Problem  # noqa: E402
from tunedb.bench.log import read_log  # noqa: E402
from tunedb.bench.timers import ReplayTimer  # noqa: E402


def _pinned_only(samples, scores, rel_tol, min_n) -> bool:
    return all(stats.converged(v, rel_tol, min_n) for v in samples.values())


RULES = {"old": _pinned_only, "new": stats.settled}


def load(spec: str) -> list:
    path, _, skip = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()[int(skip or 0):]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        tmp.write("\n".join(lines) + "\n")
    return [r.measurement for r in read_log(tmp.name)]


def replay(meas: list, alpha: float) -> dict[str, tuple[float, dict]]:
    points: dict = defaultdict(dict)
    for x in meas:
        points[(x.signature, x.m)][x.config_id] = x
    out = {}
    saved = stats.settled
    try:
        for name, rule in RULES.items():
            stats.settled = rule
            gpu_ms, winners = 0.0, {}
            for (sig, m), arms in points.items():
                ids = tuple(Arm(c) for c, x in arms.items() if x.status.ok)
                if not ids:
                    continue
                got = protocol.measure_problem(Problem(sig, m, ids), timer=ReplayTimer(meas), alpha=alpha)
                for x in got:
                    gpu_ms += x.n * x.median_ms * dict(arms[x.config_id].env).get("calls_per_graph", 8)
                winners[(sig.format(), m)] = protocol.best(list(got), alpha).config_id
            out[name] = (gpu_ms, winners)
    finally:
        stats.settled = saved
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", help="measurement logs (.jsonl or .jsonl.gz), each optionally :SKIP")
    p.add_argument("--alpha", type=float, default=0.5)
    args = p.parse_args(argv)
    print(f"{'log':60s} {'points':>6s} {'old s':>7s} {'new s':>7s} {'new/old':>7s} {'same winner':>11s}")
    for spec in args.logs:
        res = replay(load(spec), args.alpha)
        (g0, w0), (g1, w1) = res["old"], res["new"]
        same = sum(w0[k] == w1[k] for k in w0)
        print(f"{Path(spec).name[:60]:60s} {len(w0):6d} {g0 / 1e3:7.2f} {g1 / 1e3:7.2f} "
              f"{g1 / g0 if g0 else 1.0:7.2f} {same:>6d}/{len(w0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
