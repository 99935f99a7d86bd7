"""The GEMM cost model's decode term: pure Python, no torch (issue 18, item 1).

At M <= DECODE_M a GEMM is a weight read. Its rate is set by Little's law: the bytes a config
keeps in flight (resident CTAs x (stages - 1) loads of a BN x BK weight slab and a BM x BK
activation slab) over the loaded memory latency, capped by the achievable DRAM bandwidth:

    T_decode = fixed + base_us + || (bytes / BW, bytes x latency_us / in_flight) ||_p

(p = infinity: the hard roofline bytes / min(BW, in_flight / latency); p = 1: the latency queued
behind the transfer), with (latency_us, base_us, p) fitted once over every measured plain Triton
decode point (calibration.fit): three numbers shared by every config, so a tile measured only on small weights
is priced on a large one by the same law. A config's decode prediction is the larger of T_decode
and the throughput model's (costmodel._predict_us): the law is a lower bound from the memory
system, the tile line one from the CTA's own work. Models fitted before this term carry no
`decode` entry and keep the throughput model alone.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

DECODE_M = 64  # the largest M the decode term prices
MIN_POINTS = 8  # decode measurements (distinct shapes and configs) the fit needs
_LAT_GRID = tuple(0.2 * 1.15 ** i for i in range(26))  # 0.2 .. 6.6 us
# how the bandwidth and latency bounds combine (stream_us): max first, so a tie keeps the roofline
_COMBINE = (0.0, 4.0, 2.0, 1.0)
# The cap is the profile's DRAM bandwidth, not fitted: a pure weight read reaches it (BENCHMARKS.md,
# the decode lane against the physical read limit), and the decode points a build has on small
# weights never reach it, so they cannot place it: fitted freely on conformer's and whisper-base's
# 0.5-10 MB weights it came out at 0.6 and priced Llama-3-8B's 117 MB weights 26% too slow.
BW_SCALE = 1.0


def in_flight(resident_ctas: int, stages: int, bm: int, bn: int, bk: int, m: int, elem: int) -> float:
    """Bytes the config's resident CTAs keep in flight: (stages - 1) K slabs each, the activation
    rows only as many as the call has (masked rows are not fetched)."""
    return resident_ctas * max(stages - 1, 1) * bk * (bn + min(bm, m)) * elem


def stream_us(nbytes: float, flight: float, bw_bytes_us: float, latency_us: float, bw_scale: float,
              p: float = 0.0) -> float:
    """The read's time: the bandwidth's and the latency's bounds combined as a p-norm (p <= 0:
    the larger, a hard roofline; p = 1: their sum, latency queued behind the transfer)."""
    a, b = nbytes / (bw_scale * bw_bytes_us), nbytes * latency_us / flight
    if p <= 0:
        return max(a, b)
    return (a ** p + b ** p) ** (1.0 / p)


def predict_us(fit: Mapping[str, tuple[float, float]], nbytes: float, flight: float,
               bw_bytes_us: float) -> float | None:
    """The decode term beyond the fixed costs, None where the model has no decode fit."""
    if "stream" not in fit:
        return None
    lat, scale = fit["stream"]
    return fit.get("base", (0.0, 0.0))[0] + stream_us(nbytes, flight, bw_bytes_us, lat, scale,
                                                     fit.get("combine", (0.0, 0.0))[0])


def fit_stream(rows: Sequence[tuple[float, float, float]], bw_bytes_us: float) -> dict[str, tuple[float, float]]:
    """{'stream': (latency_us, 1.0), 'base': (base_us, 0), 'combine': (p, 0)} from rows (bytes,
    in-flight bytes, measured us beyond the fixed costs): per (p, latency) on a grid the base is
    the median of what the stream leaves unexplained (kept within [0, 4] us), and the triple with
    the least mean |log(pred / measured)| wins; {} with fewer than MIN_POINTS rows."""
    rows = [r for r in rows if r[2] > 0]
    if len(rows) < MIN_POINTS:
        return {}
    best: tuple[float, float, float, float] | None = None
    for p in _COMBINE:
        for lat in _LAT_GRID:
            s = [stream_us(b, f, bw_bytes_us, lat, BW_SCALE, p) for b, f, _ in rows]
            left = sorted(y - x for x, (_, _, y) in zip(s, rows))
            base = min(max(left[len(left) // 2], 0.0), 4.0)
            loss = sum(abs(math.log((base + x) / y)) for x, (_, _, y) in zip(s, rows)) / len(rows)
            if best is None or loss < best[0]:
                best = (loss, lat, base, p)
    assert best is not None
    return {"stream": (round(best[1], 6), BW_SCALE), "base": (round(best[2], 6), 0.0), "combine": (best[3], 0.0)}
