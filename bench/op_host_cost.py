"""What the session-27 ops cost on the host per eager call (the torch.library dispatch and the
Autograd kernel's wants_grad check), against the path before them and the eager entry points
that skip the dispatcher (runtime.grad_form.direct), in the same run.

    PYTHONPATH=src python bench/op_host_cost.py [--iters 2000] [--out JSON]

Rows (M = 1, bf16 / int8; host microseconds per call, perf_counter around a call with no sync
inside, the stream synchronised every 32 calls so the queue never fills; the paths interleaved
in shuffled blocks; median over the calls). Columns: `op` through torch.ops.tunedb, `entry`
what eager code now calls, `before` what it called before this session:
- group_gemm: op `tunedb::group_gemm`; entry `ops.run` (what the swapped experts call in eager);
  before `runtime.dispatch.call`; Mixtral-like key at reduced size (E=8, N=1024, K=512, top_k=2).
- scaled_mm int8: op `tunedb::scaled_mm_int8` (with its new Autograd kernel); entry
  `ops.scaled_mm_int8`; before the op below autograd (`torch._C._AutoDispatchBelowAutograd`, as
  every call ran before it had an Autograd kernel), 4096 x 4096.
- session 28: linalg potrf / posv (fp32, n = 8, batch 4096), bmm, conv2d, gemm_log_softmax:
  op `torch.ops.tunedb.<op>`; entry the family's entry point; before = op (what it called).
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


def paired(fns, iters: int, rounds: int = 10) -> list[float]:
    acc = [[] for _ in fns]
    for _ in range(5):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        order = list(range(len(fns)))
        random.shuffle(order)
        for i in order:
            acc[i].extend(timed(fns[i], iters // rounds))
    return [statistics.median(a) for a in acc]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--out")
    args = ap.parse_args()
    random.seed(0)
    from tunedb import families
    from tunedb.families.group_gemm import arms
    from tunedb.families.group_gemm import ops as gg_ops
    from tunedb.families.group_gemm.ops import group_gemm
    from tunedb.families.scaled_mm import ops as sm_ops
    from tunedb.runtime import dispatch

    rows = []
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8, 1024, 512, device="cuda", dtype=torch.bfloat16)
    ids = arms.random_routing(1, 8, 2, gen, "cuda")
    with torch.no_grad():
        t = paired([lambda: group_gemm(x, w, ids), lambda: gg_ops.run(x, w, ids),
                    lambda: dispatch.call("group_gemm", "group_gemm", x, w, ids)], args.iters)
    rows.append({"row": "group_gemm M=1 E=8 N=1024 K=512 top_k=2", "op_us": t[0], "entry_us": t[1], "before_us": t[2]})
    fam = families.get("scaled_mm")
    sig = fam.make_signature("scaled_mm", 4096, 4096, "bf16", "row")
    (xi, wi, sx, sw), _ = fam.make_inputs(sig, 1, "cuda", 0)
    op = torch.ops.tunedb.scaled_mm_int8.default

    def below_autograd():
        with torch._C._AutoDispatchBelowAutograd():
            return op(xi, wi, sx, sw, None)

    fns = [lambda: op(xi, wi, sx, sw, None), lambda: sm_ops.scaled_mm_int8(xi, wi, sx, sw), below_autograd]
    with torch.no_grad():
        t = paired(fns, args.iters)
    rows.append({"row": "scaled_mm_int8 M=1 4096x4096 (no_grad)", "op_us": t[0], "entry_us": t[1], "before_us": t[2]})
    t = paired(fns, args.iters)
    rows.append({"row": "scaled_mm_int8 M=1 4096x4096 (grad mode on, nothing requires grad)",
                 "op_us": t[0], "entry_us": t[1], "before_us": t[2]})
    # session 28: the forward-only families' entry points skip the dispatcher too; `before`
    # is the op, which those entry points called until then
    spd = torch.randn(4096, 8, 8, device="cuda")
    spd = spd @ spd.transpose(1, 2) + 8 * torch.eye(8, device="cuda")
    rhs = torch.randn(4096, 8, device="cuda")
    p, q = (torch.randn(16, 64, 64, device="cuda", dtype=torch.bfloat16),
            torch.randn(16, 64, 32, device="cuda", dtype=torch.bfloat16))
    cx = torch.randn(1, 64, 32, 32, device="cuda", dtype=torch.float16)
    cw, cb = torch.randn(64, 64, 3, 3, device="cuda", dtype=torch.float16), torch.randn(64, device="cuda", dtype=torch.float16)
    gx, gw = (torch.randn(1, 512, device="cuda", dtype=torch.bfloat16),
              torch.randn(5000, 512, device="cuda", dtype=torch.bfloat16))
    from tunedb.families.bmm import ops as bmm_ops
    from tunedb.families.conv import ops as conv_ops
    from tunedb.families.gemm_log_softmax import ops as glsm_ops
    from tunedb.families.linalg import ops as linalg_ops

    bmm_ops.register()  # tunedb::bmm is defined lazily; the op column names it directly

    more = [("linalg potrf fp32 n=8 batch 4096", lambda: torch.ops.tunedb.linalg_potrf(spd),
             lambda: linalg_ops.potrf(spd)),
            ("linalg posv fp32 n=8 batch 4096", lambda: torch.ops.tunedb.linalg_posv(spd, rhs),
             lambda: linalg_ops.posv(spd, rhs)),
            ("bmm bf16 16x64x64 @ 16x64x32", lambda: torch.ops.tunedb.bmm(p, q), lambda: bmm_ops.bmm(p, q)),
            ("conv2d fp16 1x64x32x32, 64 3x3, relu",
             lambda: torch.ops.tunedb.conv2d(cx, cw, cb, [1, 1], [1, 1], [1, 1], 1, "relu"),
             lambda: conv_ops.conv2d(cx, cw, cb, 1, 1, 1, 1, "relu")),
            ("gemm_log_softmax bf16 M=1 N=5000 K=512", lambda: torch.ops.tunedb.gemm_log_softmax(gx, gw),
             lambda: glsm_ops.gemm_log_softmax(gx, gw))]
    for label, via_op, entry in more:
        with torch.no_grad():
            t = paired([via_op, entry], args.iters)
        rows.append({"row": label + " (no_grad)", "op_us": t[0], "entry_us": t[1], "before_us": t[0]})
    print(f"{'row':<66} {'op us':>7} {'entry us':>9} {'before us':>10} {'entry-before':>13}")
    for r in rows:
        print(f"{r['row']:<66} {r['op_us']:7.1f} {r['entry_us']:9.1f} {r['before_us']:10.1f} "
              f"{r['entry_us'] - r['before_us']:+13.1f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"rows": rows, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}, fh, indent=1)


if __name__ == "__main__":
    main()
