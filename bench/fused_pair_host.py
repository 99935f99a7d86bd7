"""The host cost of a fused Linear + activation pair's eager call, on the CPU (no GPU needed).

    PYTHONPATH=src:bench TUNEDB_LEAVE_UNMEASURED=0 python bench/fused_pair_host.py [--calls 20000] [--repeats 15]

A Sequential(Linear, SiLU) optimized by tunedb (the pair fused: TunedLinear(act=silu) and a
FusedActivation slot) against the plain module, one row of 64 features, with TunedLinear.forward's
own source compiled with `.is_cuda` read as `.is_cpu` (bench/host_path.py's method) and a fake
bound launcher for the fused key in the launch table's call memo:
  fused path  the launcher's call computes F.linear then SiLU (a torch-served fused key before
              session 58: the pair's intact check, the caller's frame walk, the call key, the
              launcher's frame; the slot passes its input through)
  memo path   the key served by torch eagerly (session 58): from the second call the layer's
              eager memo answers with F.linear before the pair is asked, and the slot applies the
              model's SiLU
Rows: us per call of the whole Sequential (this thread's CPU time, best of --repeats loops of
--calls), and the difference from plain.
"""
from __future__ import annotations

import argparse
import copy
import os
import types

from host_path import _compiled, ns_per_call


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    os.environ.setdefault("TUNEDB_LEAVE_UNMEASURED", "0")  # swap and fuse a Linear no table names
    import inspect

    import torch
    import torch.nn.functional as F
    from torch import nn

    import tunedb
    from tunedb.families.gemm import patching
    from tunedb.runtime import launch_table

    src = inspect.getsource(patching.TunedLinear.forward.__code__)
    forward = _compiled(src, patching, ("forward",), _raw_stream=lambda device: 0)["forward"]
    patching.TunedLinear.forward = forward
    patching._raw_stream = lambda device: 0
    torch.set_grad_enabled(False)
    plain = nn.Sequential(nn.Linear(64, 128, bias=False), nn.SiLU())
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    lin = tuned[0]
    if type(tuned[1]).__name__ != "FusedActivation":
        raise SystemExit(f"the pair was not fused: {tuned}")
    x = torch.randn(1, 64)
    key = ("gemm_act", "silu", x.shape, x.dtype, lin.weight.shape, lin.weight.dtype, None)

    class Bound:
        def __init__(self, eager):
            self.counter, self.direct, self.eager = launch_table.Count(), None, eager
            self.config = types.SimpleNamespace(id="torch" if eager else "a_triton_tile")

        def call(self, x, w, b, out):
            return F.silu(F.linear(x, w, b))

    launch_table.sync()
    rows = {"plain": ns_per_call(lambda: plain(x), a.calls, a.repeats)}
    for name, eager in (("fused path", None), ("memo path", "torch")):
        launch_table._calls.clear()
        lin.__dict__.pop("_eager_sizes", None)
        launch_table._calls[key] = Bound(eager)
        tuned(x)
        tuned(x)
        assert ("_eager_sizes" in lin.__dict__) == (eager is not None)
        torch.testing.assert_close(tuned(x), plain(x))
        rows[name] = ns_per_call(lambda: tuned(x), a.calls, a.repeats)
    print(f"{'Sequential(Linear, SiLU), 1x64':<34}{'us a call':>10}{'vs plain':>10}")
    for name, ns in rows.items():
        print(f"{name:<34}{ns / 1e3:>10.2f}{(ns - rows['plain']) / 1e3:>+10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
