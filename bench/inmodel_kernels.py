"""Each kernel's GPU time inside a model's forward: plain against tunedb.optimize(model), by name.

    PYTHONPATH=src python bench/inmodel_kernels.py --model whisper-large-v3 --batch 8 [--graph]
        [--pin CONFIG] [--iters 20] [--compile] [--against-max-autotune] [--compile-cdt] [--opaque-m1]

A build measures each config alone (CUDA graphs of repeated calls behind cold or warm weights);
a model runs it between other kernels. When a tier's pick wins its measurement but the model gets
slower, this shows which kernels diverge: kernel durations from torch.profiler (CUPTI) over
--iters forwards (eager, or replays of one captured graph with --graph) of both models, grouped
by kernel name, per forward, and the GEMM kernels' share. It also prints what the tuned model
served (signature, M, config, tier), to set beside the tier's evidence. --compile compiles both
models (torch.compile default mode, so the compiler's own fusions cancel) and prints Dynamo's
graph and graph-break counts. --against-max-autotune compiles plain with
mode="max-autotune-no-cudagraphs" instead (and tunedb's model in default mode): where the
compiler's tuned GEMM templates and epilogue fusions beat tunedb+compile, by kernel;
--compile-cdt adds coordinate_descent_tuning to the compiles (Inductor then lowers M=1 GEMMs to
fused reductions, as max-autotune-no-cudagraphs does): to tunedb's, and to plain's unless plain
is compiled with max-autotune, which sets it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_models  # noqa: E402
from e2e_timing import graph_of, paired_ms  # noqa: E402

# kernel names of GEMMs: cuBLAS (nvjet, sm90_xmma, cutlass) and tunedb's Triton kernels
_GEMM_MARKS = ("gemm", "nvjet", "xmma", "cutlass", "splitk", "triton_mm")


def kernel_times(run, iters: int) -> dict[str, list[float]]:
    """{kernel name: [us per launch, ...]} over `iters` calls of `run` (a forward, or a replay)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if str(getattr(ev, "device_type", "")).endswith("CUDA") and ev.time_range.elapsed_us() > 0:
            times[ev.name].append(ev.time_range.elapsed_us())
    return times


def summarise(times: dict[str, list[float]], iters: int) -> tuple[list[tuple[str, float, float, float]], float, float]:
    rows = []
    gemm = total = 0.0
    for name, us in times.items():
        per_fwd = sum(us) / iters
        rows.append((name, len(us) / iters, statistics.median(us), per_fwd))
        total += per_fwd
        if any(mark in name.lower() for mark in _GEMM_MARKS):
            gemm += per_fwd
    rows.sort(key=lambda r: -r[3])
    return rows, gemm, total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="whisper-large-v3", choices=sorted(e2e_models.SPECS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--graph", action="store_true", help="profile replays of one captured graph")
    p.add_argument("--compile", action="store_true", help="compile both models (default mode)")
    p.add_argument("--against-max-autotune", action="store_true",
                   help="compile plain with max-autotune-no-cudagraphs, tunedb's model in default mode")
    p.add_argument("--compile-cdt", action="store_true",
                   help="compile with coordinate_descent_tuning=True: tunedb's model (as e2e.py --compile-cdt), "
                        "and plain's too unless --against-max-autotune (which sets it itself)")
    p.add_argument("--pin", default=None, help="serve every tuned shape with this config")
    p.add_argument("--opaque-m1", action="store_true",
                   help="keep Triton-served M=1 shapes opaque under coordinate_descent_tuning (no "
                        "ops_compile._compiler_reduces_vectors rule): A/B the rule against Inductor's reduction")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)

    import torch

    from tunedb.runtime import launch_table

    if not torch.cuda.is_available():
        print("inmodel_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    compiled = args.compile or args.against_max_autotune or args.compile_cdt
    if args.opaque_m1:
        from tunedb.families.gemm import ops_compile

        ops_compile._compiler_reduces_vectors = lambda: False  # read at trace time, so before the compiles
    try:
        bm, plain, variant, pin = e2e_models.plain_and_tuned(
            args.model, "cuda", args.batch, args.pin, compiled,
            "max-autotune-no-cudagraphs" if args.against_max_autotune else None,
            {"coordinate_descent_tuning": True} if args.compile_cdt else None,
            # compiled against compiled: plain gets the same options (max-autotune already has cdt)
            plain_options={"coordinate_descent_tuning": True} if args.compile_cdt and not args.against_max_autotune
            else None)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    with pin, torch.no_grad():
        bm.call(variant, args.batch)()
        bm.call(plain, args.batch)()  # compiles (and autotunes) outside the profile
        served = sorted({(b.signature.format(), b.m, b.config.id, b.tier) for _k, b in launch_table.entries()})
        # each model's forward, or the replay of one graph of it: profiled by kernel, then timed
        # whole, the two alternating in shuffled rounds (launch gaps count there, not in the sums)
        steps = {label: bm.call(module, args.batch) for label, module in (("plain", plain), ("tunedb", variant))}
        if args.graph:
            steps = {label: graph_of(fn, 3).replay for label, fn in steps.items()}
        results = {label: summarise(kernel_times(run, args.iters), args.iters) for label, run in steps.items()}
        walls = paired_ms(steps, 5, 20)
    mode = "graph replays" if args.graph else "eager forwards"
    cdt = (" (tunedb with coordinate_descent_tuning)" if args.against_max_autotune
           else " (both with coordinate_descent_tuning)") if args.compile_cdt else ""
    what = ("tunedb+compile vs plain under max-autotune-no-cudagraphs" if args.against_max_autotune
            else "compiled tunedb vs compiled plain" if compiled else "tunedb")
    print(f"{args.model} b{args.batch}, {args.iters} {mode}, {what}{cdt}{' pinned ' + args.pin if args.pin else ''}: "
          f"GPU kernel time per forward")
    for label, (rows, gemm, total) in results.items():
        print(f"\n[{label}] all kernels {total:.1f} us, GEMM kernels {gemm:.1f} us per forward")
        print(f"  {'kernel':70s} {'/fwd':>5s} {'median us':>10s} {'us/fwd':>9s}")
        for name, per, med, per_fwd in rows[:args.top]:
            print(f"  {name[:70]:70s} {per:5.1f} {med:10.2f} {per_fwd:9.1f}")
    (_, g0, t0), (_, g1, t1) = results["plain"], results["tunedb"]
    print(f"\ntunedb - plain: all kernels {t1 - t0:+.1f} us ({t0 / t1:.3f}x), GEMM kernels {g1 - g0:+.1f} us per forward")
    print(f"wall per {'replay' if args.graph else 'forward'} (paired, 5 rounds): plain {walls['plain'] * 1e3:.1f} us, "
          f"tunedb {walls['tunedb'] * 1e3:.1f} us ({walls['plain'] / walls['tunedb']:.3f}x)")
    print("served:")
    for sig, m, cid, tier in served:
        print(f"  {sig} M={m}: {cid} ({tier})")
    if compiled:
        from torch._dynamo.utils import counters

        print(f"dynamo: {dict(counters['stats'])}; graph breaks: {dict(counters['graph_break'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
