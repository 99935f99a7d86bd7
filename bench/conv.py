"""Convolutions on the GPU: the Conformer's depthwise conv1d (kernel 31) and its conv2d
subsampling front end, every arm side by side in one run, then the Conformer encoder end to end.

    PYTHONPATH=src python bench/conv.py --out DIR [--quick]

Arms per shape: torch's default (cuDNN, benchmark=False: the fallback), cuDNN's own autotuner
(`cudnn_bench`: benchmark=True, timed after its own warm-up, as in a model), channels-last with
and without it, and a sweep of each Triton lane (direct depthwise `dw_*`, implicit GEMM `ig_*`);
the tuned pick is the family's pick rule over the arms measured here: the faster of torch and
cudnn_bench (peers), any other arm only beyond 1.05x over that faster one, 3% tie band; "vs
bench" is cudnn_bench's time over the served pick's. Every arm is first checked against the fp32
convolution (within 4x torch's own error); a failing arm is reported, not timed.

cuDNN caches its plan per thread and per key without the benchmark flag, so whichever mode meets
a shape first in a thread decides the plan of both (session 10's torch and cudnn_bench columns
were one plan twice). Each cuDNN arm therefore runs its check, warm-up and timing in a fresh
thread, and so does each encoder variant.

Timing: one CUDA graph of N calls on the same input (the activations a conv reads in a model
were just written by the op before: warm in L2), outputs allocated inside the graph for every arm
alike; median of 7 replays / N, after warm-up. End to end: the Conformer encoder (the census
preset's layer stack, fp16, B x T frames) in one CUDA graph: plain (cudnn.benchmark=False),
plain with cudnn.benchmark=True, and `tunedb` = only the conv family's optimize() (its fusions: conv2d +
ReLU, and the depthwise conv + its batch norm folded + SiLU) with the picks measured above for
the encoder's own conv keys (benchmark off): tunedb alone.
Writes DIR/conv.json and prints markdown tables. Expected: about 3 min on the H200 (Triton
compiles included: about 60 kernels), --quick (half of each sweep, fewer shapes, a 4-layer
d=256 encoder) about 1.5 min.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunedb.arch import shipped_profile  # noqa: E402
from tunedb.families.conv import FAMILY, keys  # noqa: E402
from tunedb.families.conv.arms import make_inputs  # noqa: E402
from graph_timing import replayed_ms  # noqa: E402  (bench/ is sys.path[0])

CUDNN = ("torch", "cudnn_bench", "cudnn_cl", "cudnn_cl_bench")
DW_SWEEP = ("dw_t32_c64_w4", "dw_t64_c32_w4", "dw_t64_c64_w4", "dw_t128_c32_w4", "dw_t64_c128_w8",
            "dw_t128_c64_w8", "dw_t256_c32_w8", "dw_t128_c16_w4")
IG_SWEEP = ("ig_b64x64x16_w4_s2", "ig_b128x128x32_w8_s3", "ig_b128x64x32_w4_s3", "ig_b128x64x16_w4_s2",
            "ig_b128x128x16_w8_s2", "ig_b64x64x32_w4_s3", "ig_b128x128x64_w8_s3", "ig_b64x128x64_w4_s3")
SM90 = shipped_profile("sm90")
DEVICE = "cuda"  # a module constant so that a CPU smoke run (interpreter, wall clock) can swap it


def dw_sig(c: int) -> object:
    return keys.make_signature("conv1d", "fp16", c, c, 31, 1, 15, 1, c, True)


def sub_sigs(c: int) -> tuple[object, object]:
    first = keys.make_signature("conv2d", "fp16", 1, c, 3, 2, 0, 1, 1, True, "relu", width=80)
    second = keys.make_signature("conv2d", "fp16", c, c, 3, 2, 0, 1, 1, True, "relu", width=39)
    return first, second


def graph_time_ms(fn, calls: int = 20, replays: int = 7) -> float:
    if DEVICE == "cpu":  # the smoke run: wall clock, one call
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    ms = replayed_ms(graph, replays, calls)
    del graph
    return ms


def in_fresh_thread(fn):
    """fn() in a new thread (an empty cuDNN plan cache): its result, or its exception raised here."""
    box = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller
            box["error"] = exc

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def err_of(y, ref) -> float:
    return ((y.float() - ref).norm() / ref.norm()).item()


def measure(sig, batch: int, length: int, sweep: tuple[str, ...]) -> dict:
    """Every valid arm of `sig` at (batch, length): gate, then time."""
    args, _ = make_inputs(sig, 1, DEVICE, seed=0, batch=batch, length=length)
    m = keys.size_of(sig, batch, length)
    ref = FAMILY.reference(sig, *args)
    ids = [c for c in CUDNN + sweep if FAMILY.invalid_reason(FAMILY.parse_config(c), sig, m, SM90) is None]
    errs, times, failed = {}, {}, {}
    bound = None
    # torch first: its error sets the bound. A cuDNN arm is checked and timed in one fresh thread
    # (its first call there is its own: cudnn_bench benchmarks), a Triton arm here.
    for cid in sorted(ids, key=lambda c: c != "torch"):
        launch = FAMILY.launcher(FAMILY.parse_config(cid), sig)

        def check_and_time(launch=launch, cid=cid):
            errs[cid] = err_of(launch(*args), ref)
            limit = 4 * max(errs[cid] if bound is None else bound, 1e-4)
            if errs[cid] > limit:
                failed[cid] = f"error {errs[cid]:.2e} > {limit:.2e}"
            else:
                times[cid] = graph_time_ms(lambda: launch(*args))

        try:
            in_fresh_thread(check_and_time) if cid in CUDNN else check_and_time()
        except Exception as exc:  # noqa: BLE001 -- reported with the row
            failed[cid] = f"{type(exc).__name__}: {exc}"[:200]
        if cid == "torch":
            bound = errs.get("torch", 0.0)
    pick = FAMILY.pick_rule().pick(times)
    triton = {c: t for c, t in times.items() if c.startswith(("dw_", "ig_"))}
    best_triton = min(triton, key=triton.get) if triton else None
    return dict(signature=sig.format(), batch=batch, length=length, M=m, times_ms=times, errors=errs, failed=failed,
                best_triton=best_triton, pick=pick.winner, pick_ms=times[pick.winner],
                speedup_vs_torch=times["torch"] / times[pick.winner],
                speedup_vs_cudnn_bench=times["cudnn_bench"] / times[pick.winner])


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def table(title: str, rows: list[dict]) -> None:
    print(f"\n### {title}\n")
    print("| shape | M | torch us | cudnn_bench us | cudnn_cl us | cl_bench us | best Triton (us) | pick | vs torch | vs bench |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["times_ms"]
        us = lambda c: f"{t[c] * 1e3:.1f}" if c in t else "-"  # noqa: E731
        sig = r["signature"].split("|")
        short = f"{sig[1][3:]} C={sig[3][4:]}->{sig[4][5:]} k={sig[5][2:]} B={r['batch']} L={r['length']}"
        bt = f"{r['best_triton']} ({us(r['best_triton'])})" if r["best_triton"] else "-"
        print(f"| {short} | {r['M']} | {us('torch')} | {us('cudnn_bench')} | {us('cudnn_cl')} | {us('cudnn_cl_bench')} "
              f"| {bt} | {r['pick']} | {r['speedup_vs_torch']:.2f}x | {r['speedup_vs_cudnn_bench']:.2f}x |")
        for cid, why in r["failed"].items():
            print(f"|  | failed: {cid} | {why} |||||||")
    print(f"\ngeomean speedup of the pick: {geomean(r['speedup_vs_torch'] for r in rows):.3f}x vs torch default, "
          f"{geomean(r['speedup_vs_cudnn_bench'] for r in rows):.3f}x vs cudnn.benchmark; "
          f"min vs cudnn.benchmark {min(r['speedup_vs_cudnn_bench'] for r in rows):.3f}x")


def encoder_e2e(picks: dict, d: int, layers: int, batch: int, frames: int) -> dict:
    """The Conformer encoder in one CUDA graph: plain, plain + cudnn.benchmark, tunedb (conv only)."""
    from tunedb.census.models import ConformerEncoder, ConformerMirror, ConvSubsampling
    from tunedb.families.conv.patching import optimize
    from tunedb.runtime import launch_table

    torch.manual_seed(0)
    model = ConformerEncoder(ConvSubsampling(80, d), ConformerMirror(d, 8, 4 * d, layers, 31)).cuda().half().eval()
    x = torch.randn(batch, frames, 80, device="cuda", dtype=torch.float16)
    out = {}

    def plain(benchmark: bool):  # each variant in a fresh thread: its own cuDNN plans
        with torch.no_grad():
            torch.backends.cudnn.benchmark = benchmark
            try:
                return graph_time_ms(lambda: model(x), calls=3), model(x).float()
            finally:
                torch.backends.cudnn.benchmark = False

    out["plain_ms"], ref = in_fresh_thread(lambda: plain(False))
    out["plain_cudnn_benchmark_ms"], _ = in_fresh_thread(lambda: plain(True))
    served = {}

    def from_bench(family, sig, m):
        if family.name != "conv":
            return None
        cid = picks.get((sig.format(), m)) or picks.get(sig.format()) or "torch"
        served[sig.format()] = cid
        return FAMILY.parse_config(cid), "bench"

    def tunedb_variant():
        with torch.no_grad():
            tuned = optimize(model)
            with launch_table.overriding(from_bench):
                return graph_time_ms(lambda: tuned(x), calls=3), err_of(tuned(x), ref)

    out["tunedb_ms"], out["tunedb_error_vs_plain"] = in_fresh_thread(tunedb_variant)
    out["served"] = served
    out["speedup_vs_plain"] = out["plain_ms"] / out["tunedb_ms"]
    out["speedup_vs_plain_cudnn_benchmark"] = out["plain_cudnn_benchmark_ms"] / out["tunedb_ms"]
    return out


def encoder_keys(d: int, batch: int, frames: int) -> list[tuple[object, int, int]]:
    """The conv keys the optimized encoder calls (its ops record them on meta tensors, as
    `tunedb census --fused` does: the subsampling convs with ReLU, the depthwise conv with its
    folded norm and SiLU) with the (B, L) each is called at."""
    from tunedb.census.models import ConformerEncoder, ConformerMirror, ConvSubsampling
    from tunedb.families.conv.patching import optimize
    from tunedb.runtime import launch_table

    with torch.device("meta"):
        model = optimize(ConformerEncoder(ConvSubsampling(80, d), ConformerMirror(d, 8, 4 * d, 1, 31)).half().eval())
    with torch.no_grad(), launch_table.recording() as tuned:
        model(torch.empty(batch, frames, 80, device="meta", dtype=torch.float16))
    t1 = (frames - 3) // 2 + 1
    lengths = (frames, t1, (t1 - 3) // 2 + 1)
    found = {}
    for family, sig, m in tuned:
        if family == "conv":
            found[sig] = next(n for n in lengths if keys.size_of(sig, batch, n) == m)
    return [(sig, batch, n) for sig, n in found.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for conv.json")
    ap.add_argument("--quick", action="store_true", help="fewer channels and sizes (about 1 min)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/conv.py needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.time()
    global DW_SWEEP, IG_SWEEP
    if a.quick:  # half of each sweep: the Triton compiles dominate a quick run
        DW_SWEEP, IG_SWEEP = DW_SWEEP[:4], IG_SWEEP[:4]
    chans = (144, 512) if a.quick else (144, 256, 512)
    sizes = ((1, 750), (16, 750)) if a.quick else ((1, 750), (8, 250), (16, 750), (32, 1500))
    dw_rows = [measure(dw_sig(c), b, t, DW_SWEEP) for c in chans for b, t in sizes]
    table("Conformer depthwise conv1d (k=31, fp16, [B, C, T])", dw_rows)
    front = ((1, 3000), (8, 1000)) if a.quick else ((1, 3000), (8, 1000), (16, 1500))
    sub_rows = []
    for c in ((256,) if a.quick else (144, 512)):
        first, second = sub_sigs(c)
        for b, t in front:
            sub_rows.append(measure(first, b, t, IG_SWEEP))
            sub_rows.append(measure(second, b, (t - 3) // 2 + 1, IG_SWEEP))
    table("Conformer conv2d subsampling (3x3 stride 2 + ReLU, fp16)", sub_rows)
    both = dw_rows + sub_rows
    print(f"\nall Conformer conv shapes: geomean {geomean(r['speedup_vs_torch'] for r in both):.3f}x vs torch, "
          f"{geomean(r['speedup_vs_cudnn_bench'] for r in both):.3f}x vs cudnn.benchmark")
    d, layers, batch, frames = (256, 4, 8, 1000) if a.quick else (512, 16, 8, 1500)
    picks, e2e_rows = {}, []
    for sig, b, t in encoder_keys(d, batch, frames):
        row = measure(sig, b, t, DW_SWEEP if sig.get("g") > 1 else IG_SWEEP)
        e2e_rows.append(row)
        picks[sig.format()] = row["pick"]
    table(f"the encoder's own conv keys (d={d}, B={batch}, T={frames})", e2e_rows)
    e2e = encoder_e2e(picks, d, layers, batch, frames)
    print(f"\n### Conformer encoder end to end (d={d}, {layers} layers, B={batch}, T={frames} frames, fp16, CUDA graph)\n")
    print(f"plain {e2e['plain_ms']:.3f} ms; plain + cudnn.benchmark {e2e['plain_cudnn_benchmark_ms']:.3f} ms; "
          f"tunedb (conv picks) {e2e['tunedb_ms']:.3f} ms -> {e2e['speedup_vs_plain']:.3f}x vs plain, "
          f"{e2e['speedup_vs_plain_cudnn_benchmark']:.3f}x vs cudnn.benchmark; rel. error vs plain "
          f"{e2e['tunedb_error_vs_plain']:.2e}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, quick=a.quick, depthwise=dw_rows,
                  subsampling=sub_rows, encoder_keys=e2e_rows, encoder=e2e, seconds=round(time.time() - started, 1))
    tmp = out / "conv.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(out / "conv.json")
    print(f"\nwrote {out / 'conv.json'} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
