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


# The GEMV kernel's term (`gv` configs, configs_gemv.py): a weight read at its measured rate. Its
# prediction is this term alone (no tile line, no fitted decode law: those come from the tile
# kernels' points). Fitted once, by a grid search of mean |log(pred / measured)|, on session 16
# C's 56 cold CUDA-graph times of the space's slabs and their nearest kin (gv1 16x256 / 8x512 /
# 16x512 `_lr`, 4x512 `_lr`, gv2 16x512 `_lr`, gv1 32x256 / 64x256 `_mma`; bench/decode_gemv_bf16.py
# --quick on the Llama-3-8B decode weights, M = 1, 4, 8, 16, BENCHMARKS.md s16 C): mean error
# 4.6%, worst 19% (the FMA path at M=4 on the 14336-deep weight, over-predicted).
GV_FIXED_US = 4.25  # a graph-launched call's launch, ramp and drain
GV_BW_SHARE = 0.95  # of the profile's DRAM bandwidth, for a long stream
GV_LATENCY_US = 2.0  # loaded latency: each resident CTA keeps its S tiles in flight per this
GV_FMA_US = 1.6e-7  # the FMA path's issue time per weight element and padded row, whole GPU (132 SMs)
GV_SPLIT_US = 3.0  # split-K's tail: the last split's partial loads, sum and store
_GV_SMS = 132
_GV_MAX_CTAS = 32


def gemv_resident(smem: int, warps: int, smem_per_sm: int) -> int:
    """CTAs of a `gv` config one SM holds: its shared memory, 64 warps, 32 CTAs."""
    return max(1, min(smem_per_sm // max(smem, 1), 64 // warps, _GV_MAX_CTAS))


def gemv_us(n: int, k: int, mp: int, bn: int, bk: int, stages: int, warps: int, split: int, dot: bool,
            smem: int, elem: int, sms: int, smem_per_sm: int, bw_bytes_us: float) -> float:
    """A `gv` call's time in us at (N, K) with MP padded rows: fixed + the slower of the weight
    stream and (FMA path) the product's issue time + split-K's tail. The stream runs at the
    bandwidth's share or, where the grid holds too few bytes in flight, at the busiest SM's CTAs
    x S tiles per latency (an unsplit 64-row slab at N = 4096 fills 64 of 132 SMs)."""
    nbytes = n * k * elem
    ctas = -(-n // bn) * split
    per_sm = -(-ctas // sms)
    conc = min(per_sm, gemv_resident(smem, warps, smem_per_sm))
    cta_rate = stages * bn * bk * elem / GV_LATENCY_US
    stream = max(nbytes / (GV_BW_SHARE * bw_bytes_us), per_sm * (nbytes / ctas) / (conc * cta_rate))
    issue = 0.0 if dot else n * k * mp * GV_FMA_US * _GV_SMS / sms
    return GV_FIXED_US + max(stream, issue) + (GV_SPLIT_US if split > 1 else 0.0)
