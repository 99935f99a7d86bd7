"""Where the eager entry point's selection time goes: each read and check of ops.gemm's hit path.

    PYTHONPATH=src python bench/selection_cost.py [--calls 200000] [--out sel.json]

ops.gemm's path for a call whose exact key already ran this epoch (the call memo) does, in
order: the trace check (type(x), torch.compiler.is_dynamo_compiling), the autograd check, the key
(x.shape, x.dtype, weight.shape, weight.dtype), one dict lookup and the per-tier call counter,
then calls the bound launcher. (Until session 7 it also compared x's GPU with the current one;
a Triton site now does that where it reads the current device anyway, and torch's own ops need
no such check: the row says what the check cost.) Each of those is timed alone here (host
only: nothing is launched), best of 7 loops of --calls, in ns per call. Then, on CUDA, ops.gemm
and the session-6 hit path (previous_hit_path) are each timed over the bound launcher in the same
shuffled rounds (as e2e's host row, M,N,K = 8,256,256), for the tier's pick and for torch pinned.
Prints a table; writes JSON to --out.
"""
from __future__ import annotations

import argparse
import json
import sys
import timeit


def parts(x, w) -> dict[str, tuple[str, dict]]:
    import torch

    from tunedb.families.gemm import ops

    key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
    memo = {key: object()}
    env = {"x": x, "w": w, "T": torch.Tensor, "compiling": ops._compiling, "grad": torch.is_grad_enabled,
           "get": memo.get, "cur": ops._current_device, "slot": type("Slot", (), {"calls": 0})(), "f": lambda a, b: None}
    rows = {
        "type(x) is not Tensor": "type(x) is not T",
        "ops._compiling() (dynamo flag)": "compiling()",
        "torch.is_grad_enabled()": "grad()",
        "x.is_cuda": "x.is_cuda",
        "x.shape": "x.shape",
        "x.dtype": "x.dtype",
        "key tuple (2 shapes, 2 dtypes)": "('gemm', 'none', x.shape, x.dtype, w.shape, w.dtype, None)",
        "key tuple + dict lookup (hit)": "get(('gemm', 'none', x.shape, x.dtype, w.shape, w.dtype, None))",
        "x.get_device() == current (moved)": "x.get_device() == cur()",
        "call counter += 1": "slot.calls += 1",
        "an empty Python call (the frame)": "f(x, w)",
    }
    return {name: (stmt, env) for name, stmt in rows.items()}


def previous_hit_path():
    """ops.gemm's memo hit as it was before session 7 (is_compiling, and the device check the
    Triton sites now make), for a same-run comparison; anything else goes to ops.gemm. Built as
    a closure so that, like ops.gemm, it reads only bound names per call (U5's first version
    imported modules inside the call, which inflated this row)."""
    import torch

    from tunedb.families.gemm import ops

    from tunedb.runtime import launch_table

    tensor, compiling, known, current, gemm = (torch.Tensor, torch.compiler.is_compiling, launch_table.known,
                                               ops._current_device, ops.gemm)

    def call(x, weight):
        if type(x) is not tensor or compiling():
            return gemm(x, weight)
        if x.is_cuda:
            key = ("gemm", "none", x.shape, x.dtype, weight.shape, weight.dtype, None)
            bound = known(key)
            if bound is not None and x.get_device() == current():
                bound.counter.calls += 1
                return bound.call(x, weight, None, None)
        return gemm(x, weight)

    return call


def paired_paths(x, w, m: int, calls: int) -> list[dict]:
    """ops.gemm and the previous hit path, each over the bound launcher, timed in the same
    shuffled rounds (20 blocks of calls // 20), for the tier's pick and for torch pinned. A
    Triton pick's launcher now holds the device check, so the previous path checks twice there:
    the torch row is the like-for-like one (torch's launcher has no check)."""
    import contextlib

    import torch

    from e2e_timing import pinned
    from host_overhead import paired_overheads_us
    from tunedb.families.gemm import ops
    from tunedb.runtime import launch_table

    sync, out, previous = torch.cuda.synchronize, [], previous_hit_path()
    for pick, pin in (("the tier's pick", None), ("torch (pinned)", "torch")):
        with pinned(pin) if pin else contextlib.nullcontext():
            for _ in range(20):
                ops.gemm(x, w)
            bound = launch_table.launcher("gemm", x, w, None, "none", m)
            steps = {"new": lambda: ops.gemm(x, w), "previous": lambda: previous(x, w),
                     "bound": lambda: bound.call(x, w, None, None)}
            best, diff = paired_overheads_us(steps, "bound", calls, 20, sync)
            out.append({"pick": pick, "config": bound.config.id, "bound_us": best["bound"],
                        "selection_ns": diff["new"] * 1e3, "previous_ns": diff["previous"] * 1e3})
    return out


def ns_per(stmt: str, env: dict, calls: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=calls, repeat=7)) / calls * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200000)
    parser.add_argument("--paired-calls", type=int, default=20000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    m, n, k = 8, 256, 256
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
    result: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "python": sys.version.split()[0],
                    "torch": torch.__version__, "ns": {}}
    with torch.no_grad():
        for name, (stmt, env) in parts(x, w).items():
            if name.startswith("x.get_device") and not cuda:
                continue  # no current CUDA device to ask
            result["ns"][name] = ns_per(stmt, env, args.calls)
        if cuda:
            result["paired"] = paired_paths(x, w, m, args.paired_calls)
    print(f"device {result['device']}, python {result['python']}, torch {result['torch']}")
    print(f"{'hit-path part':40s} {'ns/call':>8s}")
    for name, v in result["ns"].items():
        print(f"{name:40s} {v:8.1f}")
    for row in result.get("paired", []):
        print(f"{row['pick']:28s} bound launcher {row['bound_us']:.2f} us ({row['config']}); over it, paired medians: "
              f"ops.gemm {row['selection_ns']:.0f} ns, the session-6 hit path {row['previous_ns']:.0f} ns")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
