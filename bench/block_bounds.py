"""Does capping the CUDA tier's registers buy occupancy that pays? ONE run on the GPU:

    PYTHONPATH=src python bench/block_bounds.py --out $OUT/block_bounds.json

The block kernel (`cuda_p1_w2`, potrf / posv at n = 33..64) is compiled by ptxas at 168-254
registers a thread (NVRTC's report on the CPU), so 4-6 blocks of 64 threads share an SM, and
each block is a chain of n barriers: the SM is latency-bound with 8-12 warps. Here the kernel's
own source is compiled with `__launch_bounds__(threads, MB)` for several MB (ptxas then caps
registers at 65536 / (threads * MB), spilling what does not fit) and timed against the served
form in one CUDA graph of 10 calls each, median of 5 replays (arm_probe.graph_us); the tile
kernel (`cudat_t<TS>`) the same at n = 128. Every variant must write the served result bit for
bit (register allocation does not change the arithmetic). Prints us a call and x = served / variant.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arm_probe import eager_ms, graph_us
from linalg_ncu import patched_source

CELLS = tuple((op, dt, 64, "cuda_p1_w2", b, (5, 6, 7, 8, 10))
              for op in ("potrf", "posv") for dt in ("fp32", "fp64") for b in (256, 4096, 65536)) + (
    ("potrf", "fp32", 48, "cuda_p1_w2", 65536, (6, 8, 10, 12)),
    ("potrf", "fp32", 128, "cudat_t8", 65536, (3, 4)),
    ("posv", "fp32", 128, "cudat_t8", 65536, (3, 4)),
    ("posv", "fp64", 128, "cudat_t4", 65536, (3, 4)),
    ("potrf", "fp64", 128, "cudat_t4", 65536, (3, 4)),
)
# --wide: the wide-warp kernel (one problem a warp of 32 threads: MB 12 caps at 168 registers, 16 at 128)
WIDE_CELLS = tuple((op, dt, 64, "cudaw_p1_w1", b, (12, 16)) for op in ("potrf", "posv") for dt in ("fp32",)
                   for b in (4096, 65536)) + (("posv", "fp64", 64, "cudaw_p1_w1", 4096, (8,)),)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--wide", action="store_true", help="the wide-warp kernel's cells (WIDE_CELLS)")
    args = ap.parse_args()
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg import kernels_cuda as kc

    rows = []
    for op, dt, n, cid, batch, bounds in WIDE_CELLS if args.wide else CELLS:
        ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n)
        out = torch.empty_like(ins[0] if op == "potrf" else ins[1])
        info = torch.empty((batch,), dtype=torch.int32, device="cuda")
        b = ins[1] if op == "posv" else ins[0]
        grid, block = kc.geometry(op, cid, n, batch)
        row = {"op": op, "dtype": dt, "n": n, "config": cid, "batch": batch, "us": {}, "equal": {}}
        ref = None
        for mb in (0,) + bounds:
            try:
                kern = torch.cuda._compile_kernel(patched_source(op, cid, n, dt, mb), "tunedb_linalg")
            except Exception as exc:  # a cap ptxas refuses: reported, not fatal
                row["us"][str(mb)] = None
                row.setdefault("errors", {})[str(mb)] = f"{type(exc).__name__}: {exc}"[:300]
                continue

            def call(kern=kern):
                kern(grid=(grid, 1, 1), block=(block, 1, 1), args=[ins[0], b, out, info, batch])

            call()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.clone()
            else:
                row["equal"][str(mb)] = bool(torch.equal(out, ref))
            row["us"][str(mb)] = graph_us(call, 5, eager_ms(call))[0]
        rows.append(row)
        base = row["us"]["0"]
        cols = " ".join(f"mb{k}={v:9.1f} ({base / v:4.2f}x){'' if row['equal'].get(k, True) else ' DIFFERS'}"
                        for k, v in row["us"].items() if k != "0" and v)
        print(f"{op} {dt} n={n:<3} {cid:10} b={batch:<6} served {base:9.1f} | {cols}", flush=True)
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
