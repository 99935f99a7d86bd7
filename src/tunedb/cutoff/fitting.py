"""Fit: the cutoff on the switching signal that optimizes the statistic the deployment bounds.

The switch rule is `below` (default: iterative) when signal <= cutoff, else `above` (direct).
For every candidate cutoff (between consecutive distinct signals, plus one past each end: all
`above`, all `below`), the composed per-solve times are the `below` policy's time for solves at
or under the cutoff and the `above` policy's for the rest; the statistic (mean for throughput,
p99 or max for deadlines) of those times is the candidate's value. The optimum is the best
candidate; the band is the contiguous range of candidates around it whose value stays within
`tolerance` (relative) of the optimum; the fitted cutoff is the band's center (on the linear or
log signal scale), not the razor edge, so re-measurement noise moves it less. When the band
reaches an end candidate (one policy within tolerance on every solve past that end, e.g. the
optimum is `above` everywhere), the band is open on that side: every cutoff below the smallest
observed signal (above the largest) gives the same statistic, so the band runs to the signal
domain's end (-inf, 0 on the log scale, +inf) and the cutoff sits one observed signal range past
the observed end.

Pairing the two traces: when they have the same length and their signals agree in order (median
relative difference <= 5%: a seeded workload run once per policy, whose signals differ only by
the solvers' tolerance), solve i of one is solve i of the other, at the mean of the two signals. Otherwise every solve of either trace
takes the other policy's time as the median of that policy's `k` solves nearest in signal.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from tunedb.errors import CutoffError

STATISTICS = ("mean", "p99", "max")
PAIR_RTOL = 0.05  # index pairing: the runs' signals agree to this (median relative difference)


@dataclass(frozen=True)
class Fit:
    statistic: str
    tolerance: float
    below: str
    above: str
    cutoff: float  # the band's center: the decision
    optimum: float  # the best candidate cutoff
    band: tuple[float, float]
    value_at_optimum: float  # ms
    value_at_cutoff: float  # ms
    fixed: Mapping[str, float]  # the statistic of each fixed policy on the same solves (ms)
    solves: int
    pairing: str  # "index" or "nearest"
    scale: str  # "linear" or "log"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["band"] = list(self.band)
        out["fixed"] = dict(self.fixed)
        return json_floats(out)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Fit":
        d = dict(data)
        d["band"] = tuple(float(v) for v in d["band"])
        d["fixed"] = {k: float(v) for k, v in d["fixed"].items()}
        for name in ("tolerance", "cutoff", "optimum", "value_at_optimum", "value_at_cutoff"):
            d[name] = float(d[name])  # "inf" / "nan" as written by json_floats
        return cls(**d)


def json_floats(obj: Any) -> Any:
    """obj with every non-finite float written as its text ("inf", "-inf", "nan"), which float()
    reads back: standard JSON has no Infinity or NaN (jq and JSON.parse refuse the file)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)
    if isinstance(obj, dict):
        return {k: json_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_floats(v) for v in obj]
    return obj


def stat_of(values: Any, stat: str) -> float:
    import numpy as np

    v = np.asarray(values, dtype=float)
    if stat == "mean":
        return float(v.mean())
    if stat == "max":
        return float(v.max())
    if stat == "p99":
        return float(np.percentile(v, 99.0))
    raise CutoffError(f"statistic {stat!r} not supported; allowed: {', '.join(STATISTICS)}")


def _paired(below: Any, above: Any, k: int) -> tuple[Any, Any, Any, str]:
    """(signals, below times, above times, pairing) over a common set of solves."""
    import numpy as np

    sb, tb = np.asarray(below.signals, float), np.asarray(below.times_ms, float)
    sa, ta = np.asarray(above.signals, float), np.asarray(above.times_ms, float)
    if len(sb) == len(sa) and len(sb) and float(np.median(np.abs(sb - sa) / np.maximum(np.abs(sb), np.abs(sa)).clip(1e-300))) <= PAIR_RTOL:
        return (sb + sa) / 2, tb, ta, "index"

    def nearest(sig: Any, other_sig: Any, other_t: Any) -> Any:
        order = np.argsort(other_sig)
        os_, ot = other_sig[order], other_t[order]
        out = np.empty(len(sig))
        for i, s in enumerate(sig):
            j = int(np.searchsorted(os_, s))
            lo, hi = max(0, j - k), min(len(os_), j + k)
            cand = np.arange(lo, hi)
            near = cand[np.argsort(np.abs(os_[cand] - s), kind="stable")[:k]]
            out[i] = float(np.median(ot[near]))
        return out

    sig = np.concatenate((sb, sa))
    return sig, np.concatenate((tb, nearest(sa, sb, tb))), np.concatenate((nearest(sb, sa, ta), ta)), "nearest"


def check_arguments(*, statistic: str = "p99", tolerance: float = 0.02, below: str = "iterative",
                    above: str = "direct", scale: str = "linear", k: int = 5) -> None:
    """fit()'s argument checks, which `tunedb cutoff probe` runs before probing (a typo in --tol
    wasted the whole probe)."""
    if statistic not in STATISTICS:
        raise CutoffError(f"statistic {statistic!r} not supported; allowed: {', '.join(STATISTICS)}")
    # numbers.Real / Integral: a numpy scalar (np.float32(0.02), np.int64(5)) is a number too
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real) or not 0.0 <= tolerance < 1.0:
        raise CutoffError(f"tolerance must be a number in [0, 1); got {tolerance!r}")
    if scale not in ("linear", "log"):
        raise CutoffError(f"scale {scale!r} not supported; allowed: linear, log")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise CutoffError(f"k must be an integer >= 1 (neighbours paired per solve); got {k!r}")
    if below == above:
        raise CutoffError(f"below and above name the same policy {below!r}; a cutoff switches between two")


def fit(traces: Any, *, statistic: str = "p99", tolerance: float = 0.02, below: str = "iterative",
        above: str = "direct", scale: str = "linear", k: int = 5) -> Fit:
    """The cutoff from a Probe (or a {policy: Trace} mapping) holding `below`'s and `above`'s traces."""
    import numpy as np

    check_arguments(statistic=statistic, tolerance=tolerance, below=below, above=above, scale=scale, k=k)
    tolerance, k = float(tolerance), int(k)
    tr = getattr(traces, "traces", traces)
    if not isinstance(tr, dict) or not all(hasattr(t, "times_ms") for t in tr.values()):
        raise CutoffError(f"fit takes a Probe or a {{policy: Trace}} mapping (tunedb.cutoff.probe's); got "
                          f"{type(tr).__name__}" + (f" of {sorted({type(t).__name__ for t in tr.values()})}"
                                                    if isinstance(tr, dict) else ""))
    for p in (below, above):
        if p not in tr or not tr[p].times_ms:
            raise CutoffError(f"no trace (or an empty one) for policy {p!r}; have {sorted(tr)}")
    sig, tb, ta, pairing = _paired(tr[below], tr[above], k)
    order = np.argsort(sig, kind="stable")
    sig, tb, ta = sig[order], tb[order], ta[order]
    uniq = np.unique(sig)
    if scale == "log" and uniq[0] <= 0:
        raise CutoffError(f"scale='log' needs positive signals; the smallest is {uniq[0]}")
    pos = lambda u: np.log(u) if scale == "log" else u  # noqa: E731
    inv = lambda u: float(np.exp(u)) if scale == "log" else float(u)  # noqa: E731
    pu = pos(uniq)
    step = (pu[-1] - pu[0]) / max(len(pu) - 1, 1) or 1.0
    cands = np.concatenate(([pu[0] - step / 2], (pu[:-1] + pu[1:]) / 2, [pu[-1] + step / 2]))
    cuts = [int(np.searchsorted(pos(sig), c, side="right")) for c in cands]  # solves taking `below`
    values = np.array([stat_of(np.concatenate((tb[:j], ta[j:])), statistic) for j in cuts])
    best = int(np.argmin(values))
    opt = float(values[best])
    limit = opt * (1.0 + tolerance) if opt >= 0 else opt * (1.0 - tolerance)
    lo = hi = best
    while lo > 0 and values[lo - 1] <= limit:
        lo -= 1
    while hi + 1 < len(values) and values[hi + 1] <= limit:
        hi += 1
    span = pu[-1] - pu[0] if len(pu) > 1 else 1.0
    low_open, high_open = lo == 0, hi == len(values) - 1
    # An edge candidate stands for every cutoff past that end of the observed signals (they all
    # compose the same times): a band reaching it is open on that side, out to the signal
    # domain's end (-inf, or 0 on the log scale; +inf). Its center is then taken one observed
    # signal range past the observed end, so a re-probe whose smallest (largest) signal moves a
    # little still lands inside the first band (a point band at the edge could not hold it).
    if low_open and not high_open:
        center = min(cands[0], cands[hi] - span)
    elif high_open and not low_open:
        center = max(cands[-1], cands[lo] + span)
    else:
        center = (cands[lo] + cands[hi]) / 2
    band_lo = (0.0 if scale == "log" else -math.inf) if low_open else inv(cands[lo])
    band_hi = math.inf if high_open else inv(cands[hi])
    j = int(np.searchsorted(pos(sig), center, side="right"))
    at_center = stat_of(np.concatenate((tb[:j], ta[j:])), statistic)
    fixed = {below: stat_of(tb, statistic), above: stat_of(ta, statistic)}
    return Fit(statistic, float(tolerance), below, above, inv(center), inv(cands[best]),
               (band_lo, band_hi), opt, float(at_center), fixed, int(len(sig)), pairing, scale)


def within_band(value: float, band: tuple[float, float]) -> bool:
    lo, hi = band
    return bool(lo <= value <= hi) and not math.isnan(value)
