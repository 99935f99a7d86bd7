"""The GEMM model tier's confidence: regimes, their calibrated error bands, and the serving rule.

The model tier decides between a Triton config and the fallback (torch) on the predicted speedup
log(pred_torch / pred_cfg). Calibration (calibration.uncertainty) measures how far that
prediction over-states the measured speedup, leave-one-signature-out (over every measured config
and over the config predicted fastest at each point, the one a decision serves), per regime: the config's
lane x an M range x an arithmetic-intensity bucket. A regime stores a one-sided upper quantile
of the over-prediction (in log units) and its sample count; sparse regimes are read through
coarser ones (lane x M range, M range, lane, everything). A regime also keeps its support: the
range of log2(2MNK) of the points its residuals came from. A band says nothing about a shape far
outside the shapes it was measured on (held out by model, a 0.8 GFLOP whisper-base GEMM served a
TMA tile whose band came from 5-100 GFLOP whisper-large-v3 GEMMs, 80% slower than torch:
bench/lomo_regret.py), so a point more than SUPPORT_SLACK (a factor 2) outside its regime's
support is declined. serve() is THE rule: a config serves only where its predicted log speedup
exceeds its regime's band (and the regime has at least MIN_SAMPLES samples, and the point lies in
its support); otherwise the fallback serves. Pure Python, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

# M ranges: decode (1), small batches, medium, large, prefill-sized
M_EDGES: tuple[int, ...] = (1, 16, 128, 1024)
M_NAMES: tuple[str, ...] = ("m1", "m2-16", "m17-128", "m129-1024", "m1025+")
# arithmetic intensity 2MNK / bytes(A, B, C) in flop/byte: memory-bound, middle, compute-bound
AI_EDGES: tuple[float, ...] = (16.0, 128.0)
AI_NAMES: tuple[str, ...] = ("ai<16", "ai16-128", "ai128+")
# The band is this quantile of the over-prediction. 0.9 still served a 73% slower pick held out
# on the 2026-11-29 buildall log (+54% predicted, band 52%); 0.95 declined it (bench/confidence_regret.py).
QUANTILE = 0.95
MIN_SAMPLES = 20  # fewer residuals than this say too little about a regime's error
SUPPORT_SLACK = 1.0  # log2: a point may lie this far outside its regime's measured work range
ANY = "*"


def m_range(m: int) -> str:
    for edge, name in zip(M_EDGES, M_NAMES):
        if m <= edge:
            return name
    return M_NAMES[-1]


def ai_bucket(m: int, n: int, k: int, elem: int = 2) -> str:
    ai = 2.0 * m * n * k / max((m * k + n * k + m * n) * elem, 1)
    for edge, name in zip(AI_EDGES, AI_NAMES):
        if ai < edge:
            return name
    return AI_NAMES[-1]


def regimes(lane: str, m: int, n: int, k: int, elem: int = 2) -> tuple[str, ...]:
    """The regime keys of a (config lane, shape), finest first: the full regime, then the coarser
    ones a sparse regime is merged into."""
    mr, ai = m_range(m), ai_bucket(m, n, k, elem)
    return (f"{lane}|{mr}|{ai}", f"{lane}|{mr}|{ANY}", f"{ANY}|{mr}|{ANY}", f"{lane}|{ANY}|{ANY}",
            f"{ANY}|{ANY}|{ANY}")


def upper_quantile(values: Sequence[float], q: float = QUANTILE) -> float:
    """The q-th quantile (linear interpolation between order statistics) of `values`."""
    if not values:
        raise ValueError("upper_quantile needs at least one value")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bands(residuals: Iterable[tuple[str, int, int, int, int, float]], q: float = QUANTILE) -> dict[str, tuple[float, int]]:
    """Per regime key (every level of regimes()) its band (the q-quantile of the over-prediction
    of the log speedup, never below 0) and its sample count, from (lane, m, n, k, elem, residual)
    rows where residual = log(pred speedup) - log(measured speedup)."""
    groups: dict[str, list[float]] = {}
    for lane, m, n, k, elem, r in residuals:
        for key in regimes(lane, m, n, k, elem):
            groups.setdefault(key, []).append(r)
    return {key: (round(max(upper_quantile(rs, q), 0.0), 6), len(rs)) for key, rs in sorted(groups.items())}


def log_work(m: int, n: int, k: int) -> float:
    """log2 of the point's 2MNK: the axis a regime's support is measured on."""
    return math.log2(max(2.0 * m * n * k, 1.0))


def supports(residuals: Iterable[tuple[str, int, int, int, int, float]]) -> dict[str, tuple[float, float]]:
    """Per regime key (every level of regimes()) the (min, max) log2(2MNK) of its rows' points."""
    out: dict[str, tuple[float, float]] = {}
    for lane, m, n, k, elem, _r in residuals:
        w = round(log_work(m, n, k), 4)
        for key in regimes(lane, m, n, k, elem):
            lo, hi = out.get(key, (w, w))
            out[key] = (min(lo, w), max(hi, w))
    return dict(sorted(out.items()))


def band_for(uncertainty: Mapping[str, tuple[float, int]], lane: str, m: int, n: int, k: int,
             elem: int = 2, min_samples: int = MIN_SAMPLES) -> tuple[str, float, int] | None:
    """(regime key, band, samples) of the finest regime of this point with at least min_samples
    residuals; None when none has (the rule then declines)."""
    for key in regimes(lane, m, n, k, elem):
        got = uncertainty.get(key)
        if got is not None and got[1] >= min_samples:
            return key, got[0], got[1]
    return None


def in_support(support: Mapping[str, tuple[float, float]], key: str, m: int, n: int, k: int,
               slack: float = SUPPORT_SLACK) -> bool:
    """Whether the point's work lies within `slack` (log2) of regime `key`'s measured range. A
    regime without a recorded range (a model calibrated before supports were kept) is not checked."""
    rng = support.get(key)
    if rng is None:
        return True
    w = log_work(m, n, k)
    return rng[0] - slack <= w <= rng[1] + slack


@dataclass(frozen=True)
class Decision:
    """What the model tier decided at one point, and why (the report's model line)."""

    config: Any  # the served Config: the best candidate, or the fallback when declined
    best: Any = None  # the predicted-fastest non-fallback candidate (None: only the fallback)
    gain: float | None = None  # predicted log speedup of `best` over the fallback
    band: float | None = None  # its regime's error band (log units); None: too few samples
    samples: int = 0
    regime: str | None = None
    declined: bool = False  # True: `best` was predicted faster, but not beyond the band
    outside: bool = False  # True: declined because the point lies outside its regime's support

    def describe(self) -> str:
        """`b64x64x64... (+12% predicted, error band 8%, n=40)`, or why the fallback serves."""
        if self.best is None or self.gain is None:
            return self.config.id
        gain = f"{math.expm1(self.gain) * 100:+.0f}% predicted"
        band = (f"error band {math.expm1(self.band) * 100:.0f}%, n={self.samples}" if self.band is not None
                else f"no error band: {self.samples} sample(s) in its regime")
        if self.outside:
            return (f"{self.config.id} (declined {self.best.id}: {gain}, but the shape lies outside "
                    f"the work range its error band {self.regime} was measured on)")
        if self.declined:
            return f"{self.config.id} (declined {self.best.id}: {gain}, {band})"
        return f"{self.config.id} ({gain}, {band})"


def serve(ranked: Sequence[tuple[Any, float]], fallback: str, uncertainty: Mapping[str, tuple[float, int]],
          shape: tuple[int, int, int, int], margin: float = 0.0, min_samples: int = MIN_SAMPLES,
          support: Mapping[str, tuple[float, float]] | None = None) -> Decision | None:
    """THE model-tier rule. `ranked`: (config, predicted ms), fastest first; `shape`: (m, n, k,
    elem). Without the fallback among them the fastest serves (nothing to fall back to). Else the
    fastest other config serves only when the point lies in its regime's support and
    log(pred_fallback / pred_config) exceeds both the regime's band and log(1 + margin);
    otherwise the fallback serves."""
    if not ranked:
        return None
    fb = next(((c, ms) for c, ms in ranked if c.id == fallback), None)
    if fb is None:
        return Decision(ranked[0][0])
    best = next(((c, ms) for c, ms in ranked if c.id != fallback), None)
    if best is None or best[1] <= 0 or fb[1] <= 0:
        return Decision(fb[0])
    gain = math.log(fb[1] / best[1])
    m, n, k, elem = shape
    found = band_for(uncertainty, best[0].lane, m, n, k, elem, min_samples)
    if found is None:
        samples = max((uncertainty.get(key, (0.0, 0))[1] for key in regimes(best[0].lane, m, n, k, elem)[:1]),
                      default=0)
        return Decision(fb[0], best[0], gain, None, samples, None, declined=gain > 0)
    key, band, samples = found
    if gain > 0 and not in_support(support or {}, key, m, n, k):
        return Decision(fb[0], best[0], gain, band, samples, key, declined=True, outside=True)
    if gain > max(band, math.log1p(max(margin, 0.0))):
        return Decision(best[0], best[0], gain, band, samples, key)
    return Decision(fb[0], best[0], gain, band, samples, key, declined=gain > 0)
