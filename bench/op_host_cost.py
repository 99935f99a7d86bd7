"""What the session-27 ops cost on the host per eager call (the torch.library dispatch and the
Autograd kernel's wants_grad check), against the direct path they wrap, in the same run.

    PYTHONPATH=src python bench/op_host_cost.py [--iters 2000] [--out JSON]

Rows (M = 1, bf16 / int8; host microseconds per call, perf_counter around a call with no sync
inside, the stream synchronised every 32 calls so the queue never fills; pairs of the two paths
interleaved in shuffled order; median over the calls):
- group_gemm: `tunedb::group_gemm` (the op the swapped experts now call) vs `runtime.dispatch.call`
  (what they called before), Mixtral-like key at reduced size (E=8, N=1024, K=512, top_k=2).
- scaled_mm int8: `tunedb::scaled_mm_int8` (with its new Autograd kernel) vs the same op run below
  autograd (`torch._C._AutoDispatchBelowAutograd`, what every call did before), 4096 x 4096.
A CUDA graph replays neither cost; these rows bound what an eager model pays.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def timed(fn, iters: int) -> list[float]:
    out = []
    for i in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
        if i % 32 == 31:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return out


def paired(a, b, iters: int, rounds: int = 10) -> tuple[float, float]:
    sa, sb = [], []
    for _ in range(5):
        a(), b()
    torch.cuda.synchronize()
    for _ in range(rounds):
        order = [(a, sa), (b, sb)]
        random.shuffle(order)
        for fn, acc in order:
            acc.extend(timed(fn, iters // rounds))
    return statistics.median(sa), statistics.median(sb)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--out")
    args = ap.parse_args()
    random.seed(0)
    from tunedb import families
    from tunedb.families.group_gemm import arms
    from tunedb.families.group_gemm.ops import group_gemm
    from tunedb.families.scaled_mm import ops as sm_ops
    from tunedb.runtime import dispatch

    rows = []
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8, 1024, 512, device="cuda", dtype=torch.bfloat16)
    ids = arms.random_routing(1, 8, 2, gen, "cuda")
    with torch.no_grad():
        op, direct = paired(lambda: group_gemm(x, w, ids), lambda: dispatch.call("group_gemm", "group_gemm", x, w, ids),
                            args.iters)
    rows.append({"row": "group_gemm M=1 E=8 N=1024 K=512 top_k=2", "op_us": op, "before_us": direct})
    fam = families.get("scaled_mm")
    sig = fam.make_signature("scaled_mm", 4096, 4096, "bf16", "row")
    (xi, wi, sx, sw), _ = fam.make_inputs(sig, 1, "cuda", 0)
    below = torch.ops.tunedb.scaled_mm_int8.default

    def below_autograd():
        with torch._C._AutoDispatchBelowAutograd():
            return below(xi, wi, sx, sw, None)

    with torch.no_grad():
        op, direct = paired(lambda: sm_ops.scaled_mm_int8(xi, wi, sx, sw), below_autograd, args.iters)
    rows.append({"row": "scaled_mm_int8 M=1 4096x4096 (no_grad)", "op_us": op, "before_us": direct})
    op, direct = paired(lambda: sm_ops.scaled_mm_int8(xi, wi, sx, sw), below_autograd, args.iters)
    rows.append({"row": "scaled_mm_int8 M=1 4096x4096 (grad mode on, nothing requires grad)",
                 "op_us": op, "before_us": direct})
    print(f"{'row':<66} {'now us':>8} {'before us':>10} {'delta':>7}")
    for r in rows:
        print(f"{r['row']:<66} {r['op_us']:8.1f} {r['before_us']:10.1f} {r['op_us'] - r['before_us']:+7.1f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"rows": rows, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, fh, indent=1)


if __name__ == "__main__":
    main()
