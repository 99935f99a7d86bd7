"""Where the eager entry point's selection time goes: each read and check of ops.gemm's hit path.

    PYTHONPATH=src python bench/selection_cost.py [--calls 200000] [--out sel.json]

ops.gemm's path for a call whose exact key already ran this epoch (the call memo) does, in
order: the trace check (type(x), torch.compiler.is_compiling), the autograd check, the key
(x.shape, x.dtype, weight.shape, weight.dtype), one dict lookup and the per-tier call counter,
then calls the bound launcher. (Until session 7 it also compared x's GPU with the current one;
a Triton site now does that where it reads the current device anyway, and torch's own ops need
no such check: the row says what the check cost.) Each of those is timed alone here (host
only: nothing is launched), best of 7 loops of --calls, in ns per call; then the entry point and
the bound launcher are timed paired on a host-bound shape (as e2e's host row), on CUDA where
there is one. Prints a table; the sum of the parts against the paired difference says how much
of the selection is the interpreter's per-call frame, not the checks.
"""
from __future__ import annotations

import argparse
import json
import sys
import timeit


def parts(x, w) -> dict[str, tuple[str, dict]]:
    import torch

    from tunedb.runtime import ops

    key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
    memo = {key: object()}
    env = {"x": x, "w": w, "T": torch.Tensor, "compiling": ops._compiling, "grad": torch.is_grad_enabled,
           "get": memo.get, "cur": ops._current_device, "slot": type("Slot", (), {"calls": 0})(), "f": lambda a, b: None}
    rows = {
        "type(x) is not Tensor": "type(x) is not T",
        "torch.compiler.is_compiling()": "compiling()",
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


def ns_per(stmt: str, env: dict, calls: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=calls, repeat=7)) / calls * 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200000)
    parser.add_argument("--paired-calls", type=int, default=20000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    from tunedb.runtime import launch_table, ops

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
            from host_overhead import paired_overhead_us

            sync = torch.cuda.synchronize
            for _ in range(20):
                ops.gemm(x, w)
            bound = launch_table.launcher("gemm", x, w, None, "none", m)
            entry, base, diff = paired_overhead_us(lambda: ops.gemm(x, w), lambda: bound.call(x, w, None, None),
                                                   args.paired_calls, 20, sync)
            result.update(entry_us=entry, bound_us=base, selection_us=diff, config=bound.config.id)
    print(f"device {result['device']}, python {result['python']}, torch {result['torch']}")
    print(f"{'hit-path part':40s} {'ns/call':>8s}")
    for name, v in result["ns"].items():
        print(f"{name:40s} {v:8.1f}")
    if "selection_us" in result:
        print(f"ops.gemm {result['entry_us']:.2f} us, bound launcher {result['bound_us']:.2f} us "
              f"({result['config']}): selection (paired median) {result['selection_us'] * 1e3:.0f} ns")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
