"""Host cost per call of the tuned ops against plain torch, and of the selection itself.

    PYTHONPATH=src python bench/host_overhead.py [--calls 20000] [--m 8 --n 256 --k 256] --out host.json

Eager, one small shape (the GPU finishes each kernel before the host issues the next, so the
wall time per call is the host's issue time): N calls in a loop, torch.cuda.synchronize() at
both ends, best of --repeats. Rows:

  F.linear / nn.Linear                     the framework op (cuBLAS)
  selector.resolve (memoised)              one resolution of a shape already seen this epoch
  launch_table.launcher (memoised)         the launch table's lookup (epoch check + dict)
  [cfg] bound launcher gemm[_act]          the launcher bound to cfg, called directly
  [cfg] tunedb.families.gemm.ops.gemm[_act]      the entry point (eager inference: the call memo)
  [cfg] TunedLinear                        the module optimize() installs (nn.Linear with bias)
  [cfg] launcher via JITFunction.run       the same Triton config with TUNEDB_JIT_LAUNCH=1
  [cfg] torch.ops.tunedb.gemm              through the torch dispatcher (what compile uses)

[cfg] rows pin cfg (torch, then --triton-config) with a resolver override; "selection over the
bound launcher" is ops.gemm minus the bound launcher for the same pin, timed paired: the two
alternate in 20 shuffled rounds and the median of the rounds' differences is reported
(paired_overhead_us). Prints a table; writes JSON to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time

from e2e_timing import paired_rounds, pinned


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


def paired_overhead_us(fn, base, calls: int, rounds: int, sync, seed: int = 0) -> tuple[float, float, float]:
    """(fn, base, fn - base) in us per call. The two alternate in `rounds` blocks of
    calls // rounds each (e2e_timing.paired_rounds); each time is its best block, and the
    difference is the median of the rounds' paired differences, so host drift between blocks
    (a compile worker, a clock step) never lands in it. Two separate best-of loops read the
    selection cost anywhere from -2.6 to +2.0 us across calls on the same code."""
    best, diff = paired_overheads_us({"fn": fn, "base": base}, "base", calls, rounds, sync, seed)
    return best["fn"], best["base"], diff["fn"]


def paired_overheads_us(steps: dict, base: str, calls: int, rounds: int, sync,
                        seed: int = 0) -> tuple[dict[str, float], dict[str, float]]:
    """paired_overhead_us for several steps at once, in the same shuffled rounds: each step's
    best block (us per call), and each step's median paired difference from steps[base]."""
    import statistics

    per = max(1, calls // max(1, rounds))
    times = paired_rounds(steps, max(1, rounds), lambda f: per_call_us(f, per, 1, sync), seed)
    best = {k: min(v) for k, v in times.items()}
    diff = {k: statistics.median([a - b for a, b in zip(times[k], times[base])]) for k in steps if k != base}
    return best, diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--k", type=int, default=256)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--triton-config", default="b16x64x256_w4_s3_g8,tma_b128x128x64_w8_s4_g8",
                        help="comma-separated Triton configs, each pinned for its own rows "
                             "(default: a decode tile of triton_mma and a triton_tma tile)")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from tunedb.runtime import selector
    from tunedb.families.gemm import FAMILY
    from tunedb.families.gemm import ops
    from tunedb.runtime import launch_table
    from tunedb.families.gemm.patching import TunedLinear

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

    triton_cfgs = [FAMILY.parse_config(c) for c in args.triton_config.split(",") if c]

    def pinned_rows(cfg) -> list:
        cid = cfg.id
        bound = launch_table.launcher("gemm", x, w, None, "none", m)  # resolved under the pin
        gbound = launch_table.launcher("gemm_act", x, w, b, "gelu", m)
        assert bound.config.id == cid and gbound.config.id == cid, (bound, gbound)
        return [
            (f"[{cid}] bound launcher gemm", lambda: bound.call(x, w, None, None)),
            (f"[{cid}] tunedb.families.gemm.ops.gemm", lambda: ops.gemm(x, w)),
            (f"[{cid}] TunedLinear", lambda: tuned(x)),
            (f"[{cid}] bound launcher gemm_act (gelu)", lambda: gbound.call(x, w, b, None)),
            (f"[{cid}] tunedb.families.gemm.ops.gemm_act (gelu)", lambda: ops.gemm_act(x, w, b, "gelu")),
        ] + ([] if cfg.is_sentinel else [
            (f"[{cid}] launcher via JITFunction.run", lambda: jit_runs[cid](x, w, None, None)),
            (f"[{cid}] torch.ops.tunedb.gemm", lambda: torch.ops.tunedb.gemm(x, w)),
        ])

    from tunedb import settings
    from tunedb.families.gemm import launch

    jit_runs = {}
    with settings.override(JIT_LAUNCH="1"):
        for cfg in triton_cfgs:
            jit_runs[cfg.id] = launch._build(cfg, sig)
            jit_runs[cfg.id](x, w, None, None)  # a site reads the setting at its first call
    results = []
    served = {}
    overheads: dict[str, tuple[float, float]] = {}
    with torch.inference_mode():
        t_warm = time.perf_counter()
        while time.perf_counter() - t_warm < 2.0:  # the host's clocks settle before the first row
            F.linear(x, w)
        sync()
        plain = [
            ("F.linear", lambda: F.linear(x, w)),
            ("nn.Linear", lambda: linear(x)),
            ("F.linear + bias + gelu", lambda: F.gelu(F.linear(x, w, b))),
            ("selector.resolve (memoised)", lambda: selector.resolve("gemm", sig, m)),
            ("launch_table.launcher (memoised)",
             lambda: launch_table.launcher("gemm", x, w, None, "none", m)),
        ]
        served["selector"] = selector.resolve("gemm", sig, m).config.id
        for cid in (None, "torch", *(c.id for c in triton_cfgs)):
            with pinned(cid) if cid else contextlib.nullcontext() as cfg:
                rows = pinned_rows(cfg) if cid else plain
                for _name, fn in rows:  # warm: compile, bind, memoise
                    for _ in range(20):
                        fn()
                for name, fn in rows:
                    us = per_call_us(fn, args.calls, args.repeats, sync)
                    results.append({"row": name, "us_per_call": round(us, 3)})
                    print(f"  measured {name}: {us:.2f} us", flush=True)  # a run cut short still shows these
                if cid:  # the selection's own cost: the entry point paired with its bound launcher
                    fns = dict(rows)
                    overheads[cid] = tuple(
                        paired_overhead_us(fns[f"[{cid}] tunedb.families.gemm.{op}"], fns[f"[{cid}] {bound}"],
                                           args.calls, 20, sync)[2]
                        for op, bound in (("ops.gemm", "bound launcher gemm"),
                                          ("ops.gemm_act (gelu)", "bound launcher gemm_act (gelu)")))

    base = {r["row"]: r["us_per_call"] for r in results}
    print(f"host cost per call, M={args.m} N={args.n} K={args.k} {args.dtype}, "
          f"{args.calls} calls x best of {args.repeats}; the selector would serve {served['selector']}; "
          f"[cfg] rows pin that config")
    print(f"{'row':50s} {'us/call':>9s} {'vs torch':>9s}")
    for r in results:
        name = r["row"]
        ref = base["F.linear + bias + gelu"] if "gelu" in name else (
            base["nn.Linear"] if "Linear" in name else base["F.linear"])
        ratio = "" if name.startswith(("selector", "launch_table")) else f"{r['us_per_call'] / ref:8.2f}x"
        print(f"{name:50s} {r['us_per_call']:9.2f} {ratio:>9s}")
    for cid, (over_gemm, over_act) in overheads.items():
        for op, over in (("ops.gemm", over_gemm), ("ops.gemm_act (gelu)", over_act)):
            print(f"selection over the bound launcher, {cid}, {op}: {over:.2f} us (paired rounds)")
            results.append({"row": f"selection over bound launcher [{cid}] {op}", "us_per_call": round(over, 3)})
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
