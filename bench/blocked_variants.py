"""The blocked kernel's (`cudab_b<NB>_w<W>`, kernels_cuda_blocked.py) compile-time variants side by
side, ONE run on the GPU:

    PYTHONPATH=src python bench/blocked_variants.py --out $OUT/blocked_variants.json

For potrf / posv, fp32 / fp64, n = 128 (and 64), batch 256 / 4096 / 65536, at W = 4 and 8 warps:
the kernel as the tier compiles it ("tier": LOOKAHEAD = 1, warp 0 factoring panel P + 1's diagonal
tile beside panel P's bulk update, and registers capped by launch bounds for MINB blocks an SM)
against the same source with the cap lifted (MINB 1: "nocap") and without the lookahead ("plain":
diagonal tile, panel rows, whole update, three barriers a panel, as session 24 call 6 shipped).
Session 24 call 5 measured the same way an earlier form solving the panel's rows through the
diagonal tile's inverse (INV = 1) against substitution: 1.15-1.8x slower, removed. Each variant's
result is checked against torch (kernels_check.within_torch) before it is timed in one CUDA graph
of 10 calls, median of 5 replays (arm_probe.graph_us). Prints us a call and x = tier / variant.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arm_probe import eager_ms, graph_us

import re

VARIANTS = {"tier": lambda src: src,
            "nocap": lambda src: re.sub(r"#define MINB \d+", "#define MINB 1", src),
            "plain": lambda src: "#define LOOKAHEAD 0\n" + re.sub(r"#define MINB \d+", "#define MINB 1", src)}
CELLS = [(op, dt, n, b) for n in (128, 64) for op in ("potrf", "posv") for dt in ("fp32", "fp64")
         for b in ((256, 4096, 65536) if n == 128 else (4096,))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--warps", default="4,8")
    args = ap.parse_args()
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg import kernels_cuda as kc
    from tunedb.families.linalg.launch import launch

    rows = []
    for op, dt, n, batch in CELLS:
        ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n + batch)
        want = launch(op, "torch", *ins)
        out = torch.empty_like(ins[0] if op == "potrf" else ins[1])
        info = torch.empty((batch,), dtype=torch.int32, device="cuda")
        b = ins[1] if op == "posv" else ins[0]
        for w in (int(x) for x in args.warps.split(",")):
            cid = kc.blocked.config_id(16, w)
            if kc.arm_invalid(op, cid, n, dt):
                continue
            grid, block = kc.geometry(op, cid, n, batch)
            smem = kc.arm_smem(op, cid, n, dt)
            row = {"op": op, "dtype": dt, "n": n, "config": cid, "batch": batch, "us": {}, "ok": {}}
            for name, form in VARIANTS.items():
                kern = torch.cuda._compile_kernel(form(kc.arm_source(op, cid, n, dt)), "tunedb_linalg")
                kc._allow_smem(kern, smem)

                def call(kern=kern):
                    kern(grid=(grid, 1, 1), block=(block, 1, 1), args=[ins[0], b, out, info, batch], shared_mem=smem)

                call()
                torch.cuda.synchronize()
                ok, worst, bound = check.within_torch(op, dt, ins, (out, info) if op != "trsv" else out, want)
                row["ok"][name] = [bool(ok), worst, bound]
                row["us"][name] = graph_us(call, 5, eager_ms(call))[0] if ok else None
            rows.append(row)
            base = row["us"]["tier"]
            cols = " ".join(f"{k}={v:9.1f} ({base / v:4.2f}x)" if v and base else f"{k}=FAILED {row['ok'][k]}"
                            for k, v in row["us"].items())
            print(f"{op} {dt} n={n:<3} {cid:13} b={batch:<6} {cols}", flush=True)
            Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
