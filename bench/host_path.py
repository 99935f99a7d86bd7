"""The eager run-time path of a tuned GEMM call on the host, step by step, on the CPU (no GPU needed).

    PYTHONPATH=src python bench/host_path.py [--calls 20000] [--repeats 25] [--out host_path.json]

What an eager decode forward pays per swapped Linear on top of nn.Linear is Python on the host,
which this CPU can time. The CUDA fast path of the entry points (ops.gemm, ops.gemm_act,
TunedLinear.forward) only runs for CUDA tensors, so this bench compiles each function's own
source with `.is_cuda` read as `.is_cpu` (one property getter for another, same cost) in a copy
of its module's globals: the code timed is the code shipped. It also compiles session 17's
entry points (frozen below, the same way) so before and after come from one run.

The launch table's call memo holds a fake bound launcher for the key (what a CUDA call of a
shape served this epoch finds). Two kinds of key:
  torch-served  the launcher is the torch arm's frame over F.linear; the stand-in for F.linear
                is `slice` (a C builtin taking (x, weight, bias): no Python frame, like F.linear),
                and the bound names it as `direct` (launch_table.direct_of), as the GEMM torch arm
                without activation does
  Triton-served the launcher is a Python function (the closure that would launch the kernel), no
                `direct`
Rows: ns per call (thread CPU time), best of --repeats loops of --calls (the rows interleaved), minus the empty loop. "selection" rows
are an entry point minus calling its bound launcher (the DESIGN.md promise: one dict lookup);
"vs nn.Linear" rows are a TunedLinear minus an nn.Linear whose forward calls the same stand-in.
Expected run time: about 30-60 s on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import inspect
import json
import platform
import textwrap
import time
import types

S17_OPS = '''
def gemm(x, weight):
    traced = type(x) is not _Tensor or _compiling() or (_dispatch_modes() and not _recording())
    if traced or _autocast() or (_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return torch.ops.tunedb.gemm(x, weight, _token() if traced else "")
    key = None
    if x.is_cuda:
        key = ("gemm", "none", x.shape, x.dtype, weight.shape, weight.dtype, None)
        bound = _known(key)
        if bound is not None:
            bound.counter.calls += 1
            return bound.call(x, weight, None, None)
    _check(x, weight, None, "none")
    return _run("gemm", x, weight, None, "none", key)


def gemm_act(x, weight, bias=None, act="none"):
    traced = type(x) is not _Tensor or _compiling() or (_dispatch_modes() and not _recording())
    if traced or _autocast() or (_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                     or (bias is not None and bias.requires_grad))):
        return torch.ops.tunedb.gemm_act(x, weight, bias, act, _token() if traced else "")
    key = None
    if x.is_cuda:
        key = ("gemm_act", act, x.shape, x.dtype, weight.shape, weight.dtype,
               None if bias is None else (bias.shape, bias.dtype, bias.is_contiguous()))
        bound = _known(key)
        if bound is not None:
            bound.counter.calls += 1
            return bound.call(x, weight, bias, None)
    _check(x, weight, bias, act)
    return _run("gemm_act", x, weight, bias, act, key)
'''

S17_FORWARD = '''
def forward(self, x):
    bias = self.bias
    act_module = self.__dict__.get("_act_module")
    if act_module is not None and x.is_cpu and not launch_table.recording_active():
        return act_module(F.linear(x, self.weight, bias))
    if bias is None and self.act == "none":
        return ops.gemm(x, self.weight)
    return ops.gemm_act(x, self.weight, bias, self.act)
'''


def _compiled(src: str, module: types.ModuleType, names: tuple[str, ...], **extra) -> dict:
    """The functions `names` of `src` compiled with `.is_cuda` read as `.is_cpu`, in a copy of
    `module`'s globals (plus `extra`), so the CUDA fast path runs on CPU tensors."""
    ns = dict(vars(module), **extra)
    exec(compile(textwrap.dedent(src).replace(".is_cuda", ".is_cpu"), f"<{module.__name__} as cpu>", "exec"), ns)
    return {n: ns[n] for n in names}


def ns_per_call(fn, calls: int, repeats: int) -> float:
    """Best of `repeats` loops, in this thread's CPU time (a shared host's other processes
    deschedule the loop; CPU time does not count those gaps, wall time would)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, time.thread_time_ns() - start)
    return best / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000, help="calls per timed loop")
    ap.add_argument("--repeats", type=int, default=25, help="loops per row (interleaved); the best counts")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from tunedb.families.gemm import ops, patching
    from tunedb.runtime import launch_table

    torch.set_grad_enabled(False)
    n = k = 16
    x = torch.randn(1, k)
    lin = torch.nn.Linear(k, n, bias=False)
    lin_b = torch.nn.Linear(k, n)
    w, b = lin.weight, lin_b.bias

    now = _compiled(inspect.getsource(ops.gemm) + inspect.getsource(ops.gemm_act), ops, ("gemm", "gemm_act"))
    old = _compiled(S17_OPS, ops, ("gemm", "gemm_act"))
    fwd_now = _compiled(inspect.getsource(patching.TunedLinear.forward), patching, ("forward",))["forward"]
    fwd_old = _compiled(S17_FORWARD, patching, ("forward",), ops=types.SimpleNamespace(**old))["forward"]

    class NowLinear(patching.TunedLinear):
        forward = fwd_now

    class OldLinear(patching.TunedLinear):
        forward = fwd_old

    stand_in = slice  # F.linear's stand-in: a C builtin of (x, weight, bias=None)

    class PlainLinear(torch.nn.Linear):  # nn.Linear.forward's body over the stand-in
        def forward(self, input):
            return stand_in(input, self.weight, self.bias)

    def torch_arm(x, weight, bias, out):  # the torch arm's frame (arms.torch_arm's run, out=None)
        y = stand_in(x, weight, bias)
        return y

    def triton_launcher(x, weight, bias, out):  # a launch closure's frame, launching nothing
        return x

    count = launch_table.Count()

    def bound_of(call, direct):
        bd = object.__new__(launch_table.Bound)
        bd.counter, bd.call, bd.direct = count, call, direct
        return bd

    mods = {"now": NowLinear(lin), "s17": OldLinear(lin)}
    mods_b = {"now": NowLinear(lin_b, "silu"), "s17": OldLinear(lin_b, "silu")}
    plain, plain_b = PlainLinear(k, n, bias=False), PlainLinear(k, n)
    key = ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None)
    key_act = ("gemm_act", "silu", x.shape, x.dtype, w.shape, w.dtype, (b.shape, b.dtype, b.is_contiguous()))
    T, compiling, modes, autocast, grad, known = (ops._Tensor, ops._compiling, ops._dispatch_modes,
                                                  ops._autocast, ops._grad_enabled, launch_table.known)
    results: dict[str, dict[str, float]] = {}

    def run(scenario: str, rows: dict) -> None:
        # rows interleaved, repeat by repeat, each keeping its best loop: a busy shared host
        # slows whichever loop it lands on, and every row gets the same chances of a quiet one
        rows = {"(empty loop)": lambda: None, **rows}
        best = dict.fromkeys(rows, float("inf"))
        for _ in range(args.repeats):
            for name, fn in rows.items():
                best[name] = min(best[name], ns_per_call(fn, args.calls, 1))
        empty = best.pop("(empty loop)")
        got = {name: v - empty for name, v in best.items()}
        results[scenario] = got
        print(f"\n{scenario}")
        for name, v in got.items():
            print(f"  {name:52s} {v:8.1f} ns")

    saved = dict(launch_table._calls)
    try:
        for served, call, direct in (("torch-served", torch_arm, stand_in), ("Triton-served", triton_launcher, None)):
            launch_table._calls.clear()
            launch_table._calls[key] = bound_of(call, direct)
            launch_table._calls[key_act] = bound_of(call, None)  # an activation: the arm's own frame
            rows = {
                "bound launcher call(x, w, None, None)": lambda: call(x, w, None, None),
                "s17 ops.gemm": lambda: old["gemm"](x, w),
                "ops.gemm": lambda: now["gemm"](x, w),
                "nn.Linear (same F.linear stand-in)": lambda: plain(x),
                "s17 TunedLinear": lambda: mods["s17"](x),
                "TunedLinear": lambda: mods["now"](x),
                "bound launcher call(x, w, b, None)": lambda: call(x, w, b, None),
                "s17 ops.gemm_act (bias, silu)": lambda: old["gemm_act"](x, w, b, "silu"),
                "ops.gemm_act (bias, silu)": lambda: now["gemm_act"](x, w, b, "silu"),
                "s17 TunedLinear (bias, silu)": lambda: mods_b["s17"](x),
                "TunedLinear (bias, silu)": lambda: mods_b["now"](x),
                "nn.Linear with bias (stand-in)": lambda: plain_b(x),
            }
            for fn in rows.values():  # every row must take the memo: a miss would time resolution
                fn()
            run(f"{served} key (memo hit)", rows)
            r = results[f"{served} key (memo hit)"]
            for tag in ("s17 ", ""):
                r[f"{tag}selection over the bound launcher, gemm"] = r[f"{tag}ops.gemm"] - r["bound launcher call(x, w, None, None)"]
                r[f"{tag}selection over the bound launcher, gemm_act"] = (r[f"{tag}ops.gemm_act (bias, silu)"]
                                                                          - r["bound launcher call(x, w, b, None)"])
                r[f"{tag}TunedLinear over nn.Linear"] = r[f"{tag}TunedLinear"] - r["nn.Linear (same F.linear stand-in)"]
        steps = {
            "checks: type, compiling, modes, autocast": lambda: type(x) is T and not (compiling() or modes() or autocast()),
            "checks: grad": lambda: grad() and (x.requires_grad or w.requires_grad),
            "checks: device (is_cuda's getter)": lambda: x.is_cpu,
            "key tuple, gemm": lambda: ("gemm", "none", x.shape, x.dtype, w.shape, w.dtype, None),
            "key tuple, gemm_act with bias": lambda: ("gemm_act", "silu", x.shape, x.dtype, w.shape, w.dtype,
                                                      (b.shape, b.dtype, b.is_contiguous())),
            "memo lookup (built key)": lambda: known(key),
            "counter": lambda: setattr(count, "calls", count.calls + 1),
            "Module.__call__ over a no-op forward": lambda: _noop(x),
        }
        _noop = torch.nn.Identity()
        run("steps of the fast path", steps)
    finally:
        launch_table._calls.clear()
        launch_table._calls.update(saved)

    print("\nsummary (ns per call; s17 -> now)")
    for served in ("torch-served", "Triton-served"):
        r = results[f"{served} key (memo hit)"]
        for what in ("selection over the bound launcher, gemm", "selection over the bound launcher, gemm_act",
                     "TunedLinear over nn.Linear"):
            print(f"  {served:14s} {what:46s} {r['s17 ' + what]:7.1f} -> {r[what]:7.1f}")
    if args.out:
        from pathlib import Path

        from tunedb.database import write_atomic

        write_atomic(Path(args.out), json.dumps({"bench": "host_path", "ns_per_call": results, "torch": torch.__version__,
                                                 "python": platform.python_version(), "machine": platform.machine(),
                                                 "calls": args.calls, "repeats": args.repeats}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
