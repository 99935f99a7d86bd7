"""Does a Triton launch make the host's NEXT torch call slower? (issue 18, eager decode)

    PYTHONPATH=src python bench/launch_interference.py [--iters 400] [--out JSON]

Session 18 B's eager profile of Llama-3-8B decode at batch 1 found every module of the tuned
model slower on the host, untuned ones too (the `up_proj` nn.Linear right after a `gv` launch:
40 -> 110 us a call), while at batch 16 (torch serving every GEMM) the modules matched plain.
This bench times, on the host (perf_counter, no sync inside the pair), a torch call B right
after a call A, for A in {nothing, F.linear (cuBLAS), the gv GEMV through the family launcher, a
trivial Triton kernel through JITFunction.run} and B in {F.linear, an elementwise mul}, plus A
alone. M = 1, bf16, 4096 x 4096 weights (Llama's q/o projections). Pairs are interleaved in
shuffled order; the stream is synchronised every 16 pairs so the GPU queue never fills.
Prints median host us per call; about 20 s on the H200.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--out")
    args = ap.parse_args()
    import triton
    import triton.language as tl

    from tunedb.families.gemm import FAMILY

    @triton.jit
    def _touch(p):
        tl.store(p, tl.load(p) + 1)

    n = k = 4096
    dev = "cuda"
    w1 = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
    w2 = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)
    sig = FAMILY.make_signature("gemm", "half", n, k, "none", False)
    gv = FAMILY.launcher(FAMILY.parse_config("gv1_n16x256_w4_s5_lr"), sig)
    befores = {
        "nothing": lambda: None,
        "F.linear": lambda: F.linear(x, w1),
        "gv launch": lambda: gv(x, w1, None, None),
        "triton JIT": lambda: _touch[(1,)](flag),
    }
    afters = {"F.linear": lambda: F.linear(x, w2), "mul": lambda: x * 2}
    for f in (*befores.values(), *afters.values()):  # compile, cuBLAS handles, warm
        for _ in range(5):
            f()
    torch.cuda.synchronize()
    pairs = [(a, b) for a in befores for b in afters]
    samples: dict[str, list[float]] = {f"{a} -> {b}": [] for a, b in pairs}
    alone: dict[str, list[float]] = {a: [] for a in befores}
    order = pairs * args.iters
    random.Random(0).shuffle(order)
    clock = time.perf_counter_ns
    for i, (a, b) in enumerate(order):
        fa, fb = befores[a], afters[b]
        t0 = clock()
        fa()
        t1 = clock()
        fb()
        t2 = clock()
        alone[a].append((t1 - t0) / 1e3)
        samples[f"{a} -> {b}"].append((t2 - t1) / 1e3)
        if i % 16 == 15:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    rows = {name: statistics.median(v) for name, v in samples.items()}
    own = {name: statistics.median(v) for name, v in alone.items()}
    print(f"host us per call, median of {args.iters} (torch {torch.__version__}, triton {triton.__version__})")
    print("| A (before) | A's own host us | B = F.linear us | B = mul us |")
    print("|---|---|---|---|")
    for a in befores:
        print(f"| {a} | {own[a]:.1f} | {rows[f'{a} -> F.linear']:.1f} | {rows[f'{a} -> mul']:.1f} |")
    if args.out:
        from pathlib import Path

        from tunedb.database import write_atomic

        write_atomic(Path(args.out), json.dumps({"after": rows, "own": own, "iters": args.iters}, indent=1) + "\n")


if __name__ == "__main__":
    main()
