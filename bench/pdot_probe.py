"""Does the panel packing's update on tl.dot (kernels_pdot.py) beat the panel packing and torch? A
probe, ONE run on the GPU:

    PYTHONPATH=src python bench/pdot_probe.py --quick --out $OUT/pdot.json

For potrf and posv, fp32 and fp64, n in (64, 128), batch in (256, 4096, 65536), on a fresh input
set a cell (kernels_check.make_inputs), the arms:
  torch            launch(op, "torch", ...) (cholesky_ex, + two solve_triangular for posv);
  panel_w1/2/4     the panel packing through launch(), those config_space finds valid;
  pdot_w1/2/4      kernels_pdot at num_warps 1/2/4, input_precision "ieee" (fp32: FMA; fp64: DMMA),
                   where they compile without spills (fp32 up to 2 rows a thread, fp64 1: see ROWS);
  pdot_tf_w1/2/4   fp32 only: input_precision "tf32x3" (tensor-core passes; wgmma at 4 warps).
Every arm's result is first checked with kernels_check.within_torch (an arm that fails or
raises is skipped and reported); then timed in a CUDA graph of 10 calls (fewer where one call
takes over 2 ms, so the big cells stay in budget), warmed up, replayed 9 times (5 with --quick):
the median microseconds a call. Not in place: the inputs are never consumed. The Triton kernels
compile first in parallel worker processes (Triton's on-disk cache), so the budget goes to the
timing. Prints a table (us a call, x torch: under 1 is faster) and writes the JSON to --out
after every cell.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

OPS = ("potrf", "posv")
DTYPES = ("fp32", "fp64")
NS = (64, 128)
BATCHES = (256, 4096, 65536)
WARPS = (1, 2, 4)
B, KC = 8, 16  # sub-panel width (the update's panel is 2B) and the product's k-chunk


ROWS = {"fp32": 2, "fp64": 1}  # rows a thread without spills (ptxas, sm90, Triton 3.6)


def pdot_arms(dt: str, n: int) -> list[tuple[str, int, str]]:
    """(arm id, num_warps, input_precision) of the pdot arms at (dtype, n): the row axis across
    32 * num_warps threads, each holding 1 .. ROWS[dt] rows (more spilled; fewer replicates rows)."""
    np2 = max(32, 1 << (n - 1).bit_length())
    warps = [w for w in WARPS if 1 <= np2 // (32 * w) <= ROWS[dt] and 32 * w <= np2]
    arms = [(f"pdot_w{w}", w, "ieee") for w in warps]
    if dt == "fp32":
        arms += [(f"pdot_tf_w{w}", w, "tf32x3") for w in warps]
    return arms


def pdot_launch(op: str, ins: tuple, warps: int, prec: str, out, info, work):
    """One pdot call: a program a problem, NP = max(32, next_pow2(n)) rows."""
    from tunedb.families.linalg import kernels_pdot as kd

    batch, n = ins[0].shape[0], ins[0].shape[-1]
    meta = {"N": n, "NP": max(32, 1 << (n - 1).bit_length()), "B": B, "KC": KC, "PREC": prec, "num_warps": warps}
    if op == "potrf":
        kd.potrf_pdot[(batch,)](ins[0], out, info, batch, **meta)
    else:
        kd.posv_pdot[(batch,)](ins[0], ins[1], out, work, info, batch, **meta)
    return out, info


def _warm(job: tuple) -> str:
    """In a worker: compile one arm's kernel into Triton's cache (a batch of 2: the kernels do not
    specialise on the batch, so the timed launch finds it there)."""
    op, dt, n, arm = job
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    t0 = time.time()
    try:
        ins = check.make_inputs(op, 2, n, dt, device="cuda")
        if isinstance(arm, str):
            launch(op, arm, *ins)
        else:
            out = torch.empty_like(ins[0] if op == "potrf" else ins[1])
            info = torch.empty(2, dtype=torch.int32, device="cuda")
            pdot_launch(op, ins, arm[0], arm[1], out, info, torch.empty_like(ins[0]))
        torch.cuda.synchronize()
        return f"{op} {dt} n={n} {arm}: {time.time() - t0:.1f}s"
    except Exception as e:  # the arm fails again in the main process: reported and skipped there
        return f"{op} {dt} n={n} {arm}: FAILED {type(e).__name__}: {str(e)[:200]}"


def graph_us(fn, replays: int, one_ms: float) -> tuple[float, int]:
    """(median us a call, calls a graph) over `replays` replays of a graph of up to 10 calls."""
    import torch

    calls = 10 if one_ms <= 2.0 else max(1, int(20.0 / one_ms))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()  # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        g.replay()
        en.record()
        torch.cuda.synchronize()
        times.append(st.elapsed_time(en) * 1000.0 / calls)
    del g
    return statistics.median(times), calls


def eager_ms(fn) -> float:
    import torch

    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    st.record()
    fn()
    en.record()
    torch.cuda.synchronize()
    return st.elapsed_time(en)


def cell(op: str, dt: str, n: int, batch: int, replays: int) -> dict:
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg import kernels_space as space
    from tunedb.families.linalg.launch import launch

    ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n + batch)
    arms = {"torch": lambda: launch(op, "torch", *ins)}
    for c in space.config_space(op, n, dt):
        if c.packing == "panel":
            arms[c.id] = (lambda cid: lambda: launch(op, cid, *ins))(c.id)
    out = torch.empty_like(ins[0] if op == "potrf" else ins[1])
    info = torch.empty(batch, dtype=torch.int32, device="cuda")
    work = torch.empty_like(ins[0]) if op == "posv" else None
    for aid, w, prec in pdot_arms(dt, n):
        arms[aid] = (lambda w, prec: lambda: pdot_launch(op, ins, w, prec, out, info, work))(w, prec)
    row = {"op": op, "dtype": dt, "n": n, "batch": batch, "us": {}, "calls": {}, "residual": {}, "skipped": {}}
    ref = arms["torch"]()
    for aid, fn in arms.items():
        try:
            res = fn()
            ok, worst, bound = check.within_torch(op, dt, ins, res[0], ref[0])
            row["residual"][aid] = worst
            if not ok:
                row["skipped"][aid] = f"residual {worst:.2e} > {bound:.2e}"
                continue
            if int(res[1].abs().sum()) != 0:
                row["skipped"][aid] = "info nonzero on SPD input"
                continue
            del res
            row["us"][aid], row["calls"][aid] = graph_us(fn, replays, eager_ms(fn))
        except Exception as e:
            row["skipped"][aid] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
    return row


def show(row: dict) -> str:
    t = row["us"].get("torch")
    panel = {k: v for k, v in row["us"].items() if k.startswith("panel")}
    best_panel = min(panel, key=panel.get) if panel else None
    parts = [f"{row['op']:5} {row['dtype']} n={row['n']:3} b={row['batch']:5}"]
    for aid, us in row["us"].items():
        mark = "*" if aid == best_panel else ""
        parts.append(f"{aid}{mark} {us:9.1f}" + (f" ({us / t:.2f}x)" if t else ""))
    for aid, why in row["skipped"].items():
        parts.append(f"{aid} SKIP[{why[:60]}]")
    return " | ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--quick", action="store_true", help="5 replays a graph, not 9")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--ns", default=",".join(map(str, NS)))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile workers")
    args = ap.parse_args()
    import torch

    ops, dts = args.ops.split(","), args.dtypes.split(",")
    ns, batches = [int(x) for x in args.ns.split(",")], [int(x) for x in args.batches.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "B": B, "KC": KC, "rows": [],
           "compile": []}
    t0 = time.time()
    import multiprocessing as mp

    from tunedb.families.linalg import kernels_space as space

    jobs = [(op, dt, n, (w, prec)) for op in ops for dt in dts for n in ns for _, w, prec in pdot_arms(dt, n)]
    jobs += [(op, dt, n, c.id) for op in ops for dt in dts for n in ns
             for c in space.config_space(op, n, dt) if c.packing == "panel"]
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=mp.get_context("spawn")) as pool:
        doc["compile"] = list(pool.map(_warm, jobs))
    print(f"compiled {len(jobs)} kernels (pdot, panel) in {time.time() - t0:.0f}s", flush=True)
    for line in doc["compile"]:
        if "FAILED" in line:
            print("  " + line, flush=True)
    replays = 5 if args.quick else 9
    for op in ops:
        for dt in dts:
            for n in ns:
                for batch in batches:
                    row = cell(op, dt, n, batch, replays)
                    row["elapsed_s"] = round(time.time() - t0, 1)
                    doc["rows"].append(row)
                    print(show(row), flush=True)
                    out.write_text(json.dumps(doc, indent=1))
                    torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f}s -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
