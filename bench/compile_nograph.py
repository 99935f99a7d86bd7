"""Why tunedb+compile runs slower than compile alone without CUDA graphs: one model, both compiled
(default mode, dynamic=False, no CUDA graphs), taken apart in one process.

    PYTHONPATH=src:bench python bench/compile_nograph.py [--model llama-3-8b] [--batches 1,16] [--out JSON]
        [--tuned-first] [--mode reduce-overhead] [--layers N] [--private-code] [--aa] [--rounds 7] [--seed 0]

--aa adds a third arm, a second copy of the plain model compiled alike (and given private code
objects too under --private-code): compile / compile (copy) is the host's A/A noise floor in the
same run, and tunedb+compile / compile (copy) compares two models that both pay the bench's
private-code wrapping. Each round runs the arms in a shuffled order (--seed).

--mode reduce-overhead compiles both with Inductor's CUDA graphs instead: the same comparison where
the tuned picks stay in the compiled code (ops_compile.py), the mode a user who wants graphs picks.
--mode eager compiles nothing: tunedb.optimize() against plain eagerly, in the same shuffled rounds
beside the A/A copy (the arms keep their names: "compile" is then plain, "tunedb+compile" tunedb).

bench/e2e.py's "eager" rows of the compiled variants (session 45, H100: tunedb+compile 0.50-0.65x
of compile; session 35, H200: 0.72-0.91x) run the compiled forward without graphs, where every
host microsecond counts. Per batch this prints: the graph breaks Dynamo finds in the tuned model
(torch._dynamo.explain), how many calls per forward still reach tunedb's run time (ops that stayed
opaque in the compiled graph rather than decomposing into aten ops), the forward's time for plain
compiled and tuned compiled (paired rounds, CUDA events; on a CPU the wall clock), and the
torch.profiler CPU-side ops of one forward of each, largest first (what the tuned one adds), and
its GPU kernels with their device time (what the tuned one runs instead, and whether its time
on the GPU or on the host is what differs).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from types import SimpleNamespace


_GC_SEEN = {"arm": None, "counts": {}}  # collections started while an arm's block was timed


def _gc_count(phase: str, info: dict) -> None:
    arm = _GC_SEEN["arm"]
    if phase == "start" and arm is not None:
        per = _GC_SEEN["counts"].setdefault(arm, [0, 0, 0])
        per[info["generation"]] += 1


def _ms(fn, iters: int, cuda: bool, gc_off: bool = False) -> float:
    import gc

    import torch

    if gc_off:  # collections run between blocks (the caller's), never inside one (e2e_timing.gc_paused)
        gc.disable()
    try:
        return _timed(fn, iters, cuda, torch)
    finally:
        if gc_off:
            gc.enable()


def _timed(fn, iters: int, cuda: bool, torch) -> float:
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / iters


def _cpu_ops(fn, top: int, calls: int = 1) -> list[tuple[str, float, float]]:
    """(op name, count, self CPU us) per call of fn, averaged over `calls` calls (one call's
    profile moved by tens of microseconds between runs), the `top` largest by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [(e.key, round(e.count / calls, 2), round(e.self_cpu_time_total / calls, 1)) for e in rows]


def _py_calls(fn) -> dict[str, int]:
    """Python function calls of one call of fn, per function (file:line name): what runs as Python
    bytecode between the compiled regions (a compiled region runs none), so the difference between
    two models names each frame one of them runs eagerly (a Dynamo cache lookup each)."""
    import sys

    seen: dict[str, int] = {}

    def hook(frame, event, arg):
        if event == "call":
            code = frame.f_code
            name = f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_firstlineno} {code.co_name}"
            seen[name] = seen.get(name, 0) + 1

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def _calls_diff(calls: dict[str, dict[str, int]], top: int) -> list[tuple[str, int]]:
    """(function, tuned calls minus plain calls) where they differ, largest first."""
    plain, tuned = calls["compile"], calls["tunedb+compile"]
    diff = {k: tuned.get(k, 0) - plain.get(k, 0) for k in set(plain) | set(tuned)}
    rows = sorted(((k, d) for k, d in diff.items() if d), key=lambda r: (-abs(r[1]), r[0]))
    return rows[:top]


def _gpu_kernels(fn, top: int) -> dict:
    """The GPU kernels of one call of fn: their summed device time and the `top` largest by it
    ((name, count, us)). Kernels replayed inside CUDA graphs are listed too where CUPTI reports
    them; an empty list says it did not."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if "CUDA" not in str(getattr(e, "device_type", "")):
            continue
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        rows.append((e.key[:90], e.count, round(float(us), 1)))
    rows.sort(key=lambda r: r[2], reverse=True)
    return {"total_us": round(sum(r[2] for r in rows), 1), "kernels": len(rows), "top": rows[:top]}


def _frames() -> list[tuple[str, str, int]]:
    """Every code object Dynamo holds compiled entries on, with how many: a frame whose code the
    arms share (a module-level function the private copies do not re-create) holds an entry per arm,
    and a call checks the entries' guards in turn until one passes."""
    from torch._dynamo.convert_frame import input_codes
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    out = []
    for ref in input_codes.seen:
        code = ref()
        if code is None:
            continue
        n = len(_debug_get_cache_entry_list(code))
        if n:
            out.append((code.co_name, f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_firstlineno}", n))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--layers", type=int, help="the model's depth (default: the bench spec's, 2 for "
                    "Llama-3-8B): more layers make the forward less host-bound")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tuned-first", action="store_true",
                    help="compile the tuned model first: the two share the model's code objects, so the "
                         "second one compiled pays the first one's failed guard check per call on "
                         "each shared frame (both orders measured show that share)")
    ap.add_argument("--mode", default="default", choices=("default", "reduce-overhead", "eager"),
                    help="torch.compile's mode for both models: reduce-overhead records CUDA graphs "
                         "(Inductor's cudagraph trees), where the tuned picks stay in the compiled code; "
                         "eager compiles nothing (the arms 'compile' / 'tunedb+compile' / 'compile (copy)' "
                         "are then plain / tunedb / a plain copy, eagerly)")
    ap.add_argument("--private-code", action="store_true",
                    help="give the tuned model code objects of its own (bench/private_code.py), so the two "
                    "compiled models share no Dynamo cache entries (a cost a user with one model never pays)")
    ap.add_argument("--aa", action="store_true",
                    help="a third arm, 'compile (copy)': a second copy of the plain model (private code too under "
                         "--private-code), compiled alike: compile / compile (copy) is this host's A/A noise "
                         "floor, and tunedb+compile / compile (copy) compares two models that both pay the "
                         "bench's private-code wrapping (without --private-code the three share Dynamo's caches "
                         "per code object, and the A/A row measures that sharing, not noise)")
    ap.add_argument("--profile-calls", type=int, default=1,
                    help="forwards each arm's CPU-op profile averages over (Dynamo's cache lookup, the compiled "
                         "regions: per forward)")
    ap.add_argument("--gc-off", action="store_true",
                    help="Python's cyclic collector off inside each timed block (collected before it): "
                         "an arm that allocates more tracked objects a forward triggers more collections")
    ap.add_argument("--seed", type=int, default=0, help="the shuffled order of the arms in each round")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    import torch

    import tunedb
    from e2e_models import build
    from tunedb.runtime import selector

    cuda = a.device.startswith("cuda")
    torch._logging.set_logs(recompiles=True)  # why a frame compiles twice (the guard that failed), to stderr
    batches = tuple(int(b) for b in a.batches.split(","))
    bm = build(a.model, a.device, batches=batches, layers=a.layers)
    tuned_module = tunedb.optimize(bm.module, inplace=False)
    copy_module = None
    if a.aa:
        import copy

        copy_module = copy.deepcopy(bm.module)
    if a.private_code:
        from private_code import private_code

        private_code(tuned_module)
        if copy_module is not None:
            private_code(copy_module)
    result = {"model": a.model, "device": a.device, "layers": bm.layers, "torch": torch.__version__, "tuned_first": a.tuned_first,
              "mode": a.mode, "private_code": a.private_code, "aa": a.aa, "seed": a.seed,
              "batches": {}}
    if cuda:
        result["gpu"] = torch.cuda.get_device_name()
    with torch.no_grad():
        for b in batches:
            args = bm.inputs[b]

            def call(module, args=args):
                run = bm.runner(module)  # a transformers LM is called as generation calls it
                if a.mode != "reduce-overhead":
                    return lambda: run(*args)

                def step():  # one decode step a serving loop begins as such (CUDA-graph trees'
                    torch.compiler.cudagraph_mark_step_begin()  # documented call: no replay
                    return run(*args)  # waits on outputs the previous step still holds)
                return step
            if a.mode == "eager":  # no compiler: the same paired rounds and A/A arm for eager forwards
                explained = SimpleNamespace(graph_break_count=0, graph_count=0, break_reasons=[])
                plain_breaks = 0

                def compiled(m):
                    return m
            else:
                explained = torch._dynamo.explain(lambda *xs: bm.runner(tuned_module)(*xs))(*args)
                torch._dynamo.reset()
                plain_breaks = torch._dynamo.explain(lambda *xs: bm.runner(bm.module)(*xs))(*args).graph_break_count
                torch._dynamo.reset()

                def compiled(m):
                    return torch.compile(m, dynamic=False, mode=a.mode)
            plain = compiled(bm.module)
            tuned = compiled(tuned_module)
            steps = {"compile": call(plain), "tunedb+compile": call(tuned)}
            if a.tuned_first:
                steps = dict(reversed(steps.items()))
            if copy_module is not None:
                steps["compile (copy)"] = call(compiled(copy_module))
            for step in steps.values():
                for _ in range(3):
                    step()
            selector.reset_counters()
            steps["tunedb+compile"]()
            reached = {fam: {"calls": c["calls"], **{sig: sum(t.values()) for sig, t in c["signatures"].items()}}
                       for fam, c in selector.counters().items()}
            per: dict[str, list[float]] = {k: [] for k in steps}
            order, rng = list(steps), random.Random(a.seed)
            import gc

            _GC_SEEN["counts"] = {}
            gc.callbacks.append(_gc_count)
            for _ in range(a.rounds):
                rng.shuffle(order)  # no arm always runs right after another (a fixed order's bias)
                for k in order:
                    if a.gc_off:
                        gc.collect()
                    _GC_SEEN["arm"] = k
                    per[k].append(_ms(steps[k], a.iters, cuda, a.gc_off))
                    _GC_SEEN["arm"] = None
            gc.callbacks.remove(_gc_count)
            forwards = a.rounds * a.iters
            gc_per = {k: [round(c / forwards, 3) for c in v] for k, v in _GC_SEEN["counts"].items()}
            ms = {k: statistics.median(v) for k, v in per.items()}

            def paired(num: str, den: str, per: dict[str, list[float]] = per) -> float:
                return statistics.median(p / t for p, t in zip(per[num], per[den]))
            ratio = paired("compile", "tunedb+compile")
            aa = {"compile / compile (copy)": paired("compile (copy)", "compile"),
                  "tunedb+compile / compile (copy)": paired("compile (copy)", "tunedb+compile")} if copy_module is not None else {}
            ops = {k: _cpu_ops(step, a.top, a.profile_calls) for k, step in steps.items()}
            kernels = {k: _gpu_kernels(step, a.top) for k, step in steps.items()} if cuda else {}
            calls = {k: _py_calls(step) for k, step in steps.items()}
            calls_diff = _calls_diff(calls, 3 * a.top)
            result["batches"][b] = {"graph_breaks": explained.graph_break_count, "graphs": explained.graph_count,
                                    "plain_graph_breaks": plain_breaks,
                                    "break_reasons": [r.reason[:200] for r in explained.break_reasons[:12]],
                                    "calls_reaching_tunedb": reached, "ms": ms,
                                    "tunedb_compile_over_compile": ratio, "aa": aa, "cpu_ops": ops,
                                    "gc_per_forward": gc_per, "gc_off": a.gc_off,
                                    "gpu_kernels": kernels,
                                    "python_calls": {k: sum(v.values()) for k, v in calls.items()},
                                    "python_calls_tuned_minus_plain": calls_diff}
            print(f"== {a.model} batch {b}: graph breaks {explained.graph_break_count} ({explained.graph_count} graphs; "
                  f"the plain model {plain_breaks}); "
                  f"calls reaching tunedb per forward: {reached}")
            print(f"   ms compile {ms['compile']:.4f}, tunedb+compile {ms['tunedb+compile']:.4f}: "
                  f"tunedb+compile / compile speed {ratio:.3f}x")
            print(f"   gc collections per timed forward (gen 0 / 1 / 2), collector {'off' if a.gc_off else 'on'}: "
                  + "; ".join(f"{k} {v}" for k, v in gc_per.items()))
            if aa:
                print("   A/A: " + ", ".join(f"{k} speed {v:.3f}x" for k, v in aa.items())
                      + f" (compile (copy) {ms['compile (copy)']:.4f} ms)")
            for r in result["batches"][b]["break_reasons"]:
                print(f"   break: {r}")
            for k, rows in ops.items():
                print(f"   {k}: " + "; ".join(f"{n} x{c} {us}us" for n, c, us in rows[:a.top]))
            for k, g in kernels.items():
                print(f"   {k} GPU: {g['total_us']}us over {g['kernels']} kernel names: "
                      + "; ".join(f"{n} x{c} {us}us" for n, c, us in g["top"]))
            print(f"   python calls per forward: compile {sum(calls['compile'].values())}, tunedb+compile "
                  f"{sum(calls['tunedb+compile'].values())}; tuned minus plain: "
                  + "; ".join(f"{n} {d:+d}" for n, d in calls_diff))
            result["batches"][b]["frames"] = frames = _frames()
            for name, where, n in frames:
                print(f"   frame {name} {where}: {n} cache entries")
            torch._dynamo.reset()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
