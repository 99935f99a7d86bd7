"""One launch of a CUDA-tier linalg arm at one cell, for Nsight Compute to read (hardware counters:
occupancy, warp stall reasons, issue rate). A GPU program, run under ncu:

    ncu --clock-control none -k tunedb_linalg --launch-skip 1 --launch-count 1 --set full -o REP \
        python bench/linalg_ncu.py --op potrf --dtype fp32 --n 64 --arm cuda_p1_w2 --batch 16384

The kernel is launched twice (the first a warm-up that ncu skips) on fresh SPD inputs
(kernels_check.make_inputs); --min-blocks N compiles the source with __launch_bounds__(threads, N)
(the register cap bench/block_bounds.py times), so the report shows what the cap changes.
"""
from __future__ import annotations

import argparse
import sys


def patched_source(op: str, arm: str, n: int, dtype: str, min_blocks: int) -> str:
    from tunedb.families.linalg import kernels_cuda as kc

    text = kc.arm_source(op, arm, n, dtype)
    if min_blocks:
        for old in ("__launch_bounds__(WARPS * 32)", "__launch_bounds__(BLOCKT, 1)", "__launch_bounds__(NTHREADS)"):
            if old in text:
                return text.replace(old, old[:-1].split(",")[0] + f", {min_blocks})", 1)
        raise SystemExit(f"{arm}: no launch bounds to patch in its source")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", required=True, choices=("potrf", "posv", "trsv"))
    ap.add_argument("--dtype", required=True, choices=("fp32", "fp64"))
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--arm", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--min-blocks", type=int, default=0)
    args = ap.parse_args()
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg import kernels_cuda as kc

    why = kc.arm_invalid(args.op, args.arm, args.n, args.dtype)
    if why:
        raise SystemExit(why)
    kern = torch.cuda._compile_kernel(patched_source(args.op, args.arm, args.n, args.dtype, args.min_blocks),
                                      "tunedb_linalg")
    ins = check.make_inputs(args.op, args.batch, args.n, args.dtype, device="cuda", seed=args.n)
    out = torch.empty_like(ins[0] if args.op == "potrf" else ins[1])
    info = torch.empty((args.batch,), dtype=torch.int32, device="cuda")
    b = ins[1] if args.op in ("posv", "trsv") else ins[0]
    grid, threads = kc.geometry(args.op, args.arm, args.n, args.batch)
    dynamic = kc.arm_smem(args.op, args.arm, args.n, args.dtype) if kc.blocked.parse(args.arm) else 0
    if dynamic:
        kc._allow_smem(kern, dynamic)
    for _ in range(2):
        kern(grid=(grid, 1, 1), block=(threads, 1, 1), args=[ins[0], b, out, info, args.batch], shared_mem=dynamic)
    torch.cuda.synchronize()
    print(f"{args.op} {args.dtype} n={args.n} {args.arm} b={args.batch} min_blocks={args.min_blocks}: "
          f"grid {grid} x {threads} threads, info max {int(info.max())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
