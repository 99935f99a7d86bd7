"""Where the eager host time of a tensor-parallel shard's decode step goes (bench/tp_shard_model.py):
cProfile's top functions by own time over 200 eager forwards at one row, plain and
tunedb.optimize() (shipped tables, USER_DB off), and per-forward wall times of both.

    PYTHONPATH=src:bench python bench/tp_shard_profile.py [--tp 4] [--batch 1]
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
    a = ap.parse_args(argv)
    import tunedb
    from tunedb import settings
    from tunedb.runtime import selector

    with settings.override(USER_DB="off"), torch.no_grad():
        selector.reload()
        plain = build(4, a.tp)
        tuned = tunedb.optimize(copy.deepcopy(plain))
        x = torch.randn(a.batch, 1, WIDTH, device="cuda", dtype=torch.bfloat16)
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


if __name__ == "__main__":
    raise SystemExit(main())
