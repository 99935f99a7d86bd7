"""Where an optimized HF decoder's eager forward spends its extra host time: each module of one
decoder layer (and the whole model) called alone, plain and optimized, with the inputs the plain
model handed it, timed in the same shuffled rounds with the host running free.

    PYTHONPATH=src:bench python bench/eager_modules.py [--model llama-3-8b] [--layers 2] [--batch 1]
        [--rounds 9] [--iters 50] [--out JSON]

bench/eager_bisect.py (session 57, H100) put tunedb at 0.895x of plain eagerly on Llama-3-8B HF
layers at batch 1 with no synchronizing call on either side: an HF layer at one token is host
bound (about 1.5 ms of host time against about 0.13 ms of weights to move), so every microsecond
a tuned call adds on the host is the forward's. Per module: the median over rounds of the time a
call takes (block of `iters` calls, synchronized at the end only), issue time (the same block
before its synchronize: the host's share), and tuned over plain. Then the tuned model's
tuning_report(), which names what served each signature."""
from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time


def _inputs(plain, names):
    """(args, kwargs) each named module got in one forward of the plain model."""
    got, handles = {}, []
    mods = dict(plain.named_modules())
    for n in names:
        def pre(mod, args, kwargs, n=n):
            got.setdefault(n, (args, dict(kwargs)))
        handles.append(mods[n].register_forward_pre_hook(pre, with_kwargs=True))
    return got, handles


def block_us(fn, iters: int, cuda: bool) -> tuple[float, float]:
    """(us a call, us of host issue a call) over a block of iters calls, synchronized at the end only
    and the cyclic collector off (eager_bisect.py times its arms with it too)."""
    import gc

    import torch

    gc.collect()
    gc.disable()
    try:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        if cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        return (t2 - t0) * 1e6 / iters, (t1 - t0) * 1e6 / iters
    finally:
        gc.enable()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cprofile", type=int, default=0, help="then profile this many forwards of each with cProfile")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import torch
    from torch import nn

    import tunedb
    from e2e_models import build

    cuda = a.device.startswith("cuda")
    bm = build(a.model, a.device, batches=(a.batch,), layers=a.layers)
    plain = bm.module
    tuned = tunedb.optimize(copy.deepcopy(plain), inplace=False)
    layers = next(m for m in plain.modules() if isinstance(m, nn.ModuleList))
    lname = next(n for n, m in plain.named_modules() if m is layers[0])
    names = [lname] + [f"{lname}.{n}" for n, _ in layers[0].named_modules() if n]
    got, handles = _inputs(plain, names)
    args = bm.inputs[a.batch]
    run_plain, run_tuned = bm.runner(plain), bm.runner(tuned)
    with torch.no_grad():
        run_plain(*args)
    for h in handles:
        h.remove()
    pm, tm = dict(plain.named_modules()), dict(tuned.named_modules())
    steps = {"(whole model)": (lambda: run_plain(*args), lambda: run_tuned(*args))}
    for n in names:
        if n in got and n in tm:
            ar, kw = got[n]
            steps[n] = ((lambda m=pm[n], ar=ar, kw=kw: m(*ar, **kw)), (lambda m=tm[n], ar=ar, kw=kw: m(*ar, **kw)))
    result = {"model": a.model, "layers": bm.layers, "batch": a.batch, "torch": torch.__version__, "rows": {}}
    if cuda:
        result["gpu"] = torch.cuda.get_device_name()
    print(f"{a.model}, {bm.layers} layers, batch {a.batch}, torch {torch.__version__}, {result.get('gpu', a.device)}")
    rng = random.Random(a.seed)
    with torch.no_grad():
        for k, (p, t) in steps.items():
            for _ in range(5):
                p()
                t()
        per = {(k, side): [] for k in steps for side in (0, 1)}
        order = list(per)
        for _ in range(a.rounds):
            rng.shuffle(order)
            for k, side in order:
                per[(k, side)].append(block_us(steps[k][side], a.iters, cuda))
        print(f"{'module':<44}{'type (tuned)':<22}{'plain us':>10}{'tuned us':>10}{'issue p':>9}{'issue t':>9}{'plain/tuned':>12}")
        for k in steps:
            p, t = per[(k, 0)], per[(k, 1)]
            row = {"plain_us": statistics.median(x[0] for x in p), "tuned_us": statistics.median(x[0] for x in t),
                   "plain_issue_us": statistics.median(x[1] for x in p), "tuned_issue_us": statistics.median(x[1] for x in t),
                   "speed": statistics.median(x[0] / y[0] for x, y in zip(p, t)),
                   "tuned_type": type(tm[k]).__name__ if k in tm else ""}
            result["rows"][k] = row
            print(f"{k[-43:]:<44}{row['tuned_type'][:21]:<22}{row['plain_us']:>10.1f}{row['tuned_us']:>10.1f}"
                  f"{row['plain_issue_us']:>9.1f}{row['tuned_issue_us']:>9.1f}{row['speed']:>11.3f}x")
    if a.cprofile:
        import cProfile
        import io
        import pstats

        for side, run in (("plain", run_plain), ("tuned", run_tuned)):
            prof = cProfile.Profile()
            with torch.no_grad():
                prof.enable()
                for _ in range(a.cprofile):
                    run(*args)
                prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
            print(f"== cProfile {side}, {a.cprofile} forwards")
            print(buf.getvalue()[-6000:])
    report = tunedb.tuning_report()
    result["report"] = report
    print(report)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
