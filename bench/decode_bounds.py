"""The arithmetic of bench/decode_limit.py (pure Python, no torch): which weights a decode census
reads, shares of the bandwidth, the fixed per-kernel cost fitted from the read roofline, the
upper bound on an end-to-end speedup from GEMM selection alone, and the goal verdicts.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, Sequence

BW = 4.3e12  # the bandwidth the decode goals are stated against (ANCHORS.md "Decode")
GEMM_OPS = ("gemm", "gemm_act")
GOAL_BW, GOAL_GEOMEAN, GOAL_E2E, GOAL_MIN_MB = 0.85, 1.15, 1.10, 16.0


def census_weights(path: str | Path, max_bytes: float | None = None) -> list[tuple[int, int]]:
    """The distinct (N, K) weights a census's GEMMs read (gemm and gemm_act; bmm has no weight),
    smallest first; those over max_bytes (bf16/fp16) left out. ValueError when none remain."""
    data = json.loads(Path(path).read_text())
    seen = set()
    for p in data.get("points", []):
        fields = dict(f.split("=", 1) for f in p["signature"].split("|")[1:] if "=" in f)
        if fields.get("op") in GEMM_OPS:
            seen.add((int(fields["N"]), int(fields["K"])))
    out = sorted((nk for nk in seen if max_bytes is None or weight_bytes(*nk) <= max_bytes),
                 key=lambda nk: (weight_bytes(*nk), nk))
    if not out:
        raise ValueError(f"{path}: no gemm/gemm_act weights"
                         + (f" of at most {max_bytes / 1e6:.0f} MB" if max_bytes is not None else ""))
    return out


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'28672x4096,4096x4096' -> [(28672, 4096), (4096, 4096)] (N x K, positive)."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            n, k = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {part!r}: expected NxK with positive integers, e.g. 28672x4096") from None
        if n < 1 or k < 1:
            raise ValueError(f"shape {part!r}: N and K must be positive")
        out.append((n, k))
    if not out:
        raise ValueError("no shapes given: expected NxK[,NxK...]")
    return out


def parse_ms(text: str, example: str = "1,4,8,16") -> list[int]:
    """'1,16' -> [1, 16]: decode M values, each 1..16 (the decode lane's sizes)."""
    try:
        ms = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ms = []
    if not ms or not all(1 <= m <= 16 for m in ms):
        raise ValueError(f"--ms {text!r}: expected integers in 1..16, e.g. {example}")
    return ms


def weight_bytes(n: int, k: int, elem: int = 2) -> int:
    return n * k * elem


def share(nbytes: float, us: float, bw: float = BW) -> float:
    """The fraction of `bw` that moving nbytes in `us` microseconds reaches."""
    return nbytes / (us * 1e-6) / bw


def geomean(xs: Iterable[float]) -> float:
    xs = list(xs)
    if not xs or min(xs) <= 0:
        raise ValueError(f"geomean needs positive values, got {xs}")
    return math.exp(sum(map(math.log, xs)) / len(xs))


def fit_fixed_cost(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares t_us = fixed_us + bytes / bw over (bytes, t_us): (fixed_us, bw in B/s), the
    per-kernel cost no byte rate removes and the streaming rate of large weights."""
    if len({b for b, _ in points}) < 2:
        raise ValueError("fitting a fixed cost needs at least two distinct sizes")
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    slope = sum((b - mb) * (t - mt) for b, t in points) / sum((b - mb) ** 2 for b, _ in points)
    if slope <= 0:
        raise ValueError(f"times do not grow with bytes ({points}); no bandwidth to fit")
    return mt - slope * mb, 1e6 / slope


def e2e_bound(t_step: float, t_gemm: float, t_gemm_new: float) -> float:
    """The step's speedup if its GEMMs took t_gemm_new instead of t_gemm and nothing else changed:
    t_step / (t_step - t_gemm + t_gemm_new)."""
    if not 0 < t_gemm <= t_step:
        raise ValueError(f"the GEMMs' time {t_gemm} must be positive and within the step's {t_step}")
    if t_gemm_new <= 0:
        raise ValueError(f"the new GEMM time {t_gemm_new} must be positive")
    return t_step / (t_step - t_gemm + t_gemm_new)


def gemm_row(nbytes: int, read_us: float, cublas_us: float, lane_us: float | None) -> dict:
    """One (weight, M) point: each arm's share of 4.3 TB/s and of the read roofline at that size,
    lane / cuBLAS, and the ceiling (what a GEMV at the roofline would be over cuBLAS)."""
    row = {"read_us": read_us, "cublas_us": cublas_us, "cublas_bw": share(nbytes, cublas_us),
           "cublas_of_roof": read_us / cublas_us, "ceiling": cublas_us / read_us}
    if lane_us is not None:
        row.update(lane_us=lane_us, lane_bw=share(nbytes, lane_us), lane_of_roof=read_us / lane_us,
                   speedup=cublas_us / lane_us)
    return row


def verdicts(rows: list[dict], e2e: list[dict]) -> list[str]:
    """The decode and end-to-end goals against what was measured and against their ceilings.

    rows: per (weight, M), with N, K, M, MB, read_us, read_bw and gemm_row's fields; e2e: per
    batch, with batch, bound_roof (and optionally lane_e2e)."""
    lines = []
    big = [r for r in rows if r["M"] == 1 and r["MB"] >= GOAL_MIN_MB]
    if big:
        worst = min(big, key=lambda r: r.get("lane_bw", 0.0))
        roof_worst = min(big, key=lambda r: r["read_bw"])
        out_of_reach = [f"{r['N']}x{r['K']} ({r['read_bw']:.1%})" for r in big if r["read_bw"] < GOAL_BW]
        lines.append(
            f"bandwidth goal (>= {GOAL_BW:.0%} of 4.3 TB/s at M=1, weights >= {GOAL_MIN_MB:.0f} MB): lane worst "
            f"{worst.get('lane_bw', 0.0):.1%} at {worst['N']}x{worst['K']}; the read roofline's worst "
            f"{roof_worst['read_bw']:.1%} at {roof_worst['N']}x{roof_worst['K']}; "
            + (f"out of reach of any kernel at {', '.join(out_of_reach)} (a pure read is below the goal there)"
               if out_of_reach else "within reach of a pure read at every size"))
    beaten = [f"{r['N']}x{r['K']} M={r['M']} ({name} {t:.2f} us < {r['read_us']:.2f} us)"
              for r in rows for name, t in (("cuBLAS", r["cublas_us"]), ("lane", r.get("lane_us")))
              if t is not None and t < r["read_us"] / 1.02]
    if beaten:
        lines.append("the read roofline is not a ceiling at " + ", ".join(beaten)
                     + ": a GEMM read faster than every pure read there, so the ceilings at those sizes are low")
    with_lane = [r for r in rows if "speedup" in r]
    if with_lane:
        raw = geomean(r["speedup"] for r in with_lane)
        gated = geomean(max(1.0, r["speedup"]) for r in with_lane)
        ceiling = geomean(max(1.0, r["ceiling"]) for r in rows)
        lines.append(
            f"geomean goal (>= {GOAL_GEOMEAN:.2f}x cuBLAS over {len(with_lane)} points): lane {raw:.3f}x, through the "
            f"gate {gated:.3f}x; ceiling (every GEMM at the read roofline, gated) {ceiling:.3f}x: "
            + ("the goal is above the physical ceiling" if ceiling < GOAL_GEOMEAN
               else f"the lane reaches {(gated - 1) / (ceiling - 1):.0%} of the ceiling's gain" if ceiling > 1
               else "no gain is available"))
    for e in e2e:
        b = e["bound_roof"]
        lines.append(
            f"e2e goal (tunedb >= {GOAL_E2E:.2f}x plain, b{e['batch']}, graph): GEMM share {e['gemm_share']:.1%}; "
            f"bound from GEMM selection alone {b:.3f}x"
            + (f", the lane's GEMMs would give {e['lane_e2e']:.3f}x" if e.get("lane_e2e") else "")
            + (": the goal is above the physical limit" if b < GOAL_E2E else ": the goal is within the bound"))
    return lines
