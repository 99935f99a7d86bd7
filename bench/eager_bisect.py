"""Which part of tunedb.optimize() makes an HF decoder's eager forward slower than plain: one model,
copies optimized with one part left out each, timed in the same shuffled rounds.

    PYTHONPATH=src:bench python bench/eager_bisect.py [--model llama-3-8b] [--layers 8] [--batches 1,16]
        [--rounds 9] [--iters 20] [--out JSON]

Session 56 measured tunedb / plain at 0.86x (b1) and 0.93x (b16) eagerly on Llama-3-8B HF layers
(bench/compile_nograph.py --mode eager, H200 and H100, A/A 0.98-1.03) while the module-hook and
profiler passes of bench/eager_profile.py showed no gap: a cost that appears only when the host runs
free. Arms (each a deep copy of the plain model):
  plain                 the model as built
  plain (copy)          a second copy: the A/A floor
  tunedb                tunedb.optimize(copy): what a user gets
  tunedb, pairs unfused the same, then every fused activation slot given back its activation (the
                        surgery optimize() supports: the Linear before it runs nn.Linear's form)
  tunedb, gemm only     tunedb.optimize(copy, families=["gemm"]): no bmm product-mode hooks
  tunedb, no siblings   TUNEDB_SIBLINGS=0 while optimize() runs: no sibling groups
  plain + bmm hooks     tunedb.optimize(copy, families=["bmm"]): the product mode's hooks alone
Per batch: the median over rounds of each arm's block time, and its paired speed against plain
(plain's block time over the arm's, median over rounds)."""
from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics


def _unfuse(model) -> int:
    from tunedb.families.gemm.fused_pair import FusedActivation

    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if type(child) is FusedActivation:
                setattr(parent, name, child.activation)
                n += 1
    return n


def arms(plain):
    import tunedb

    out = {"plain": plain, "plain (copy)": copy.deepcopy(plain),
           "tunedb": tunedb.optimize(copy.deepcopy(plain), inplace=False)}
    unfused = tunedb.optimize(copy.deepcopy(plain), inplace=False)
    out["tunedb, pairs unfused"] = unfused if _unfuse(unfused) else None
    out["tunedb, gemm only"] = tunedb.optimize(copy.deepcopy(plain), inplace=False, families=["gemm"])
    old = os.environ.get("TUNEDB_SIBLINGS")
    os.environ["TUNEDB_SIBLINGS"] = "0"
    try:
        out["tunedb, no siblings"] = tunedb.optimize(copy.deepcopy(plain), inplace=False)
    finally:
        if old is None:
            os.environ.pop("TUNEDB_SIBLINGS")
        else:
            os.environ["TUNEDB_SIBLINGS"] = old
    out["plain + bmm hooks"] = tunedb.optimize(copy.deepcopy(plain), inplace=False, families=["bmm"])
    return {k: v for k, v in out.items() if v is not None}


def _syncs(fn) -> list[str]:
    """The synchronizing calls one forward makes (torch.cuda.set_sync_debug_mode): a wait on the
    GPU costs an eager host-bound forward the GPU's whole queue."""
    import warnings

    import torch

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message).splitlines()[0][:160] for w in seen]


def _block(fn, iters: int, cuda: bool) -> float:
    """ms a call of fn over a block of iters, the host running free (eager_modules' timing)."""
    from eager_modules import block_us

    return block_us(fn, iters, cuda)[0] / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import torch

    from e2e_models import build

    cuda = a.device.startswith("cuda")
    batches = tuple(int(b) for b in a.batches.split(","))
    bm = build(a.model, a.device, batches=batches, layers=a.layers)
    models = arms(bm.module)
    result = {"model": a.model, "layers": bm.layers, "torch": torch.__version__, "batches": {}}
    if cuda:
        result["gpu"] = torch.cuda.get_device_name()
    print(f"{a.model}, {bm.layers} layers, torch {torch.__version__}, {result.get('gpu', a.device)}")
    with torch.no_grad():
        for b in batches:
            steps = {k: bm.call(m, b) for k, m in models.items()}
            for step in steps.values():
                for _ in range(5):
                    step()
            if cuda:
                for k, step in steps.items():
                    found = _syncs(step)
                    result.setdefault("syncs", {})[f"{b}:{k}"] = found
                    print(f"   batch {b} {k}: {len(found)} synchronizing calls {found[:3]}")
            per = {k: [] for k in steps}
            order, rng = list(steps), random.Random(a.seed)
            for _ in range(a.rounds):
                rng.shuffle(order)
                for k in order:
                    per[k].append(_block(steps[k], a.iters, cuda))
            rows = {}
            for k, v in per.items():
                speed = statistics.median(p / t for p, t in zip(per["plain"], v))
                rows[k] = {"ms": statistics.median(v), "speed_vs_plain": speed}
            result["batches"][b] = rows
            print(f"== batch {b}: arm, median ms a forward, paired speed vs plain")
            for k, r in rows.items():
                print(f"   {k:<24}{r['ms']:>9.3f}{r['speed_vs_plain']:>9.3f}x")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
