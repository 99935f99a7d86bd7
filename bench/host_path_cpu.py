"""Host cost per call of a swapped Linear's entry path, on the CPU (no GPU needed).

    PYTHONPATH=src python bench/host_path_cpu.py [--calls 200000] [--repeats 5] --out host_cpu.json

What the GPU's eager decode pays per Linear on top of the framework op is Python on the host,
which this CPU can time. Rows (us per call, best of --repeats loops, tiny tensors: M=1, N=K=16,
bf16, so the op itself is as cheap as it gets):

  F.linear                          the framework op
  nn.Linear                         the module optimize() leaves as written (Module.__call__ + F.linear)
  TunedLinear, CPU path             the swapped module on a CPU tensor (the real code: entry checks,
                                    _check, _execute's torch arm) -- CPU calls never take the call memo
  entry: trace checks               gemm()'s first line (tensor type, Dynamo flag, dispatch modes)
  entry: grad check                 torch.is_grad_enabled()
  entry: key tuple                  (op, act, x.shape, x.dtype, weight.shape, weight.dtype, None)
  entry: call-memo lookup           launch_table.known(key), a hit
  entry: counter                    bound.counter.calls += 1
  entry: forward frame              TunedLinear.forward's own frame and attribute reads

The "entry" rows time the real functions and objects of ops.py and launch_table.py, step by
step, as the CUDA hot path runs them (a CUDA call that already ran this epoch goes straight
from the memo to its bound launcher); their sum is the per-call host cost a swapped Linear adds
over calling its bound launcher (on the GPU that launcher is F.linear itself for torch-served
keys, which optimize() now leaves as written). Prints a table; writes JSON to --out. ~30 s.
"""
from __future__ import annotations

import argparse
import json
import platform
import time


def per_call_us(fn, calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from tunedb.families.gemm import ops
    from tunedb.families.gemm.patching import TunedLinear
    from tunedb.runtime import launch_table

    torch.set_grad_enabled(False)
    lin = torch.nn.Linear(16, 16, bias=False).to(torch.bfloat16)
    tuned = TunedLinear(lin)
    x = torch.randn(1, 16, dtype=torch.bfloat16)
    w = lin.weight

    class _Bound:  # what launch_table.known returns: a counter and the bound launcher
        __slots__ = ("counter", "call")

    bound = _Bound()
    bound.counter = launch_table.Count()
    bound.call = lambda x, weight, bias, out: x
    key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
    launch_table._calls[key] = bound  # a hit, as a CUDA call of a shape seen this epoch finds
    _T, compiling, modes, recording, grad, known = (ops._Tensor, ops._compiling, ops._dispatch_modes,
                                                    ops._recording, ops._grad_enabled, ops._known)

    class _Stub(torch.nn.Module):  # TunedLinear.forward's frame over a no-op entry point
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.bias, self.act = w, None, "none"

        def forward(self, x):
            bias = self.bias
            if bias is None and self.act == "none":
                return x
            return x

    stub, plain_module = _Stub(), torch.nn.Module()
    plain_module.forward = lambda x: x  # noqa: E731 - Module.__call__ over nothing

    rows = {
        "F.linear": lambda: F.linear(x, w),
        "nn.Linear": lambda: lin(x),
        "TunedLinear, CPU path": lambda: tuned(x),
        "entry: trace checks": lambda: type(x) is not _T or compiling() or (modes() and not recording()),
        "entry: grad check": lambda: grad() and (x.requires_grad or w.requires_grad),
        "entry: key tuple": lambda: ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None),
        "entry: call-memo lookup": lambda: known(key),
        "entry: counter": lambda: setattr(bound.counter, "calls", bound.counter.calls + 1),
        "entry: forward frame": lambda: stub(x),
        "(Module.__call__ over nothing)": lambda: plain_module(x),
        "(empty lambda)": lambda: None,
    }
    out = {name: per_call_us(fn, args.calls, args.repeats) for name, fn in rows.items()}
    launch_table._calls.pop(key, None)
    empty = out["(empty lambda)"]
    steps = [n for n in out if n.startswith("entry:") and n != "entry: forward frame"]
    added = sum(out[n] - empty for n in steps) + (out["entry: forward frame"] - out["(Module.__call__ over nothing)"])
    print(f"host cost per call on {platform.processor() or platform.machine()}, torch {torch.__version__} "
          f"(best of {args.repeats} x {args.calls} calls; 'net' = minus the empty lambda's loop cost)")
    print(f"{'row':34s} {'us/call':>8s} {'net':>8s}")
    for name, us in out.items():
        print(f"{name:34s} {us:8.3f} {us - empty:8.3f}")
    print(f"{'swapped entry path, CUDA memo hit':34s} {added:8.3f}   (sum of the entry rows, net)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"per_call_us": out, "entry_path_net_us": added, "torch": torch.__version__,
                       "machine": platform.machine(), "calls": args.calls}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
