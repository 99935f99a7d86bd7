"""Host cost per call of the tuned ops against plain torch, and of the selection itself.

    PYTHONPATH=src python bench/host_overhead.py [--calls 20000] [--m 8 --n 256 --k 256] --out host.json

Eager, one small shape (the GPU finishes each kernel before the host issues the next, so the
wall time per call is the host's issue time): N calls in a loop, torch.cuda.synchronize() at
both ends, best of --repeats. Rows:

  F.linear / nn.Linear                     the framework op (cuBLAS)
  tunedb.runtime.ops.gemm[_act]            the entry point (direct call in eager inference)
  torch.ops.tunedb.gemm[_act]              through the torch dispatcher (what compile/graphs use)
  TunedLinear                              the module optimize() installs
  selector.resolve (memoised)              one resolution of a shape already seen this epoch
  launch_table.launcher (memoised)         the op's own lookup (epoch check + dict)

Each tuned row runs with the config the selector picks (--config pins one, e.g. torch, to
separate Triton's launch cost from tunedb's own). Prints a table; writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time


def per_call_us(fn, calls: int, repeats: int, sync) -> float:
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--config", default=None, help="pin this config id for the tuned rows")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from tunedb import selector
    from tunedb.families.gemm import FAMILY
    from tunedb.runtime import launch_table, ops
    from tunedb.runtime.patching import TunedLinear

    if not torch.cuda.is_available():
        print("host_overhead.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    dev = "cuda"
    x = torch.randn(args.m, args.k, device=dev, dtype=dt)
    w = torch.randn(args.n, args.k, device=dev, dtype=dt) * args.k ** -0.5
    b = torch.randn(args.n, device=dev, dtype=dt)
    linear = torch.nn.Linear(args.k, args.n, device=dev, dtype=dt)
    tuned = TunedLinear(linear)
    sig, m = FAMILY.signature_of("gemm", x, w)
    sync = torch.cuda.synchronize

    pinned = None
    if args.config:
        cfg = FAMILY.parse_config(args.config)
        pinned = launch_table.overriding(lambda fam, s, mm: (cfg, "pinned"))
        pinned.__enter__()
    try:
        with torch.inference_mode():
            rows = [
                ("F.linear", lambda: F.linear(x, w)),
                ("tunedb.runtime.ops.gemm", lambda: ops.gemm(x, w)),
                ("torch.ops.tunedb.gemm", lambda: torch.ops.tunedb.gemm(x, w)),
                ("F.linear + bias + gelu", lambda: F.gelu(F.linear(x, w, b))),
                ("tunedb.runtime.ops.gemm_act (gelu)", lambda: ops.gemm_act(x, w, b, "gelu")),
                ("torch.ops.tunedb.gemm_act (gelu)", lambda: torch.ops.tunedb.gemm_act(x, w, b, "gelu")),
                ("nn.Linear", lambda: linear(x)),
                ("TunedLinear", lambda: tuned(x)),
                ("selector.resolve (memoised)", lambda: selector.resolve("gemm", sig, m)),
                ("launch_table.launcher (memoised)",
                 lambda: launch_table.launcher("gemm", x, w, None, "none", m)),
            ]
            for _name, fn in rows:  # warm: compile, bind, memoise
                for _ in range(20):
                    fn()
            results = []
            for name, fn in rows:
                us = per_call_us(fn, args.calls, args.repeats, sync)
                results.append({"row": name, "us_per_call": round(us, 3)})
        bound = launch_table.launcher("gemm", x, w, None, "none", m)
        served = {"config": bound.config.id, "tier": bound.tier}
    finally:
        if pinned is not None:
            pinned.__exit__(None, None, None)

    base = {r["row"]: r["us_per_call"] for r in results}
    print(f"host cost per call, M={args.m} N={args.n} K={args.k} {args.dtype}, "
          f"{args.calls} calls x best of {args.repeats}; tuned rows serve {served}")
    print(f"{'row':40s} {'us/call':>9s} {'vs torch':>9s}")
    for r in results:
        ref = base["F.linear + bias + gelu"] if "gelu" in r["row"] else (
            base["nn.Linear"] if "Linear" in r["row"] else base["F.linear"])
        ratio = "" if r["row"].startswith(("selector", "launch_table")) else f"{r['us_per_call'] / ref:8.2f}x"
        print(f"{r['row']:40s} {r['us_per_call']:9.2f} {ratio:>9s}")
    report = {
        "bench": "host_overhead", "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "python": platform.python_version(),
        "shape": {"M": args.m, "N": args.n, "K": args.k, "dtype": args.dtype},
        "calls": args.calls, "repeats": args.repeats, "served": served, "rows": results,
        "command": " ".join(sys.argv),
    }
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
