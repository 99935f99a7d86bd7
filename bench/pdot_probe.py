"""Does the panel packing's update on tl.dot (kernels_pdot.py) beat the panel packing and torch? A
probe, ONE run on the GPU:

    PYTHONPATH=src python bench/pdot_probe.py --quick --out $OUT/pdot.json

For potrf and posv, fp32 and fp64, n in (64, 128), batch in (256, 4096, 65536), on a fresh input
set a cell (kernels_check.make_inputs), the arms:
  torch            launch(op, "torch", ...) (cholesky_ex, + two solve_triangular for posv);
  panel_wW          the panel packing,
  pdot_wW           kernels_pdot, input_precision "ieee" (fp32: FMA; fp64: DMMA),
  pdottf_wW         fp32 only: input_precision "tf32x3" (tensor-core passes; wgmma at 4 warps),
                    every config of the three packings that kernels_space admits, through launch().
Every arm's result is first checked with kernels_check.within_torch (an arm that fails or
raises is skipped and reported); then timed in a CUDA graph of 10 calls (fewer where one call
takes over 2 ms, so the big cells stay in budget), warmed up, replayed 9 times (5 with --quick):
the median microseconds a call. Not in place: the inputs are never consumed. The Triton kernels
compile first in parallel worker processes (Triton's on-disk cache), so the budget goes to the
timing. (Call D of session 20 ran this probe at commit 361d19d, when pdot was not yet in the space:
it launched the kernels itself, with the same meta, and named the tf32x3 arms pdot_tf_wW.) Prints a table (us a call, x torch: under 1 is faster) and writes the JSON to --out
after every cell.
"""
from __future__ import annotations

import sys
import time

from arm_probe import cli, sweep, time_arms

OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
NS = (64, 128)
BATCHES = (256, 4096, 65536)
def timed_configs(op: str, n: int, dt: str) -> list[str]:
    """The panel, pdot and pdottf configs kernels_space admits at (op, n, dt)."""
    from tunedb.families.linalg import kernels_space as space

    return [c.id for c in space.config_space(op, n, dt) if c.packing in ("panel", *space.PDOT_PACKINGS)]


def cell(op: str, dt: str, n: int, batch: int, replays: int) -> dict:
    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n + batch)
    arms = {"torch": lambda: launch(op, "torch", *ins)}
    for cid in timed_configs(op, n, dt):
        arms[cid] = (lambda cid: lambda: launch(op, cid, *ins))(cid)
    row = {"op": op, "dtype": dt, "n": n, "batch": batch, "us": {}, "calls": {}, "residual": {}, "skipped": {}}
    return time_arms(row, op, dt, ins, arms, replays)


def show(row: dict) -> str:
    t = row["us"].get("torch")
    panel = {k: v for k, v in row["us"].items() if k.startswith("panel")}
    best_panel = min(panel, key=panel.get) if panel else None
    parts = [f"{row['op']:5} {row['dtype']} n={row['n']:3} b={row['batch']:5}"]
    for aid, us in row["us"].items():
        mark = "*" if aid == best_panel else ""
        parts.append(f"{aid}{mark} {us:9.1f}" + (f" ({us / t:.2f}x)" if t else ""))
    for aid, why in row["skipped"].items():
        parts.append(f"{aid} SKIP[{why[:60]}]")
    return " | ".join(parts)


def main() -> int:
    args, ops, dts, ns, batches, out = cli(__doc__.splitlines()[0], OPS, DTYPES, NS, BATCHES)
    import torch

    from tunedb.families.linalg import kernels_space as space

    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "B": space.PDOT_B,
           "KC": space.PDOT_KC, "rows": [], "compile": []}
    t0 = time.time()
    jobs = [(op, cid, n, dt) for op in ops for dt in dts for n in ns for cid in timed_configs(op, n, dt)]
    cells = [(op, dt, n, b) for op in ops for dt in dts for n in ns for b in batches]
    sweep(cells, cell, show, doc, out, t0, 5 if args.quick else 9, jobs, "kernels (panel, pdot, pdottf)", args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
