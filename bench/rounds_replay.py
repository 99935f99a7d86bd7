"""Replay recorded measurement logs through the protocol under three stopping rules: the GPU time
spent in timing rounds and whether each protocol call's winner and verdict stay the same.

    PYTHONPATH=src python bench/rounds_replay.py [--alpha 0.5] LOG[.gz][:SKIP] ...

`old`: rounds stop when every live arm's median is pinned to REL_TOL (or at the cap);
`new`: stats.settled, which also stops when the other arms are clearly behind the leader;
`gate`: `new`, and, for a signature the log measured at one M only, also once no arm can beat
torch by the build's 1.05x gate (stats.gate_decided: what the build runs since session 8 on a
signature's sole point). A call's verdict is what partition() serves at its M from the call's
own medians alone (the 3% band, then the gate): for a one-point signature, what the build serves.
Each protocol call of the log (consecutive records of one signature and M with one recorded
round count: a point's first measurement and its cross-evaluation are separate calls) is run
again with ReplayTimer (the recorded samples, cycled) at --alpha, the eager share the log was
measured with (0 for the shipped censuses, 0.5 for e2e's tunes); a round's GPU time is each live
arm's recorded median x its calls per graph. SKIP drops the log's first records (an earlier run
appended to the same log). Pure Python: runs on the CPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunedb.build import partition  # noqa: E402
from tunedb.families.contract import PickRule  # noqa: E402
from tunedb.measure import protocol, stats  # noqa: E402
from tunedb.measure.arms import Arm, Problem  # noqa: E402
from tunedb.measure.log import read_measurements  # noqa: E402
from tunedb.measure.timers import ReplayTimer  # noqa: E402
from tunedb.records import Point  # noqa: E402


def _pinned_only(samples, scores, rel_tol, min_n) -> bool:
    return all(stats.converged(v, rel_tol, min_n) for v in samples.values())


RULE = PickRule()  # the GEMM family's pick rule: torch fallback, 1.05x gate, 3% tie band
FALLBACK, GATE = RULE.fallback, RULE.min_speedup
RULES = {"old": dict(settled=_pinned_only), "new": {}, "gate": dict(fallback_gate=(FALLBACK, GATE))}


def verdict(sig, m: int, scores: dict) -> str:
    """What partition() serves at M from these objectives alone (band, set cover, gate)."""
    part = partition.partition([Point(sig, m)], {(m, c): t for c, t in scores.items()}, RULE)
    return part.regions[0].config_id


def load(spec: str) -> list:
    """The measurements of LOG[:SKIP] (SKIP: records dropped from the front)."""
    path, _, skip = spec.partition(":") if not Path(spec).exists() else (spec, "", "")
    return read_measurements(path)[int(skip or 0):]


def calls(meas: list) -> list[tuple[object, int, dict]]:
    """(signature, M, {config id: Measurement}) per protocol call, in log order."""
    out: list[tuple[object, int, dict]] = []
    last = None
    for x in meas:
        key = (x.signature, x.m, dict(x.env).get("rounds"))
        if key != last:
            out.append((x.signature, x.m, {}))
            last = key
        out[-1][2][x.config_id] = x
    return out


def sole_point_signatures(points: list) -> set:
    """The signatures a list of calls measured at one M only: where the build's gate decides."""
    ms: dict = {}
    for sig, m, _ in points:
        ms.setdefault(sig, set()).add(m)
    return {sig for sig, seen in ms.items() if len(seen) == 1}


def replay(meas: list, alpha: float) -> dict[str, tuple[float, list]]:
    timer, points = ReplayTimer(meas), calls(meas)
    sole = sole_point_signatures(points)
    out = {}
    for name, kw in RULES.items():
        gpu_ms, winners = 0.0, []
        for sig, m, arms in points:
            ids = tuple(Arm(c) for c, x in arms.items() if x.status.ok)
            if not ids:
                continue
            rule = {k: v for k, v in kw.items() if k != "fallback_gate" or sig in sole}
            got = protocol.measure_problem(Problem(sig, m, ids), timer=timer, alpha=alpha, **rule)
            for x in got:
                gpu_ms += x.n * x.median_ms * dict(arms[x.config_id].env).get("calls_per_graph", 8)
            scores = {x.config_id: x.objective(alpha) for x in got if x.status.ok}
            winners.append((sig, m, protocol.best(list(got), alpha).config_id, scores))
        out[name] = (gpu_ms, winners)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+", help="measurement logs (.jsonl or .jsonl.gz), each optionally :SKIP")
    p.add_argument("--alpha", type=float, default=0.5, help="the eager share the logs were measured with")
    p.add_argument("--show", action="store_true", help="list the calls whose winner changes")
    args = p.parse_args(argv)
    print(f"{'log':48s} {'calls':>5s} {'old s':>7s} {'new s':>7s} {'gate s':>7s} {'new/old':>7s} "
          f"{'gate/new':>8s} {'winner old=new':>14s} {'verdict new=gate':>16s}")
    changed = []
    for spec in args.logs:
        res = replay(load(spec), args.alpha)
        (g0, w0), (g1, w1), (g2, w2) = res["old"], res["new"], res["gate"]
        same = sum(a[2] == b[2] for a, b in zip(w0, w1))
        moved = [verdict(a[0], a[1], a[3]) != verdict(b[0], b[1], b[3]) for a, b in zip(w1, w2)]
        kept = len(moved) - sum(moved)
        changed += [(Path(spec).name, "old->new", a, b[2]) for a, b in zip(w0, w1) if a[2] != b[2]]
        changed += [(Path(spec).name, "new->gate", a, b[2]) for a, b, x in zip(w1, w2, moved) if x]
        print(f"{Path(spec).name[:48]:48s} {len(w0):5d} {g0 / 1e3:7.2f} {g1 / 1e3:7.2f} {g2 / 1e3:7.2f} "
              f"{g1 / g0 if g0 else 1.0:7.2f} {g2 / g1 if g1 else 1.0:8.2f} {same:>8d}/{len(w0)} "
              f"{kept:>10d}/{len(w1)}")
    for log, what, (sig, m, old, scores), new in changed if args.show else ():
        # the new winner priced by the earlier rule's (longer-sampled) medians
        print(f"  {log} {what}: {sig.format()} M={m}: {old} -> {new} ({scores[new] / scores[old]:.3f}x the earlier "
              f"winner's objective by the earlier rule's medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
