"""Where the eager host time of a tensor-parallel shard's decode step goes (bench/tp_shard_model.py):
cProfile's top functions by own time over 200 eager forwards at one row, plain and
tunedb.optimize() (shipped tables, USER_DB off), and per-forward wall times of both.

    PYTHONPATH=src:bench python bench/tp_shard_profile.py [--tp 4] [--batch 1] [--walls]
"""
from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import time

import torch
from tp_shard_model import WIDTH, build


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--walls", action="store_true",
                    help="only per-forward wall times, paired rounds, with Python's garbage collector on and off")
    a = ap.parse_args(argv)
    import tunedb
    from tunedb import settings
    from tunedb.runtime import selector

    with settings.override(USER_DB="off"), torch.no_grad():
        selector.reload()
        plain = build(4, a.tp)
        tuned = tunedb.optimize(copy.deepcopy(plain))
        x = torch.randn(a.batch, 1, WIDTH, device="cuda", dtype=torch.bfloat16)
        if a.walls:
            _walls({"plain": plain, "tunedb": tuned}, x, a.calls)
            return 0
        for name, m in (("plain", plain), ("tunedb", tuned)):
            for _ in range(20):
                m(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                m(x)
            torch.cuda.synchronize()
            print(f"{name}: {(time.perf_counter() - t0) / a.calls * 1e6:.1f} us per eager forward")
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                m(x)
            torch.cuda.synchronize()
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(40 if name == "tunedb" else 12)
            if name == "tunedb":
                pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
            print(s.getvalue()[:16000])
        print(str(tunedb.tuning_report())[:1500])
    return 0


def _walls(models, x, calls: int, rounds: int = 9) -> None:
    """us per eager forward, median of paired rounds in shuffled order, gc on and off: whether the
    collector's passes (more Python objects made per call) are part of the excess."""
    import gc
    import random
    import statistics

    per = {f"{name} gc {state}": [] for name in models for state in ("on", "off")}
    rng = random.Random(0)
    for m in models.values():
        for _ in range(20):
            m(x)
    for _ in range(rounds):
        plan = list(per)
        rng.shuffle(plan)
        for label in plan:
            name, _, state = label.split()
            m = models[name]
            (gc.disable if state == "off" else gc.enable)()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                m(x)
            torch.cuda.synchronize()
            per[label].append((time.perf_counter() - t0) / calls * 1e6)
            gc.enable()
    for label, v in per.items():
        print(f"{label}: {statistics.median(v):.1f} us per eager forward")


if __name__ == "__main__":
    raise SystemExit(main())
