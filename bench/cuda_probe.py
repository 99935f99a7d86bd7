"""Does the CUDA C++ tier of potrf/posv/trsv (kernels_cuda.py) beat the shipped table's pick and torch?
A probe, ONE run on the GPU:

    PYTHONPATH=src python bench/cuda_probe.py --quick --out $OUT/cuda_probe.json

For potrf and posv (--ops: trsv too), fp32 and fp64, n in (4, 8, 16, 32) (--ns), batch in (256, 4096, 65536), on a fresh
input set a cell (kernels_check.make_inputs), the arms:
  torch        launch(op, "torch", ...) (cholesky_ex, + two solve_triangular for posv);
  shipped      the arm the shipped sm90 table serves at the cell (tunedb.recommend);
  cuda*        every config of the CUDA tier its predicate admits (cuda_pP_wW, cudas_pP_wW, cudaw_pP_wW,
               cudat_tTS, cudab_bNB_wW),
               through launch().
Every arm's result is first checked with kernels_check.within_torch (an arm that fails or raises
is skipped and reported); then timed in a CUDA graph of 10 calls, warmed up, replayed 9 times (5
with --quick): the median microseconds a call (arm_probe.graph_us). Not in place. The shipped
Triton picks compile first in worker processes; the CUDA kernels compile in process (NVRTC).
Prints a table (us a call; x = shipped / arm: over 1 is faster than the shipped pick) and writes
the JSON to --out after every cell.
"""
from __future__ import annotations

import sys
import time

from arm_probe import cli, sweep, time_arms

OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
NS = (4, 8, 16, 32)
BATCHES = (256, 4096, 65536)


def shipped(op: str, dt: str, n: int, batch: int) -> str:
    from tunedb.families.linalg.plan import recommend

    return recommend(op, dt, n, batch).arm


def cell(op: str, dt: str, n: int, batch: int, replays: int) -> dict:
    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg import kernels_cuda as kc
    from tunedb.families.linalg.launch import launch

    ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n + batch)
    pick = shipped(op, dt, n, batch)
    arms = {"torch": lambda: launch(op, "torch", *ins)}
    if pick != "torch":
        arms[pick] = lambda: launch(op, pick, *ins)
    for cid in kc.config_ids(op, n, dt):
        arms[cid] = (lambda cid: lambda: launch(op, cid, *ins))(cid)
    row = {"op": op, "dtype": dt, "n": n, "batch": batch, "shipped": pick, "us": {}, "calls": {},
           "residual": {}, "skipped": {}}
    return time_arms(row, op, dt, ins, arms, replays)


def show(row: dict) -> str:
    base = row["us"].get(row["shipped"]) or row["us"].get("torch")
    parts = [f"{row['op']:5} {row['dtype']} n={row['n']:3} b={row['batch']:5} [{row['shipped']}]"]
    for aid, us in row["us"].items():
        parts.append(f"{aid} {us:8.2f}" + (f" ({base / us:.2f}x)" if base else ""))
    for aid, why in row["skipped"].items():
        parts.append(f"{aid} SKIP[{why[:60]}]")
    return " | ".join(parts)


def main() -> int:
    args, ops, dts, ns, batches, out = cli(__doc__.splitlines()[0], OPS, DTYPES, NS, BATCHES)
    import torch

    from tunedb.families.linalg import kernels_cuda as kc

    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "nvrtc": kc.available(),
           "rows": [], "compile": []}
    t0 = time.time()
    jobs = sorted({(op, shipped(op, dt, n, b), n, dt) for op in ops for dt in dts for n in ns for b in batches})
    cells = [(op, dt, n, b) for op in ops for dt in dts for n in ns for b in batches]
    sweep(cells, cell, show, doc, out, t0, 5 if args.quick else 9, jobs, f"shipped picks (NVRTC: {doc['nvrtc']})",
          args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
