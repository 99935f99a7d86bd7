"""Where the tile kernel's time goes (kernels_cuda_tile.py, `cudat_t<TS>`). ONE run on the GPU:

    PYTHONPATH=src python bench/tile_anatomy.py --out $OUT/tile_anatomy.json

For a few potrf / posv cells at n = 64 / 128, the kernel's own source is compiled in four forms
(edited here, the family's file untouched) and each timed in a CUDA graph of 10 calls, median of
5 replays (arm_probe.graph_us):
  full      as served;
  no-store  the factorization and the loads, L's stores skipped (a never-true run-time test);
  no-factor the loads and the stores, the factorization loop run zero times;
  loads     the loads alone;
  staged    as served but L stored through a shared-memory stage, CH rows at a time, in whole rows
            (coalesced: a warp's store covers one row, where the served tile stores touch 32 rows).
So stores = full - no-store, factorization = no-store - loads. Prints a table and writes JSON.
The store forms edit the store block session 22's kernel ended with; since session 23 potrf
stores each tile column inside the factorization loop, so on the current kernel only `full` and
`no-factor` run (the s22 G and s23 A numbers are of the earlier kernel).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arm_probe import eager_ms, graph_us

CELLS = (("potrf", "fp32", 128, 8, 65536), ("potrf", "fp32", 128, 4, 65536), ("potrf", "fp32", 128, 8, 4096),
         ("potrf", "fp32", 64, 4, 65536), ("posv", "fp32", 128, 8, 65536), ("potrf", "fp64", 128, 4, 65536))
LOOP = "for (int kc = 0; kc < NTC; ++kc) {"
STORE = "#if !POSV && !TRSV\n  if (r >= 0) {"
STAGED = r"""#if !POSV && !TRSV
  {  // L through the stage, CH rows at a time: tiles in, whole rows out (a warp a row)
    const int warp = t >> 5, lane = t & 31;
    T* Og = OUT + p * (long long)(N * N);
#pragma unroll 1
    for (int R = 0; R < N; R += CH) {
      if (r >= 0 && R0 >= R && R0 < R + CH) {
#pragma unroll
        for (int ii = 0; ii < TS; ++ii)
#pragma unroll
          for (int jj = 0; jj < TS; ++jj) {
            const int i = R0 + ii, j = C0 + jj;
            if (j <= i && i < N) stage[(i - R) * SST + j] = a[ii][jj];
          }
      }
      __syncthreads();
      for (int rr = warp; rr < CH && R + rr < N; rr += BLOCKT / 32) {
        const int i = R + rr;
        for (int j = lane; j < N; j += 32) Og[(long long)i * N + j] = j <= i ? stage[rr * SST + j] : T(0);
      }
      __syncthreads();
    }
  }
#endif
"""


def forms(src: str) -> dict[str, str]:
    assert src.count(LOOP) == 1, "the factorization loop moved: update bench/tile_anatomy.py"
    no_factor = src.replace(LOOP, "for (int kc = 0; kc < NTC * (batch < 0); ++kc) {")
    out = {"full": src, "no-factor": no_factor}
    if STORE in src:
        skip = STORE.replace("if (r >= 0) {", "if (r >= 0 && INFO == nullptr) {")
        out["no-store"] = src.replace(STORE, skip)
        out["loads"] = no_factor.replace(STORE, skip)
        ch = 16 if "#define DOUBLE 1" in src else 32
        staged = src.replace("  __shared__ int sinfo;", f"#define CH {ch}\n#define SST (N | 1)\n  __shared__ T stage[CH * SST];\n  __shared__ int sinfo;", 1)
        at = staged.index(STORE)
        end = staged.index("#endif\n", at) + len("#endif\n")  # the served store block has no nested #if
        out["staged"] = staged[:at] + STAGED + staged[end:]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg import kernels_cuda as kc
    from tunedb.families.linalg import kernels_cuda_tile as tile

    rows = []
    print(f"{'cell':34} {'full':>10} {'no-store':>10} {'no-factor':>10} {'loads':>10} {'staged':>10}   us a call")
    for op, dt, n, ts, batch in CELLS:
        cid = tile.config_id(ts)
        ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n)
        out = torch.empty_like(ins[0] if op == "potrf" else ins[1])
        info = torch.empty((batch,), dtype=torch.int32, device="cuda")
        b = ins[1] if op == "posv" else ins[0]
        row = {"op": op, "dtype": dt, "n": n, "config": cid, "batch": batch, "us": {}}
        for name, text in forms(kc.arm_source(op, cid, n, dt)).items():
            kern = torch.cuda._compile_kernel(text, "tunedb_linalg")
            block = tile.block_threads(op, n, ts)

            def call(kern=kern, block=block):
                kern(grid=(batch, 1, 1), block=(block, 1, 1), args=[ins[0], b, out, info, batch])

            call()
            torch.cuda.synchronize()
            if name in ("full", "staged"):  # the staged form must write the same L, bit for bit
                row.setdefault("result", {})[name] = out.clone()
            row["us"][name] = graph_us(call, 5, eager_ms(call))[0]
        got = row.pop("result", {})
        if "staged" in got:
            row["staged_equal"] = bool(torch.equal(got["staged"], got["full"]))
        rows.append(row)
        us = row["us"]
        print(f"{op} {dt} n={n} {cid} b={batch:<6} " + " ".join(f"{us.get(k, float('nan')):10.1f}"
                                                          for k in ("full", "no-store", "no-factor", "loads", "staged"))
              + ("" if row.get("staged_equal", True) else "  STAGED DIFFERS"))
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
