"""What the linalg probes share (bench/pdot_probe.py, bench/cuda_probe.py): one cell's arms checked
against torch's result and then timed in CUDA graphs, and the sweep over cells that prints a line
and rewrites the JSON after every cell. Needs a GPU."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable


def graph_us(fn: Callable[[], Any], replays: int, one_ms: float) -> tuple[float, int]:
    """(median us a call, calls a graph) over `replays` replays of a graph of up to 10 calls."""
    import torch

    from graph_timing import replayed_ms

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
    return replayed_ms(g, replays, calls) * 1000.0, calls


def eager_ms(fn: Callable[[], Any]) -> float:
    import torch

    st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    st.record()
    fn()
    en.record()
    torch.cuda.synchronize()
    return st.elapsed_time(en)


def time_arms(row: dict, op: str, dt: str, ins: tuple, arms: dict[str, Callable[[], Any]], replays: int) -> dict:
    """Fill row's us / calls / residual / skipped: each arm's result first checked with
    kernels_check.within_torch against arms["torch"] (an arm that fails, raises or reports info on
    an SPD input is skipped with the reason), then timed (graph_us)."""
    from tunedb.families.linalg import kernels_check as check

    ref = arms["torch"]()
    for aid, fn in arms.items():
        try:
            res = fn()
            if op == "trsv":  # x alone; potrf / posv return (result, info)
                res, ref_x = (res, None), ref
            else:
                ref_x = ref[0]
            ok, worst, bound = check.within_torch(op, dt, ins, res[0], ref_x)
            row["residual"][aid] = worst
            if not ok:
                row["skipped"][aid] = f"residual {worst:.2e} > {bound:.2e}"
                continue
            if res[1] is not None and int(res[1].abs().sum()) != 0:
                row["skipped"][aid] = "info nonzero on SPD input"
                continue
            del res
            row["us"][aid], row["calls"][aid] = graph_us(fn, replays, eager_ms(fn))
        except Exception as e:
            row["skipped"][aid] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
    return row


def sweep(cells: list[tuple[str, str, int, int]], cell: Callable[..., dict], show: Callable[[dict], str],
          doc: dict, out: Path, t0: float, replays: int, compile_items: list | None = None, label: str = "kernels",
          jobs: int | None = None) -> None:
    """With `compile_items`, first compile them (kernels_prebuild.compile_all; the failures into
    doc["compile"] and printed); then cell(op, dt, n, batch, replays) for each cell in order: its row
    printed (show) and the whole doc rewritten to `out` after every cell, so a cut run keeps what it
    measured."""
    import torch

    if compile_items is not None:
        from tunedb.families.linalg import kernels_prebuild

        doc["compile"] = kernels_prebuild.compile_all(compile_items, jobs=jobs)  # the failures, as lines
        print(f"compiled {len(compile_items)} {label} in {time.time() - t0:.0f}s", flush=True)
        for line in doc["compile"]:
            print("  FAILED " + line, flush=True)
    for op, dt, n, batch in cells:
        row = cell(op, dt, n, batch, replays)
        row["elapsed_s"] = round(time.time() - t0, 1)
        doc["rows"].append(row)
        print(show(row), flush=True)
        out.write_text(json.dumps(doc, indent=1))
        torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f}s -> {out}", flush=True)


def cli(description: str, ops: tuple, dtypes: tuple, ns: tuple, batches: tuple) -> tuple[Any, list, list, list, list, Path]:
    """The probes' command line: (args, ops, dtypes, ns, batches, out) with --out's folder made."""
    import argparse
    import os

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", required=True, help="JSON file")
    ap.add_argument("--quick", action="store_true", help="5 replays a graph, not 9")
    ap.add_argument("--ops", default=",".join(ops))
    ap.add_argument("--dtypes", default=",".join(dtypes))
    ap.add_argument("--ns", default=",".join(map(str, ns)))
    ap.add_argument("--batches", default=",".join(map(str, batches)))
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile workers")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return (args, args.ops.split(","), args.dtypes.split(","), [int(x) for x in args.ns.split(",")],
            [int(x) for x in args.batches.split(",")], out)
