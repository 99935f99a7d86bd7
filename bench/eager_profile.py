"""Where an eager decode forward's host time goes: plain PyTorch against tunedb.optimize(), side by side.

    PYTHONPATH=src python bench/eager_profile.py --quick --out $OUT/eager_profile.json
        [--model llama-3-8b|unseen] [--batches 1,16] [--iters 60] [--rounds 6] [--prof-iters 10] [--device cuda]

The model is bench/e2e.py's Llama-3-8B (2 decoder layers, hf, SDPA attention, bf16, one decode
step, no LM head), built by e2e_models.build; the tuned copy is tunedb.optimize(model,
inplace=False) with the shipped tables only (TUNEDB_USER_DB=off, as e2e's "tunedb system").
For each batch, eager only:

1. timing: plain, tunedb and "tunedb, s17 back-off" (another optimize() copy run under session
   17's bmm back-off rule, where any torch-served product held the probe gap at 8 forwards;
   --no-s17-backoff drops it) alternate in --rounds rounds of --iters forwards (drift hits all);
   per forward: host issue time (perf_counter around the call, no sync), wall time (call + sync)
   and CUDA-event time, medians and means over all forwards (a probe forward under the bmm product
   mode is an outlier the median hides), the paired ratio to plain (median over rounds of plain's
   round wall over the variant's), and how many forwards ran under the product mode.
2. torch.profiler (CPU + CUDA) over --prof-iters forwards of each: the top --top entries by self
   CPU time, per forward (us, calls), side by side, and the whole table as text beside --out.
3. per-module host time: forward pre/post hooks (time.perf_counter_ns) on every module, inclusive
   and self (inclusive less its children's) microseconds per forward, keyed by the module's path
   with layer indices folded (layers.*.self_attn.q_proj). The hooks cost host time themselves, so
   this pass is separate from (1); read the difference between the columns, not the absolute.

Prints readable tables; writes --out JSON and <out stem>_b<batch>_<variant>_profile.txt.
Expected run time on the H200 with --quick: about 40-60 s (model build ~10 s, optimize, 2 batches).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_models  # noqa: E402
from e2e_timing import gc_paused, output_tensor, rel_err  # noqa: E402

VARIANTS = ("plain", "tunedb")
S17 = "tunedb, s17 back-off"  # timed only: tunedb.optimize() with session 17's bmm back-off rule


def _sync(device: str):
    import torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def time_round(fn, iters: int, device: str) -> list[dict]:
    """Per forward: host issue us, wall us (with sync), and CUDA-event us (cuda only)."""
    import torch

    sync = _sync(device)
    cuda = device == "cuda"
    out = []
    sync()
    with gc_paused():
        for _ in range(iters):
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t0 = time.perf_counter_ns()
            fn()
            t1 = time.perf_counter_ns()
            if cuda:
                e1.record()
            sync()
            t2 = time.perf_counter_ns()
            out.append({"host_us": (t1 - t0) / 1e3, "wall_us": (t2 - t0) / 1e3,
                        "event_us": e0.elapsed_time(e1) * 1e3 if cuda else None})
    return out


def timing(fns: dict, args) -> dict:
    """Every variant of `fns` (plain first) in the same shuffled rounds; per variant the medians
    and means per forward, its paired ratio to plain, and its forwards under the bmm mode."""
    names = list(fns)
    samples = {v: [] for v in names}
    ratios = {v: [] for v in names if v != "plain"}
    with mode_entries() as counter:
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            walls = {}
            for v in order:
                counter.current = v
                fns[v]()  # one untimed call of the same step
                s = time_round(fns[v], args.iters, args.device)
                samples[v] += s
                walls[v] = sum(x["wall_us"] for x in s)
            for v in ratios:
                ratios[v].append(walls["plain"] / walls[v])
    res = {}
    for v in names:
        s = samples[v]
        res[v] = {k: statistics.median(x[k] for x in s) for k in ("host_us", "wall_us")}
        # the mean too: a forward now and then under the bmm product mode (a probe) is an
        # outlier a median hides, but e2e's block ratio (and a user's throughput) pays it
        res[v].update({f"mean_{k}": statistics.fmean(x[k] for x in s) for k in ("host_us", "wall_us")})
        ev = [x["event_us"] for x in s if x["event_us"] is not None]
        res[v]["event_us"] = statistics.median(ev) if ev else None
        res[v]["forwards"] = len(s) + args.rounds  # the untimed call of each round included
        res[v]["bmm_mode_forwards"] = counter.seen.count(v)
        if v in ratios:
            res[v]["speedup_wall_paired"] = statistics.median(ratios[v])
            res[v]["round_ratios"] = ratios[v]
    return res


class mode_entries:
    """Counts entries of the bmm family's product mode (its eager probes) per variant while open."""

    current = ""

    def __enter__(self) -> "mode_entries":
        from tunedb.families.bmm import serving

        self.serving, self.real, self.seen = serving, serving.product_mode, []
        serving.product_mode = lambda: self.seen.append(self.current) or self.real()
        return self

    def __exit__(self, *exc) -> None:
        self.serving.product_mode = self.real


def s17_backoff(fn):
    """fn with session 17's back-off rule: every torch-served product the mode folds counts as a
    candidate (held the gap at 8 forwards), whatever its dtype."""
    from tunedb.families.bmm import serving

    real, always = serving.may_become_tile, (lambda dtype: True)

    def call():
        serving.may_become_tile = always
        try:
            return fn()
        finally:
            serving.may_become_tile = real
    return call


def profile(fn, iters: int, device: str, top: int, txt: Path | None) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync = _sync(device)
    fn()
    sync()
    with tprofile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        sync()
    ka = prof.key_averages()

    def dev_self(e) -> float:
        for attr in ("self_device_time_total", "self_cuda_time_total"):
            if hasattr(e, attr):
                return float(getattr(e, attr))
        return 0.0

    rows = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)
    table = [{"name": e.key, "calls": e.count / iters, "self_cpu_us": e.self_cpu_time_total / iters,
              "cpu_total_us": e.cpu_time_total / iters, "self_device_us": dev_self(e) / iters} for e in rows]
    if txt is not None:
        sort = "self_cpu_time_total"
        txt.write_text(f"# {iters} forwards; totals over all of them\n"
                       + ka.table(sort_by=sort, row_limit=max(top, 60)) + "\n")
    aten = [r for r in table if r["name"].startswith("aten::")]
    return {"iters": iters, "ops": table, "all_ops_calls": {r["name"]: r["calls"] for r in table},
            "self_cpu_us_total": sum(r["self_cpu_us"] for r in table),
            "self_device_us_total": sum(r["self_device_us"] for r in table),
            "aten_calls": sum(r["calls"] for r in aten), "torch_version": torch.__version__}


_LAYER = re.compile(r"\.\d+(?=\.|$)")


def module_times(model, fn, iters: int, device: str) -> dict:
    """Inclusive and self host us per forward per module path (layer indices folded)."""
    stack, incl, child, calls, handles = [], defaultdict(int), defaultdict(int), defaultdict(int), []

    def pre(name):
        def hook(_m, _a):
            stack.append((name, time.perf_counter_ns()))
        return hook

    def post(name):
        def hook(_m, _a, _o):
            t = time.perf_counter_ns()
            while stack:  # a module that raised leaves its frame; unwind to ours
                n, t0 = stack.pop()
                if n == name:
                    break
            d = t - t0
            incl[name] += d
            calls[name] += 1
            if stack:
                child[stack[-1][0]] += d
        return hook

    kinds = defaultdict(set)
    for name, m in model.named_modules():
        key = _LAYER.sub(".*", name) or "<root>"
        kinds[key].add(type(m).__name__)
        handles.append(m.register_forward_pre_hook(pre(key)))
        handles.append(m.register_forward_hook(post(key)))
    try:
        sync = _sync(device)
        fn()
        sync()
        for d in (incl, child, calls):
            d.clear()
        with gc_paused():
            for _ in range(iters):
                fn()
                sync()
    finally:
        for h in handles:
            h.remove()
    return {k: {"incl_us": incl[k] / iters / 1e3, "self_us": (incl[k] - child[k]) / iters / 1e3,
                "calls": calls[k] / iters, "kind": "/".join(sorted(kinds[k]))} for k in incl}


def show_side(title: str, a: dict, b: dict, cols: tuple[str, ...], top: int, sort: str) -> None:
    keys = sorted(set(a) | set(b), key=lambda k: -max(a.get(k, {}).get(sort, 0), b.get(k, {}).get(sort, 0)))
    print(f"\n{title}")
    head = " | ".join(f"{v} {c}" for c in cols for v in VARIANTS)
    print(f"{'entry':<58} | {head} | d {sort}")
    for k in keys[:top]:
        pa, pb = a.get(k, {}), b.get(k, {})
        cells = " | ".join(f"{(p.get(c) or 0):>{len(v) + len(c) + 1}.2f}" for c in cols for v, p in
                           (("plain", pa), ("tunedb", pb)))
        print(f"{k[:58]:<58} | {cells} | {pb.get(sort, 0) - pa.get(sort, 0):+.2f}")


class _Unseen:
    """bench/unseen_decoder.py's model in BenchModel's shape: label, module, call(module, batch)."""

    def __init__(self, batches: tuple[int, ...]) -> None:
        import torch
        from unseen_decoder import FFN, HEADS, KV_HEADS, WIDTH, build

        self.module = build(2)
        self.label = f"unseen decoder (2 layers, width {WIDTH}, ffn {FFN}, {HEADS}/{KV_HEADS} heads, bf16, decode)"
        self.inputs = {b: torch.randn(b, 1, WIDTH, device="cuda", dtype=torch.bfloat16) for b in batches}

    def call(self, module, batch: int):
        x = self.inputs[batch]
        return lambda: module(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer forwards (about 40-60 s on the H200)")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="llama-3-8b", choices=("llama-3-8b", "unseen"),
                   help="unseen: bench/unseen_decoder.py's decoder (no table names its keys; 2 layers)")
    p.add_argument("--iters", type=int, default=None, help="timed forwards per round (default 60, quick 30)")
    p.add_argument("--rounds", type=int, default=None, help="paired rounds (default 10, quick 6)")
    p.add_argument("--prof-iters", type=int, default=None, help="profiled forwards (default 30, quick 10)")
    p.add_argument("--hook-iters", type=int, default=None, help="forwards of the module-hook pass (default 50, quick 20)")
    p.add_argument("--warmup", type=int, default=20, help="untimed forwards of each variant first (the bmm "
                   "mode's back-off settles over these)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--no-s17-backoff", dest="s17_backoff", action="store_false",
                   help="leave out the timed variant with session 17's bmm back-off rule")
    p.add_argument("--out", default=None, help="write the JSON report here (profiler tables beside it)")
    args = p.parse_args(argv)
    q = args.quick
    args.iters = args.iters or (30 if q else 60)
    args.rounds = args.rounds or (6 if q else 10)
    args.prof_iters = args.prof_iters or (10 if q else 30)
    args.hook_iters = args.hook_iters or (20 if q else 50)
    batches = tuple(int(b) for b in args.batches.split(","))
    t_start = time.monotonic()

    import torch

    import tunedb
    from tunedb import settings
    from tunedb.runtime import launch_table

    out_path = Path(args.out) if args.out else None
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    bm = (_Unseen(batches) if args.model == "unseen"
          else e2e_models.build("llama-3-8b", args.device, batches=batches))
    report = {"model": bm.label, "device": args.device, "torch": torch.__version__, "batches": {},
              "args": vars(args)}
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    with settings.override(USER_DB="off"), torch.no_grad():
        tuned = tunedb.optimize(bm.module, inplace=False)
        models = {"plain": bm.module, "tunedb": tuned}
        if args.s17_backoff:
            models[S17] = tunedb.optimize(bm.module, inplace=False)
        print(f"{bm.label}; built and optimized in {time.monotonic() - t_start:.1f} s", flush=True)
        for b in batches:
            fns = {v: bm.call(models[v], b) for v in VARIANTS}
            timed = dict(fns)
            if args.s17_backoff:  # its own copy: the back-off state lives on the module
                timed[S17] = s17_backoff(bm.call(models[S17], b))
            ref = output_tensor(fns["plain"]()).clone()
            err = rel_err(fns["tunedb"](), ref)
            for _ in range(args.warmup):
                for v in timed:
                    timed[v]()
            with launch_table.recording() as seen:
                fns["tunedb"]()
            served = {}
            for key, bound in launch_table.entries():
                served[str(key)] = bound.config.id
            r = {"rel_err": err, "tuned_op_calls": len(seen), "served": served}
            r["timing"] = timing(timed, args)
            r["profile"], r["modules"] = {}, {}
            for v in VARIANTS:
                txt = (out_path.with_name(f"{out_path.stem}_b{b}_{v}_profile.txt") if out_path else None)
                r["profile"][v] = profile(fns[v], args.prof_iters, args.device, args.top, txt)
                r["modules"][v] = module_times(models[v], fns[v], args.hook_iters, args.device)
            report["batches"][b] = r
            show(b, r, args.top)
    report["wall_s"] = time.monotonic() - t_start
    if out_path is not None:
        from tunedb.database import write_atomic

        write_atomic(out_path, json.dumps(report, indent=1, default=str) + "\n")
        print(f"\nwrote {out_path} (and its *_profile.txt tables)")
    print(f"done in {report['wall_s']:.1f} s")
    return 0


def show(b: int, r: dict, top: int) -> None:
    t = r["timing"]
    names = [v for v in t if isinstance(t[v], dict)]
    print(f"\n=== batch {b}: rel err {r['rel_err']:.2e}; {r['tuned_op_calls']} tuned-op calls per forward; "
          f"served {sorted(set(r['served'].values()))}")
    print(f"{'per forward, us':<24}" + "".join(f"{v:>22}" for v in names))
    for k in ("host_us", "wall_us", "event_us", "mean_host_us", "mean_wall_us"):
        if all(t[v][k] is not None for v in names):
            print(f"{k + (' (median)' if not k.startswith('mean') else ''):<24}"
                  + "".join(f"{t[v][k]:>22.1f}" for v in names))
    print(f"{'speedup (paired wall)':<24}{'':>22}" + "".join(f"{t[v]['speedup_wall_paired']:>21.3f}x"
                                                            for v in names[1:]))
    print(f"{'forwards under bmm mode':<24}" + "".join(f"{t[v]['bmm_mode_forwards']:>13} of {t[v]['forwards']:<5}"
                                                      for v in names))
    pr = r["profile"]
    for v in VARIANTS:
        print(f"{v} profile: self CPU {pr[v]['self_cpu_us_total']:.1f} us, device "
              f"{pr[v]['self_device_us_total']:.1f} us, aten calls {pr[v]['aten_calls']:.0f} per forward")
    ops = {v: {e["name"]: e for e in pr[v]["ops"]} for v in VARIANTS}
    show_side(f"torch.profiler, per forward, top {top} by self CPU", ops["plain"], ops["tunedb"],
              ("self_cpu_us", "calls"), top, "self_cpu_us")
    calls = {v: pr[v]["all_ops_calls"] for v in VARIANTS}
    diff = sorted((k for k in set(calls["plain"]) | set(calls["tunedb"])
                   if abs(calls["plain"].get(k, 0) - calls["tunedb"].get(k, 0)) > 1e-9),
                  key=lambda k: -abs(calls["plain"].get(k, 0) - calls["tunedb"].get(k, 0)))
    print(f"\nops whose calls per forward differ ({len(diff)}):")
    for k in diff[:top]:
        print(f"  {k[:70]:<70} plain {calls['plain'].get(k, 0):>7.1f}  tunedb {calls['tunedb'].get(k, 0):>7.1f}")
    for k, e in r["modules"]["tunedb"].items():  # name the swap: Linear -> TunedLinear
        pk = r["modules"]["plain"].get(k, {}).get("kind", "")
        if pk != e["kind"]:
            print(f"  swapped: {k}: {pk or '-'} -> {e['kind']}")
    show_side("per-module host time (hooks), us per forward", r["modules"]["plain"], r["modules"]["tunedb"],
              ("incl_us", "self_us", "calls"), 40, "incl_us")


if __name__ == "__main__":
    sys.exit(main())
