"""Where torch's linear + log_softmax spends its time, and whether a one-read log-softmax pays.

    PYTHONPATH=src python bench/lsm_probe.py --out DIR

Issue 25's `gemm_log_softmax` goal (>= 1.3x torch's F.linear + log_softmax at 5k-32k
vocabularies, M = 64..8192) is out of reach for the fused Triton designs (s10 B: 0.57-0.99x:
their GEMM tiles trail cuBLAS by more than the one round trip of the logits fusion saves). This
probe splits torch's pair on the GPU: F.linear alone (cuBLAS), torch.log_softmax alone on the
logits, and a Triton row kernel that reads each row of logits once (the whole row in registers:
the family's `linear_rows` kernel at R=1), takes max and sum of exp in fp32 and writes logit - lse
(in place or to a new tensor): if torch's
log_softmax runs far from the memory floor (read + write of M x N in the input dtype at 4.3
TB/s), cuBLAS + the row kernel is an arm worth adding to the family.
Timing: a CUDA graph of n calls (the head's weight rotated through copies to be read cold), the
median of 7 replays / n (bench/graph_timing.py). Every arm is checked against the fp32
reference. Expected run time on an H200: under a minute. Writes DIR/lsm_probe.json.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

from tunedb.families.gemm_log_softmax import kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graph_timing import replay_ms  # noqa: E402

HBM = 4.3e12
SHAPES = [(n, 512, m) for n in (5000, 32000) for m in (64, 1024, 8192)]


def row_lsm(logits: torch.Tensor, out: torch.Tensor, warps: int) -> torch.Tensor:
    """The family's linear_rows pass at one row a program, the whole row in registers."""
    m, n = logits.shape
    kernels._rows_kernel[(m,)](logits, out, m, n, logits.stride(0), out.stride(0), R=1,
                               C=triton.next_power_of_2(n), ONE=True, VEC=1, GDC=False, num_warps=warps)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t_start = time.perf_counter()
    dev = "cuda"
    rows = []
    print("| N | K | M | linear us | log_softmax us | torch pair us | row lsm us (w) | linear + row lsm us | pair / (linear + row) | lsm floor us | torch lsm / floor | row / floor | max err torch / row |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, k, m in SHAPES:
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn((m, k), generator=g, device=dev).to(torch.bfloat16)
        w = (torch.randn((n, k), generator=g, device=dev) * (3.0 * k ** -0.5)).to(torch.bfloat16)
        b = (torch.randn((n,), generator=g, device=dev) * 0.5).to(torch.bfloat16)
        copies = max(1, math.ceil(2 * 60 * 2**20 / (n * k * 2)) + 1) if n * k * 2 < 120 * 2**20 else 2
        ws = [w.clone() for _ in range(copies)]
        ref = torch.log_softmax(torch.nn.functional.linear(x.float(), w.float(), b.float()), -1)
        logits = torch.nn.functional.linear(x, w, b)
        out = torch.empty_like(logits)
        torch_pair = torch.log_softmax(torch.nn.functional.linear(x, w, b), -1)
        err_t = (torch_pair.float() - ref).abs().max().item()
        best = None
        for warps in (4, 8, 16):
            row_lsm(logits, out, warps)
            err_r = (out.float() - ref).abs().max().item()
            if not err_r <= 4 * err_t + 1e-2:
                print(f"row lsm w{warps} wrong at N={n} M={m}: {err_r} vs torch {err_t}")
                continue
            us = 1e3 * replay_ms(lambda i: row_lsm(logits, out, warps), 20)
            if best is None or us < best[0]:
                best = (us, warps, err_r)
        lin = 1e3 * replay_ms(lambda i: torch.nn.functional.linear(x, ws[i % copies], b), 20)
        lsm = 1e3 * replay_ms(lambda i: torch.log_softmax(logits, -1), 20)
        pair = 1e3 * replay_ms(lambda i: torch.log_softmax(torch.nn.functional.linear(x, ws[i % copies], b), -1), 20)
        bw = best[1] if best else 8

        def lin_row(i: int) -> None:
            lg = torch.nn.functional.linear(x, ws[i % copies], b)
            row_lsm(lg, lg, bw)  # in place: the logits' buffer becomes the output
        both = 1e3 * replay_ms(lin_row, 20)
        floor = 1e6 * 2 * m * n * 2 / HBM
        row = dict(N=n, K=k, M=m, linear_us=lin, lsm_us=lsm, pair_us=pair, row_us=best[0] if best else None,
                   row_warps=bw, linear_row_us=both, floor_us=floor, err_torch=err_t, err_row=best[2] if best else None)
        rows.append(row)
        print(f"| {n} | {k} | {m} | {lin:.1f} | {lsm:.1f} | {pair:.1f} | {row['row_us'] or float('nan'):.1f} (w{bw}) | "
              f"{both:.1f} | {pair / both:.2f} | {floor:.1f} | {lsm / floor:.2f} | {(row['row_us'] or float('nan')) / floor:.2f} | "
              f"{err_t:.3g} / {row['err_row'] or float('nan'):.3g} |", flush=True)
    ratios = [r["pair_us"] / r["linear_row_us"] for r in rows]
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"\ntorch pair / (cuBLAS linear + row lsm): geomean {gm:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                wall_s=round(time.perf_counter() - t_start, 1), geomean=gm)
    (Path(args.out) / "lsm_probe.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
