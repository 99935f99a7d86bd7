"""The GEMM model tier's confidence: regimes, their calibrated error bands, and the serving rule.

The model tier decides between a Triton config and the fallback (torch) on the predicted speedup
log(pred_torch / pred_cfg). Calibration (calibration.with_bands) measures how far that prediction
over-states the measured speedup twice: leave-one-signature-out and leave-one-group-out (a group:
signatures linked by a shared N or K, in practice one model's layers, so the residuals include
extrapolation to a model nobody measured), over every measured config and over the config
predicted fastest at each point (the one a decision serves). Per regime (the config's lane, marked
when torch runs the activation as a kernel of its own, x an M range x an arithmetic-intensity bucket) the band is the widest of those four residual sets'
distribution-free upper confidence bounds on their 0.9-quantile (quantile_bound): heavy tails
widen it, and a regime with too few residuals for the bound is read through a coarser one (lane x
M range, M range, lane, everything). A regime also keeps its support: the (log2 M, log2 N, log2 K)
points its residuals came from. serve() is THE rule: a config serves only where (1) the point lies
within a factor 2 in M, N and K of some point of its regime's support (else the band is an
extrapolation and says nothing) and (2) the lower bound of its predicted gain, predicted log
speedup minus band, exceeds log(1 + margin); or, where that declines, (3) the lower bound with
the LOCAL band clears the margin: the largest residual of the model's decisions (the predicted-
fastest config, any lane) at training points of the same epilogue kind whose M lies within a
factor 2, held out by signature and by group, at least LOCAL_MIN of each (local_band). The local
band needs no (N, K) near the point: a model nobody measured has hidden sizes of its own, so the
support of (2) declines every shape of it (bench/lomo_regret.py: 0 of 198 held-out points
served). Otherwise the fallback serves. Pure Python, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tunedb.errors import ConfigError

# M ranges: decode (1), small batches, medium, large, prefill-sized
M_EDGES: tuple[int, ...] = (1, 16, 128, 1024)
M_NAMES: tuple[str, ...] = ("m1", "m2-16", "m17-128", "m129-1024", "m1025+")
# arithmetic intensity 2MNK / bytes(A, B, C) in flop/byte: memory-bound, middle, compute-bound
AI_EDGES: tuple[float, ...] = (16.0, 128.0)
AI_NAMES: tuple[str, ...] = ("ai<16", "ai16-128", "ai128+")
# The band is an upper confidence bound on this quantile of the over-prediction, not the sample
# quantile: held out by model (bench/lomo_regret.py) the residuals are heavy-tailed, and the sample
# 0.95-quantile of 21 residuals (72%) let through a +114% prediction whose truth was -10%. The
# distribution-free bound is an order statistic X_(j) with P(X_(j) >= the true quantile) >= CONFIDENCE;
# with fewer than MIN_SAMPLES residuals even the largest is no such bound, so the regime is too
# sparse to speak for itself and is read through a coarser one.
QUANTILE = 0.9
CONFIDENCE = 0.9
MIN_SAMPLES = math.ceil(math.log(1.0 - CONFIDENCE) / math.log(QUANTILE))  # 22: 1 - q^n >= confidence
# A point is in a regime's support when some point its residuals came from lies within this many
# octaves of it in each of log2 M, log2 N and log2 K (a factor 2): a band says nothing about
# shapes far from the shapes it was measured on (held out by model, a K=512 M=42 GEMM read a band
# measured on K=4096 decode GEMMs and M>=1500 K=512 ones, and lost 14%).
SUPPORT_SLACK = 1.0
ANY = "*"
# The local band's evidence: each population (decisions held out by signature, and by group: a
# model nobody measured) needs at least this many residuals near the point. Held out by model
# (bench/lomo_regret.py --sanity), 1 let a wrong tile through at M=96 (9% regret), 2 holds on
# every split and its inner splits, 3 serves nothing anywhere: the evidence is thin, and says so.
LOCAL_MIN = 2
LOCAL_POPULATIONS = ("signature", "group")


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


ACT = "+act"  # a lane suffix: the fallback runs the activation as a kernel of its own


def epilogue_kind(act: Any) -> str:
    """ACT where the fallback (torch) runs a signature's activation as a second kernel, else ''.
    The speedup over torch is then a different quantity (Triton fuses the activation, torch pays
    a launch and a pass over the output), so its residuals are a population of their own: pooled
    with the plain GEMM's, a silu twin's real 30% win made the model's +114% on the plain K=512
    GEMM look nearly right, and the plain one, which torch wins, was served."""
    return ACT if act not in (None, "none") else ""


def regimes(lane: str, m: int, n: int, k: int, elem: int = 2) -> tuple[str, ...]:
    """The regime keys of a (config lane, shape), finest first: the full regime, then the coarser
    ones a sparse regime is merged into. A lane ending in ACT (epilogue_kind) keeps its kind at
    every level: the coarsest key of such a lane is '*+act|*|*'."""
    mr, ai = m_range(m), ai_bucket(m, n, k, elem)
    anyl = ANY + ACT if lane.endswith(ACT) else ANY
    return (f"{lane}|{mr}|{ai}", f"{lane}|{mr}|{ANY}", f"{anyl}|{mr}|{ANY}", f"{lane}|{ANY}|{ANY}",
            f"{anyl}|{ANY}|{ANY}")


def quantile_bound(values: Sequence[float], q: float = QUANTILE, conf: float = CONFIDENCE) -> float | None:
    """The smallest order statistic of `values` that is >= their distribution's q-quantile with
    probability >= conf (the count below the quantile is Binomial(n, q)); None when even the
    largest is not (fewer than MIN_SAMPLES values at the defaults)."""
    xs = sorted(values)
    n = len(xs)
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile_bound needs 0 < q < 1, got q={q}")
    cdf = 0.0
    for j in range(1, n + 1):
        i = j - 1  # in log space: (1 - q)^n underflows for a few thousand residuals
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        + i * math.log(q) + (n - i) * math.log1p(-q))  # now P(Binomial(n, q) <= j - 1)
        if cdf >= conf - 1e-12:
            return xs[j - 1]
    return None


def bands(residuals: Iterable[tuple[str, int, int, int, int, float]], q: float = QUANTILE) -> dict[str, tuple[float, int]]:
    """Per regime key (every level of regimes()) its band (quantile_bound of the over-prediction
    of the log speedup; the largest residual where the regime is too sparse for the bound; never
    below 0) and its sample count, from (lane, m, n, k, elem, residual) rows where residual =
    log(pred speedup) - log(measured speedup)."""
    groups: dict[str, list[float]] = {}
    for lane, m, n, k, elem, r in residuals:
        for key in regimes(lane, m, n, k, elem):
            groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        bound = quantile_bound(rs, q)
        out[key] = (round(max(bound if bound is not None else max(rs), 0.0), 6), len(rs))
    return out


Point = tuple[float, float, float]  # (log2 M, log2 N, log2 K)


def log_point(m: int, n: int, k: int) -> Point:
    """The axes a regime's support is measured on: log2 of M, N and K (together they fix the
    work, the arithmetic intensity and the tile grid)."""
    return (round(math.log2(max(m, 1)), 3), round(math.log2(max(n, 1)), 3), round(math.log2(max(k, 1)), 3))


def supports(residuals: Iterable[tuple[str, int, int, int, int, float]]) -> dict[str, tuple[Point, ...]]:
    """Per regime key (every level of regimes()) the distinct (log2 M, log2 N, log2 K) points its
    rows came from."""
    out: dict[str, set[Point]] = {}
    for lane, m, n, k, elem, _r in residuals:
        p = log_point(m, n, k)
        for key in regimes(lane, m, n, k, elem):
            out.setdefault(key, set()).add(p)
    return {key: tuple(sorted(pts)) for key, pts in sorted(out.items())}


def band_for(uncertainty: Mapping[str, tuple[float, int]], lane: str, m: int, n: int, k: int,
             elem: int = 2, min_samples: int = MIN_SAMPLES) -> tuple[str, float, int] | None:
    """(regime key, band, samples) of the finest regime of this point with at least min_samples
    residuals; None when none has (the rule then declines)."""
    for key in regimes(lane, m, n, k, elem):
        got = uncertainty.get(key)
        if got is not None and got[1] >= min_samples:
            return key, got[0], got[1]
    return None


def in_support(support: Mapping[str, Sequence[Point]], key: str, m: int, n: int, k: int,
               slack: float = SUPPORT_SLACK) -> bool:
    """Whether some point regime `key`'s band was measured on lies within `slack` octaves of
    (m, n, k) in each of M, N and K. A range per axis would not do: a regime measured on small-M
    deep-K points and on large-M shallow-K ones covers both ranges but no small-M shallow-K point."""
    here = log_point(m, n, k)
    return any(all(abs(a - b) <= slack + 1e-9 for a, b in zip(here, p)) for p in support.get(key, ()))


LocalRow = tuple[str, float, float]  # (epilogue kind, log2 M, residual) of one held-out decision


def local_rows(residuals: Iterable[tuple[str, int, int, int, int, float]]) -> tuple[LocalRow, ...]:
    """The local band's rows of (lane, m, n, k, elem, residual) decision residuals: only the
    epilogue kind and log2 M are kept (the local band pools lanes: it scores the decision, which
    picks among them, and N and K are what a new model changes)."""
    return tuple(sorted((ACT if lane.endswith(ACT) else "", round(math.log2(max(m, 1)), 3), round(r, 6))
                        for lane, m, _n, _k, _e, r in residuals))


def parse_local(raw: Any) -> dict[str, tuple[LocalRow, ...]]:
    """A model file's `local` ({population: [[kind, log2 M, residual], ...]}); {} when absent."""
    out = {}
    for pop, rows in (raw or {}).items():
        if not (isinstance(rows, (list, tuple)) and all(
                isinstance(r, (list, tuple)) and len(r) == 3 and isinstance(r[0], str)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r[1:]) for r in rows)):
            raise ConfigError(f"cost-model local[{pop!r}] must be [[kind, log2 M, residual], ...], got {rows!r:.80}")
        out[str(pop)] = tuple((r[0], float(r[1]), float(r[2])) for r in rows)
    return out


def local_band(local: Mapping[str, Sequence[LocalRow]], kind: str, m: int, slack: float = SUPPORT_SLACK,
               min_samples: int = LOCAL_MIN) -> tuple[float, int] | None:
    """(band, samples) at a point of epilogue kind `kind` and this M: the largest residual (never
    below 0) of every LOCAL_POPULATIONS row of that kind whose M lies within `slack` octaves; None
    where a population is missing or has fewer than min_samples such rows."""
    here = round(math.log2(max(m, 1)), 3)  # as local_rows stores it: M=3 and M=6 are one octave apart
    near = []
    for pop in LOCAL_POPULATIONS:
        rs = [r for k, lm, r in local.get(pop, ()) if k == kind and abs(lm - here) <= slack + 1e-9]
        if len(rs) < min_samples:
            return None
        near += rs
    return max(max(near), 0.0), len(near)


@dataclass(frozen=True)
class Decision:
    """What the model tier decided at one point, and why (the report's model line)."""

    config: Any  # the served Config: the best candidate, or the fallback when declined
    best: Any = None  # the predicted-fastest non-fallback candidate (None: only the fallback)
    gain: float | None = None  # predicted log speedup of `best` over the fallback
    band: float | None = None  # its regime's error band (log units); None: too few samples
    samples: int = 0
    regime: str | None = None
    declined: bool = False  # True: `best` was predicted faster, but its gain's lower bound not beyond the margin
    outside: bool = False  # True: declined because the point lies outside its regime's support
    local: bool = False  # True: served on the local band (band/samples are the local ones)

    def describe(self) -> str:
        """`b64x64x64... (+12% predicted, error band 8%, n=40)`, or why the fallback serves."""
        if self.best is None or self.gain is None:
            return self.config.id
        gain = f"{math.expm1(self.gain) * 100:+.0f}% predicted"
        band = (f"error band {math.expm1(self.band) * 100:.0f}%, n={self.samples}" if self.band is not None
                else f"no error band: {self.samples} sample(s) in its regime")
        if self.outside:
            return (f"{self.config.id} (declined {self.best.id}: {gain}, but no shape its error band "
                    f"{self.regime} was measured on lies within a factor 2 in M, N and K)")
        if self.local:
            return (f"{self.config.id} ({gain}, local error band {math.expm1(self.band) * 100:.0f}%: the worst "
                    f"of {self.samples} held-out decisions within a factor 2 of M)")
        if self.declined:
            return f"{self.config.id} (declined {self.best.id}: {gain}, {band})"
        return f"{self.config.id} ({gain}, {band})"


def serve(ranked: Sequence[tuple[Any, float]], fallback: str, uncertainty: Mapping[str, tuple[float, int]],
          shape: tuple[int, int, int, int], margin: float = 0.0, min_samples: int = MIN_SAMPLES,
          support: Mapping[str, Sequence[Point]] | None = None, epilogue: str = "",
          local: Mapping[str, Sequence[LocalRow]] | None = None) -> Decision | None:
    """THE model-tier rule. `ranked`: (config, predicted ms), fastest first; `shape`: (m, n, k,
    elem). Without the fallback among them the fastest serves (nothing to fall back to). Else the
    fastest other config serves only when the point lies in its regime's support (`support`
    None: not checked, for hand-made params; `epilogue`: epilogue_kind of the signature, which
    picks the regimes) and the lower bound of its predicted gain,
    log(pred_fallback / pred_config) - band, exceeds log(1 + margin), or where the regime
    declines, the lower bound with the local band does (`local`: the model's LocalRows per
    population; None or empty: no local band); otherwise the fallback serves."""
    d = _regime_decision(ranked, fallback, uncertainty, shape, margin, min_samples, support, epilogue)
    if d is None or not local or not d.declined or d.gain is None:
        return d
    found = local_band(local, epilogue, shape[0])
    if found is None or d.gain - found[0] <= math.log1p(max(margin, 0.0)):
        return d
    return Decision(d.best, d.best, d.gain, found[0], found[1], f"local{epilogue}", local=True)


def _regime_decision(ranked: Sequence[tuple[Any, float]], fallback: str, uncertainty: Mapping[str, tuple[float, int]],
                     shape: tuple[int, int, int, int], margin: float, min_samples: int,
                     support: Mapping[str, Sequence[Point]] | None, epilogue: str) -> Decision | None:
    """The rule's regime part: (1) and (2) of the module docstring."""
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
    lane = best[0].lane + epilogue
    found = band_for(uncertainty, lane, m, n, k, elem, min_samples)
    if found is None:
        samples = max((uncertainty.get(key, (0.0, 0))[1] for key in regimes(lane, m, n, k, elem)[:1]),
                      default=0)
        return Decision(fb[0], best[0], gain, None, samples, None, declined=gain > 0)
    key, band, samples = found
    if gain > 0 and support is not None and not in_support(support, key, m, n, k):
        return Decision(fb[0], best[0], gain, band, samples, key, declined=True, outside=True)
    if gain - band > math.log1p(max(margin, 0.0)):
        return Decision(best[0], best[0], gain, band, samples, key)
    return Decision(fb[0], best[0], gain, band, samples, key, declined=gain > 0)
