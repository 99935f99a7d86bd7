"""End to end: plain PyTorch, torch.compile max-autotune and tunedb on whole models, with tuning costs.

    PYTHONPATH=src python bench/e2e.py [--models whisper-large-v3,llama-3-8b,conformer] [--quick]
        [--budget-s 420] [--tune auto|build|autotune] [--out e2e.json] [--md BENCHMARKS.md] [--dry-run]

Models (bench/e2e_models.py): census presets at reduced depth, random bf16 weights, on cuda.
Variants, each timed eagerly and as one CUDA graph of the whole forward:
  plain           the module as built
  plain A/A       the same module timed paired with itself: the noise floor of every ratio
  max-autotune    torch.compile(mode="max-autotune-no-cudagraphs", dynamic=False) after
                  torch._dynamo.reset(), per batch; compile time = the first call's wall time,
                  with fresh TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR (cold, as a deployment)
  tunedb system   tunedb.optimize(copy) with TUNEDB_USER_DB=off (the shipped tier, then the cost model)
  tunedb tuned    the same copy after tuning the model's own points into a temporary user tier:
                  pipeline.build (thin; --no-fill unless --fill: the census is exactly the
                  sizes the forwards call, the coverage of max-autotune's static-shape compile)
                  of the census of the benchmarked batches, or
                  tunedb.autotune() on those forwards when the build's estimate exceeds its share
                  of the budget (--tune forces one), then tunedb.confirm on each batch's
                  forward (Triton picks slower inside the model than torch are demoted;
                  --no-confirm skips it); the tuning wall time is its cost. --tune-in-process
                  also times the same build measured in this process (no worker, so no crash
                  isolation: how Inductor, Triton's autotuner and tunedb.autotune() measure),
                  after the model's timed rows, into a tier nothing serves
  compile         torch.compile(module, default mode, dynamic=False, the same Inductor options as
                  tunedb+compile): the compiler's own gain, which tunedb+compile is judged against
  tunedb system+compile  the same compile of the tunedb.optimize copy with the shipped tier only
  tunedb+compile  torch.compile(tuned copy, default mode, dynamic=False) with the tuned tier:
                  shapes the tier serves with cuBLAS compile to aten (Inductor fuses around
                  them), Triton-served ones stay opaque tuned ops (compile time recorded per
                  batch as tunedb_compile); --compile-cdt adds Inductor's coordinate-descent
                  tuning (what max-autotune-no-cudagraphs sets besides max_autotune: with it
                  Inductor lowers M=1 GEMMs to Triton reductions fused with their neighbours)
Timing: eager = median of per-forward CUDA-event times after warm-up; graph = capture after
warm-up on a side stream, median of per-replay event times. Every variant other than plain is
timed PAIRED with plain: the two alternate in --rounds shuffled rounds (iters/rounds forwards or
replays each, after one untimed call of the same step) and the speedup is the median over
rounds of plain's block time over the variant's in the same round, so drift between rounds and
between phases of the run never enters a ratio; max-autotune and tunedb are compared through
their paired speedups. Python's garbage collector is off inside every timed block (an eager
forward is host-bound: one collection inside it moved a sample by milliseconds, and the plain
A/A eager rows strayed up to 12.9% with 5 rounds of 4). Nothing rotates (whole models). Every
variant's output is first compared with plain's (relative Frobenius error < --tol); a variant
that fails is reported as wrong and not timed. A captured graph's output is checked too.
Also: host overhead of selection (tunedb.families.gemm.ops.gemm against the bound launcher it
dispatches to, bench/host_overhead.py's method), and Triton's autotuner (triton.autotune over the
triton_mma configs, key M/N/K, on the model's distinct GEMM shapes; sampled and extrapolated
when the budget is short, and labeled so). GPU clocks are read with nvidia-smi before and after.
--budget-s bounds the whole run: phases run in priority order (plain + tunedb system, tuning,
host overhead, max-autotune, Triton autotune) and what does not fit is listed as skipped.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_models  # noqa: E402
import e2e_tune  # noqa: E402
from e2e_models import MODES, cell, fresh_env, gpu_clocks, measure, sync  # noqa: E402
from e2e_report import VARIANTS, fmt, markdown, show  # noqa: E402
from e2e_timing import quiet_compile_workers  # noqa: E402

from tunedb.commands.tune import TUNE_TOP_K  # noqa: E402

T0 = time.monotonic()
# what run() writes under --work: the tuned user tier and the compilers' caches
SCRATCH = (USER, INDUCTOR, INDUCTOR_TRITON, TUNEDB_INDUCTOR, TUNEDB_INDUCTOR_TRITON, TRITON_AUTOTUNE,
           USER_INPROC, COMPILE, SYSTEM_COMPILE) = (
    "user", "inductor", "inductor-triton", "tunedb-inductor", "tunedb-inductor-triton", "triton-autotune",
    "user-in-process", "compile", "tunedb-system-compile")
MARKER = ".tunedb-e2e"  # marks a --work directory as e2e's own, so the next run may clear SCRATCH


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds, self.skipped = seconds, []

    def left(self) -> float:
        return self.seconds - (time.monotonic() - T0)

    def allows(self, what: str, need_s: float) -> bool:
        if self.left() >= need_s:
            return True
        self.skipped.append(f"{what} (needs ~{need_s:.0f} s, {max(0.0, self.left()):.0f} s left)")
        print(f"[budget] skipping {what}", flush=True)
        return False


def save(report: dict, path: str | None) -> None:
    if path:  # atomically: a half-written report must not pass for a result
        from tunedb.database import write_atomic

        write_atomic(Path(path), json.dumps(report, indent=1, default=str) + "\n")


def _terminate(signum, _frame):
    raise SystemExit(f"signal {signum}")


def describe(inputs: tuple) -> str:
    def one(x) -> str:
        if hasattr(x, "shape"):
            return "x".join(map(str, x.shape))
        return "(" + ", ".join(f"{k}={one(v)}" for k, v in vars(x).items()) + ")"
    return ", ".join(one(x) for x in inputs)


def dry_run(args) -> int:
    """What a run would do, from models built on meta: no GPU, no timing."""
    import tunedb

    from tunedb import arch

    print(f"budget {args.budget_s:.0f} s; eager {args.warmup}+{args.iters} forwards, graph {args.replays} replays; "
          f"tune: {args.tune} (build --thin --max-points {args.max_points} --top-k {args.top_k}"
          f"{'' if args.fill else ' --no-fill'}); triton.autotune sample "
          f"{args.triton_sample} configs; tolerance {args.tol:g}")
    print("phases: plain + plain A/A + tunedb system -> compile + tunedb system+compile -> tune + tunedb tuned + tunedb+compile -> host overhead -> max-autotune "
          "-> triton.autotune")
    share = 0.4 * args.budget_s / len(args.models)
    for name in args.models:
        bm = e2e_models.build(name, "meta", args.impl, args.quick, args.seed, args.attn, args.batches)
        shapes = e2e_models.tuned_points(bm, tunedb.optimize(bm.module, inplace=False, families="all"))
        print(f"\n{bm.label}")
        for b in bm.batches:
            print(f"  batch {b}: inputs {describe(bm.inputs[b])}")
        for p in shapes.points:
            print(f"  point {p.signature.format()} M={p.m} calls={p.calls}")
        with tempfile.TemporaryDirectory() as d:
            _opts, est = e2e_tune.tune_plan(name, shapes, args, d)
        how = args.tune if args.tune != "auto" else ("build" if est <= share else "autotune")
        print(f"  tune: build estimate {est:.0f} s vs a share of ~{share:.0f} s -> {how}")
        mnk = e2e_models.gemm_shapes(shapes)
        cfgs = e2e_models.mma_configs(shapes, arch.shipped_profile("sm90"))
        print(f"  triton.autotune: {len(cfgs)} triton_mma configs x {len(mnk)} shapes (M,N,K) {mnk}")
    return 0


def run(args, budget: Budget, report: dict, work: Path) -> None:
    import torch

    import tunedb
    from tunedb import arch, settings

    models = {}
    for name in args.models:
        try:
            bm = e2e_models.build(name, "cuda", args.impl, args.quick, args.seed, args.attn, args.batches)
            with torch.no_grad():
                refs = {b: e2e_models.output_tensor(bm.call(bm.module, b)()).clone() for b in bm.batches}
        except Exception as exc:  # noqa: BLE001 - one model failing to build or run leaves the others
            budget.skipped.append(f"{name}: failed to build or run plain ({type(exc).__name__}: {exc})")
            traceback.print_exc()
            continue
        rows = {(b, m): {"batch": b, "mode": m, "cells": {v: cell("skipped", note="budget") for v in VARIANTS}}
                for b in bm.batches for m in MODES}
        report["models"][name] = r = {"name": name, "label": bm.label, "impl": bm.impl, "layers": bm.layers,
                                      "full_layers": bm.full_layers, "batches": list(bm.batches),
                                      "rows": list(rows.values())}
        tuned = tunedb.optimize(bm.module, inplace=False)
        models[name] = (bm, r, rows, tuned, refs)

    if not models:
        return

    def put(name, b, variant, cells):  # progress to the log, the JSON saved: a killed run keeps its rows
        for mode, c in cells.items():
            models[name][2][(b, mode)]["cells"][variant] = c
        print(f"  {name} b{b} {variant}: " + "; ".join(f"{m} {fmt(c, None)}" for m, c in cells.items()), flush=True)
        save(report, args.out)

    def compile_and_measure(name, bm, b, refs, variant, compiled) -> float | None:
        """Compile by the first call (its wall seconds returned; None when it failed, the cells
        saying why), quiet the compile workers, then time it paired with plain."""
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                bm.call(compiled, b)()
            sync()
        except Exception as exc:  # noqa: BLE001 - reported in its cells, not fatal
            put(name, b, variant, {m: cell("error", note=f"{type(exc).__name__}: {str(exc)[:120]}") for m in MODES})
            return None
        secs = time.perf_counter() - t0
        print(f"  {name} b{b} {variant}: compiled in {secs:.1f} s", flush=True)
        quiet_compile_workers()
        put(name, b, variant, measure(bm, compiled, b, refs[b], args, anchor=bm.module))
        return secs

    print("[phase] plain and tunedb system tier", flush=True)
    with settings.override(USER_DB="off"):
        tunedb.reload()
        for name, (bm, r, rows, tuned, refs) in models.items():
            for b in bm.batches:
                if budget.allows(f"{name} b{b} plain, plain A/A + tunedb system", 5):
                    put(name, b, "plain", measure(bm, bm.module, b, refs[b], args))
                    put(name, b, "plain A/A", measure(bm, bm.module, b, refs[b], args, anchor=bm.module))
                    put(name, b, "tunedb system", measure(bm, tuned, b, refs[b], args, anchor=bm.module))

    # the compiler alone, in the same Inductor mode and options as tunedb+compile: what tunedb+compile
    # is judged against (the compiler's gain over plain is not tunedb's); each in cold caches of its own
    options = {"coordinate_descent_tuning": True} if args.compile_cdt else {}
    print("[phase] compile and tunedb system+compile", flush=True)
    with settings.override(USER_DB="off"):
        tunedb.reload()
        for name, (bm, r, rows, tuned, refs) in models.items():
            for variant, module, scratch in (("compile", bm.module, COMPILE), ("tunedb system+compile", tuned, SYSTEM_COMPILE)):
                with fresh_env(TORCHINDUCTOR_CACHE_DIR=str(work / scratch), TRITON_CACHE_DIR=str(work / scratch / "triton")):
                    for b in bm.batches:
                        if budget.allows(f"{name} b{b} {variant}", 30):
                            torch._dynamo.reset()
                            compile_and_measure(name, bm, b, refs, variant,
                                                torch.compile(module, dynamic=False, options=options or None))
        torch._dynamo.reset()

    print("[phase] tune, then tunedb tuned", flush=True)
    user, share = work / USER, 0.4 * budget.left() / len(models)
    census = {}
    for name, (bm, r, rows, tuned, refs) in models.items():
        # the census and the tune see every Linear (optimize leaves those torch serves at every
        # size as written; families="all" swaps them too), as `tunedb tune`'s census does
        full = tunedb.optimize(bm.module, inplace=False, families="all")
        census[name] = shapes = e2e_models.tuned_points(bm, full)
        if not budget.allows(f"{name} tuning", min(share, 20)):
            continue
        try:
            r["tuning"] = e2e_tune.tune_model(bm, full, shapes, args, str(user), share)
        except Exception as exc:  # noqa: BLE001 - report it, keep benchmarking the rest
            r["tuning"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=-4)}
            for b in bm.batches:
                put(name, b, "tunedb tuned", {m: cell("error", note="tuning failed") for m in MODES})
            continue
        print(f"  {name}: {r['tuning']}", flush=True)
        with settings.override(USER_DB=str(user)):
            tunedb.reload()
            tunedb.optimize(tuned)  # re-run after a tune: swaps the Linears the user tier now serves
            for b in bm.batches:
                put(name, b, "tunedb tuned", measure(bm, tuned, b, refs[b], args, anchor=bm.module))
            # the tuned model inside torch.compile's default mode: cuBLAS-served shapes become aten
            # ops Inductor fuses around, Triton-served ones stay tunedb::gemm* calls; no autotuning
            comp = r["tunedb_compile"] = {"per_batch": {}, "options": options}
            with fresh_env(TORCHINDUCTOR_CACHE_DIR=str(work / TUNEDB_INDUCTOR),
                           TRITON_CACHE_DIR=str(work / TUNEDB_INDUCTOR_TRITON)):  # cold, as max-autotune's
                for b in bm.batches:
                    if not budget.allows(f"{name} b{b} tunedb + compile", 30):
                        continue
                    torch._dynamo.reset()
                    compiled = torch.compile(tuned, dynamic=False, options=options or None)
                    secs = compile_and_measure(name, bm, b, refs, "tunedb+compile", compiled)
                    if secs is not None:
                        comp["per_batch"][str(b)] = round(secs, 2)
            torch._dynamo.reset()
        # after this model's tunedb rows (max-autotune's come later, each paired with plain in the
        # same rounds, so whatever it leaves in the process weighs on both sides); only when
        # max-autotune's compile, the ratio's denominator, still fits the budget after it
        if args.tune_in_process and r["tuning"].get("method") == "build" and budget.allows(
                f"{name} tuning in process", 2 * r["tuning"].get("seconds", 10) + args.compile_guess_s):
            try:
                r["tuning_in_process"] = e2e_tune.tune_in_process(
                    bm, full, shapes, args, str(work / USER_INPROC / name), r["tuning"].get("arch_measured", True))
            except Exception as exc:  # noqa: BLE001 - a second timing only: report it
                r["tuning_in_process"] = {"error": f"{type(exc).__name__}: {exc}"}
            tunedb.reload()  # its confirm loaded its own tier: back to what the settings say
            print(f"  {name} in process: {r['tuning_in_process']}", flush=True)

    if budget.allows("host overhead", 10):
        print("[phase] host overhead", flush=True)
        with settings.override(USER_DB="off"):
            tunedb.reload()
            report["host_overhead"] = e2e_models.host_overhead(args.host_calls)

    print("[phase] torch.compile max-autotune-no-cudagraphs", flush=True)
    guess = args.compile_guess_s
    with fresh_env(TORCHINDUCTOR_CACHE_DIR=str(work / INDUCTOR), TRITON_CACHE_DIR=str(work / INDUCTOR_TRITON)):
        for name, (bm, r, rows, tuned, refs) in models.items():
            ind = r["inductor_compile"] = {"per_batch": {}, "seconds": 0.0, "complete": False}
            for b in bm.batches:
                if not budget.allows(f"{name} b{b} max-autotune compile", guess + 10 * len(models)):
                    continue
                torch._dynamo.reset()
                compiled = torch.compile(bm.module, mode="max-autotune-no-cudagraphs", dynamic=False)
                secs = compile_and_measure(name, bm, b, refs, "max-autotune", compiled)
                if secs is not None:
                    guess = secs
                    ind["per_batch"][str(b)] = round(secs, 2)
            ind["seconds"] = round(sum(ind["per_batch"].values()), 2)
            ind["complete"] = len(ind["per_batch"]) == len(bm.batches)
        torch._dynamo.reset()

    print("[phase] triton.autotune", flush=True)
    profile = arch.shipped_profile("sm90")
    with fresh_env(TRITON_CACHE_DIR=str(work / TRITON_AUTOTUNE)):
        for i, (name, (bm, r, rows, tuned, refs)) in enumerate(models.items()):
            if name not in census or not budget.allows(f"{name} triton.autotune", 15):
                continue
            cap = time.monotonic() + budget.left() / (len(models) - i)
            r["triton_autotune"] = e2e_models.triton_autotune_cost(
                e2e_models.gemm_shapes(census[name]), e2e_models.mma_configs(census[name], profile),
                args.triton_sample, lambda: min(budget.left(), cap - time.monotonic()))
            print(f"  {name}: {r['triton_autotune']['how']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(e2e_models.SPECS), help="comma-separated: " + ", ".join(e2e_models.SPECS))
    p.add_argument("--quick", action="store_true", help="fewer layers, batches and timed calls: a smoke run")
    p.add_argument("--batches", default=None,
                   help="comma-separated batch sizes instead of each model's own (e.g. 8: one batch per device "
                        "call, so max-autotune's compile fits the budget)")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall budget of the whole script (s)")
    p.add_argument("--tune", choices=("auto", "build", "autotune"), default="auto")
    p.add_argument("--max-points", type=int, default=3, help="the build's --thin --max-points")
    p.add_argument("--fill", action="store_true",
                   help="tune with the bucket ladder's fill points too (tunedb tune's default); without "
                        "it the tune measures exactly the sizes the benchmarked forwards call (--no-fill), "
                        "the coverage max-autotune's static-shape compile has")
    p.add_argument("--top-k", type=int, default=TUNE_TOP_K,
                   help=f"the build's --top-k (cost-model arms per point; {TUNE_TOP_K}: tunedb tune's default)")
    p.add_argument("--tune-in-process", action="store_true",
                   help="after the tune, time the same build measured in this process (no worker), into a "
                        "tier nothing serves: the tuning cost without tunedb's crash isolation")
    p.add_argument("--allow-busy", action="store_true", help="let the build run on a busy GPU")
    p.add_argument("--impl", default="auto", choices=("auto", "mirror", "hf", "torchaudio"),
                   help="the presets' implementation (auto: transformers/torchaudio when they import)")
    p.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa", help="attention of transformers models")
    p.add_argument("--tol", type=float, default=2e-2, help="relative Frobenius error allowed against plain")
    p.add_argument("--iters", type=int, default=None, help="timed eager forwards (default 44, quick 11)")
    p.add_argument("--replays", type=int, default=None, help="timed graph replays (default 55, quick 22)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=11,
                   help="interleaved rounds of a variant and plain (each times iters/rounds forwards)")
    p.add_argument("--host-calls", type=int, default=None, help="calls per host-overhead row (20000, quick 5000)")
    p.add_argument("--no-confirm", action="store_true",
                   help="tune without tunedb.confirm (the in-model check of Triton picks)")
    p.add_argument("--compile-cdt", action="store_true",
                   help="compile the tunedb+compile variant with coordinate_descent_tuning=True")
    p.add_argument("--compile-guess-s", type=float, default=60.0, help="first max-autotune compile estimate (s)")
    p.add_argument("--triton-sample", type=int, default=8, help="configs autotuned per shape (rest extrapolated)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default=None, help="directory for the user tier, caches and logs (default: a new temp "
                   "dir); given one an earlier e2e run used, that run's tier and caches are cleared first")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.add_argument("--md", default=None, help="append a dated markdown section to this file (BENCHMARKS.md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan from models built on meta; no GPU")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in e2e_models.SPECS]
    if bad or not args.models:
        p.error(f"--models {','.join(bad) or '(none)'}: choose from {', '.join(e2e_models.SPECS)}")
    if args.batches is not None:
        try:
            args.batches = tuple(int(b) for b in args.batches.split(",") if b.strip())
        except ValueError:
            args.batches = ()
        if not args.batches or min(args.batches) < 1:
            p.error("--batches takes comma-separated positive integers, e.g. 1,8")
    for name, default, quick in (("iters", 44, 11), ("replays", 55, 22), ("host_calls", 20000, 5000)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    if min(args.iters, args.replays, args.host_calls, args.triton_sample, args.top_k) < 1 or args.max_points < 2 \
            or min(args.budget_s, args.tol) <= 0:
        p.error("--iters, --replays, --host-calls, --triton-sample, --top-k, --budget-s and --tol must be positive, "
                "--max-points at least 2")
    if args.dry_run:
        return dry_run(args)

    import torch
    import triton

    if not torch.cuda.is_available():
        print("bench/e2e.py needs a CUDA GPU (use --dry-run to see the plan here)", file=sys.stderr)
        return 2
    work = Path(args.work or tempfile.mkdtemp(prefix="tunedb-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    found = [work / d for d in SCRATCH if (work / d).exists()]
    if found and not (work / MARKER).exists():
        print(f"--work {work} holds {', '.join(map(str, found))} that no e2e run made; "
              f"name an empty or an earlier e2e run's directory", file=sys.stderr)
        return 2
    for d in found:  # an earlier run's tier and caches would make this run's tune and compiles warm
        shutil.rmtree(d)
        print(f"cleared {d} (an earlier e2e run's)", flush=True)
    (work / MARKER).write_text("bench/e2e.py work directory: its tier and caches are cleared by the next run\n")
    budget = Budget(args.budget_s)
    report = {"bench": "e2e", "utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "command": " ".join(["python", *sys.argv]), "work": str(work), "models": {},
              "env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                      "python": platform.python_version(), "clocks_before": gpu_clocks()},
              "args": dict(vars(args))}
    report["skipped"], failed = budget.skipped, False
    signal.signal(signal.SIGTERM, _terminate)  # a timeout's SIGTERM still reports what was measured
    try:
        run(args, budget, report, work)
    except (KeyboardInterrupt, SystemExit, Exception) as exc:  # noqa: BLE001 - report what was measured
        budget.skipped.append(f"everything after: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        failed = True
    report["env"]["clocks_after"] = gpu_clocks()
    report["skipped"], report["wall_s"] = budget.skipped, time.monotonic() - T0
    save(report, args.out)
    show(report)
    if args.md:
        with open(args.md, "a") as fh:
            fh.write(markdown(report))
    print(f"work dir (user tier, caches): {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
