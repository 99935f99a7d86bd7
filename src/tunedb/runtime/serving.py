"""How a database serves a call, written once for the selector and the oracle: the serving-key
walk (a family's keys for a signature, in runs of one op), the measured support a region's config
needs at the call's size, and the model tier's candidate set.

Pure: no torch, no GPU, no concrete family (a family comes in through its contract hooks).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from tunedb.families.contract import hook
from tunedb.records import ArchProfile, Config, Entry, Signature


def serving_keys(fam: Any, sig: Signature) -> tuple[Signature, ...]:
    """Database keys that may serve `sig`, most specific first (the family's serving_keys hook)."""
    return tuple(hook(fam, "serving_keys")(sig))


def by_op(keys: Iterable[Signature]) -> list[tuple[Signature, ...]]:
    """The serving keys in runs of one op, in the family's order (most specific first). Every tier
    is asked the keys of the call's own op before any key of another op (gemm_act falling back to
    the plain op's entry, which never measured the epilogue): an exact entry in a lower tier beats
    a fallback entry in a higher one."""
    groups: list[list[Signature]] = []
    for key in keys:
        if groups and groups[-1][0].op == key.op:
            groups[-1].append(key)
        else:
            groups.append([key])
    return [tuple(g) for g in groups]


def walk(fam: Any, sig: Signature, m: int, sources: Iterable[tuple[Any, Mapping[Signature, Entry]]],
         native: bool = False, record: bool = False) -> Iterable[tuple[Any, Signature, str]]:
    """(source, key, config id) in serving order for `sig` at size m over `sources` ((tag,
    entries) pairs, the highest tier first): each op run of keys is asked of every source. A
    region's config that its entry's evidence does not support at m (`unsupported`) is replaced
    by the pick rule's fallback; `record` (the selector's walk) keeps why for the report. An
    arm whose optional dependency is not installed here (the family's `dependency_available`)
    gives way to the entry's dependency-free regions."""
    sources = list(sources)
    available = hook(fam, "dependency_available")
    for group in by_op(serving_keys(fam, sig)):
        for tag, entries in sources:
            for key in group:
                entry = entries.get(key)
                cid = entry.lookup(m, native) if entry is not None else None
                own_native = native
                if cid is not None and not native and entry.regions_native is not None and not available(cid):
                    own_native, cid = True, entry.lookup(m, native=True)
                if cid is not None:
                    why = unsupported(fam, entry, m, cid, own_native)
                    if why is not None:
                        if record:
                            _fallbacks[(fam.name, sig, m)] = (key, cid, why)
                        cid = hook(fam, "pick_rule")().fallback
                    yield tag, key, cid


def entry_serves(fam: Any, entry: Entry, m: int) -> str | None:
    """The config `entry` serves at size m: its region's, or the pick rule's fallback where the
    entry's evidence does not support the region's config there (`unsupported`, as `walk` does)."""
    cid = entry.lookup(m)
    if cid is not None and unsupported(fam, entry, m, cid) is not None:
        return hook(fam, "pick_rule")().fallback
    return cid


# How far from a measured size a region's config may serve: one octave (a factor 2), the support
# slack the GEMM model tier's confidence rule uses (families/gemm/confidence.SUPPORT_SLACK).
SUPPORT_OCTAVES = 1.0

# Past the measured range (a family's `extrapolates` hook) a config keeps serving only where it
# beat the fallback by this much at the edge: a margin that a difference in how the two scale
# with the size cannot eat (linalg's winners beat torch 3-48x at the shipped grid's edges).
EXTRAPOLATION_MARGIN = 1.5

# (family, signature, m) -> (entry key, the region's config, why the fallback served instead)
_fallbacks: dict[tuple[str, Signature, int], tuple[Signature, str, str]] = {}


def unsupported(fam: Any, entry: Entry, m: int, cid: str, native: bool = False) -> str | None:
    """Why the evidence of `entry` does not support serving its region's config `cid` at size m
    (None: it does). A config other than the pick rule's fallback (and its peers) serves m when
    (1) it won a measured size of its region within a factor 2 of m, or (2) m lies between two
    measured sizes and at both the config measured faster than the fallback by the gate, or
    (2b) between two measured sizes its time above m beats the fallback's time below m
    (_bounded_between: neither time falls as the size grows), or (3) m
    lies beyond the measured range, the family's `extrapolates` hook allows it for the signature,
    and the config won and beat the fallback by EXTRAPOLATION_MARGIN at the edge size. Else m
    lies beyond what was measured (M=1 from a region measured only at M=1500, a catch-all far
    above the largest size, a gap of 7 octaves) and the fallback, never slower than the vendor
    op by construction, serves. An entry with no evidence (autotune's, a hand-written one) is
    taken as written."""
    rule = hook(fam, "pick_rule")()
    if cid == rule.fallback or cid in rule.peers or not entry.evidence:
        return None
    sizes = sorted(_size(k) for k in entry.evidence if _size(k) is not None)
    if not sizes or m < 1:
        return None
    lo, hi = _region_bounds(entry, m, native)
    won = [s for s in sizes if lo < s and (hi is None or s <= hi)]
    if any(abs(math.log2(m / s)) <= SUPPORT_OCTAVES + 1e-9 for s in won):
        return None
    below = [s for s in sizes if s < m]
    above = [s for s in sizes if s > m]
    if below and above and all(_beats(entry.evidence[f"M={s}"], cid, rule) for s in (below[-1], above[0])):
        return None
    if below and above and _bounded_between(entry, cid, rule, below, above):
        return None
    edge = sizes[0] if m < sizes[0] else sizes[-1] if m > sizes[-1] else None
    if (edge is not None and edge in won and hook(fam, "extrapolates")(entry.signature)
            and _beats(entry.evidence[f"M={edge}"], cid, rule, EXTRAPOLATION_MARGIN)):
        return None
    near = min(won, key=lambda s: abs(math.log2(m / s))) if won else None
    where = f"won at M={near}" if near is not None else "won at no measured size of its region"
    return (f"{cid} {where}; M={m} is more than a factor 2 from it and not between two measured sizes "
            f"({sizes[0]}..{sizes[-1]}) where it beat {rule.fallback}: {rule.fallback} serves")


def _bounded_between(entry: Entry, cid: str, rule: Any, below: list[int], above: list[int]) -> bool:
    """Rule (2b): between two measured sizes, `cid` timed at the nearest size above m faster (by
    the gate) than the fallback at the nearest size below m where each was timed. Time does not
    fall as the size grows (more problems, more rows), so at m the config takes at most its time
    above and the fallback at least its time below: the config is the faster there too. It
    serves a size between two regions whose winners differ (linalg potrf fp32 n=8: warp_p2_w1
    won batch 256, warp_p8_w1 batch 4096, torch 3.7x and 7x slower; batch 1000 fell to torch)."""
    def time_of(size: int, arm: str) -> float | None:
        got = point_times(entry.evidence[f"M={size}"], arm)
        return got[0] if got else None

    mine = next((t for t in (time_of(s, cid) for s in above) if t is not None), None)
    base = next((t for t in (time_of(s, rule.fallback) for s in reversed(below)) if t is not None), None)
    return mine is not None and base is not None and mine > 0 and base >= mine * rule.min_speedup


def _size(key: str) -> int | None:
    try:
        return int(key[2:]) if key.startswith("M=") else None
    except ValueError:
        return None


def _region_bounds(entry: Entry, m: int, native: bool) -> tuple[int, int | None]:
    """(exclusive lower bound, inclusive upper bound or None) of the region serving m."""
    regions = entry.regions_native if native and entry.regions_native is not None else entry.regions
    lo = 0
    for region in regions:
        if region.m_hi is None or region.m_hi >= m:
            return lo, region.m_hi
        lo = region.m_hi
    return lo, None


# An evidence point whose pick compared another statistic than the median names it (`_stat`,
# e.g. linalg's "q25" under `--pick low`) and keeps it per arm under `_stat:<arm>` (ms, as the
# [median_ms, sigma_ms, n] triple's first element); a point without them was decided on medians.
STAT = "_stat"
STAT_KEY = "_stat:"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def point_times(point: Mapping[str, Any], *arms: str) -> tuple[float, ...] | None:
    """The times of `arms` at one evidence point in the statistic the pick compared: each arm's
    `_stat:<arm>` where the point names a statistic and has it for every one of them, else their
    medians (never one of each); None when an arm has no measurement there (a failure status)."""
    triples = [point.get(a) for a in arms]
    if not all(isinstance(t, (list, tuple)) and t and _number(t[0]) for t in triples):
        return None
    if point.get(STAT) is not None:
        stats = [point.get(STAT_KEY + a) for a in arms]
        if all(_number(v) for v in stats):
            return tuple(float(v) for v in stats)
    return tuple(float(t[0]) for t in triples)


def _beats(point: Mapping[str, Any], cid: str, rule: Any, margin: float = 1.0) -> bool:
    """Whether `cid` measured faster than the fallback by the gate (and `margin`) at one
    evidence point, in the statistic the point's pick compared (point_times)."""
    got = point_times(point, cid, rule.fallback)
    if got is None:
        return False
    mine, base = got
    return mine > 0 and base >= mine * max(rule.min_speedup, margin)


def fallbacks(family: str | None = None) -> dict[tuple[str, Signature, int], tuple[Signature, str, str]]:
    """The sizes this epoch where a region's config lacked measured support and the fallback
    served: (family, signature, m) -> (entry key, the region's config, why)."""
    # a copy first (one C call, atomic under the GIL): another thread resolving a new shape adds
    # to the dict meanwhile ("dictionary changed size during iteration" in tuning_report())
    return {key: v for key, v in _fallbacks.copy().items() if family is None or key[0] == family}


def fallback_line(family: str) -> str | None:
    """`bmm: 2 shape(s) beyond their entry's measured sizes: ...`; None when there were none."""
    mine = fallbacks(family)
    if not mine:
        return None
    return (f"{family}: {len(mine)} shape(s) beyond their entry's measured sizes (the region's config won "
            f"no size within a factor 2, nor beat the fallback at the measured sizes on both sides): "
            f"the fallback served")


def model_candidates(fam: Any, sig: Signature, compiled: Iterable[Config], profile: ArchProfile,
                     approximate: bool = False, m: int | None = None) -> tuple[Config, ...]:
    """What the model tier chooses among: the compiled, valid, non-sentinel configs (sorted by
    id), plus the pick rule's fallback when it applies to `sig` -- the framework's op is a
    candidate too: where no compiled config is predicted to beat it, the model tier answers the
    fallback (held out of calibration on the H200 log: 16% geomean regret over tiles alone, 3%
    with torch; bench/costmodel_heldout.py). Empty when no compiled config is valid. Judged at
    size `m` when given (the call's: linalg's block lane cannot launch past CUDA's grid limit),
    else for every size."""
    configs = tuple(sorted((c for c in compiled if not c.is_sentinel
                            and fam.invalid_reason(c, sig, m, profile) is None), key=lambda c: c.id))
    if not configs:
        return ()
    fallback = hook(fam, "pick_rule")().fallback
    if fallback in fam.sentinels(sig, approximate):
        configs += (Config.sentinel(fallback),)
    return configs


# (family, signature, m) -> the model tier's Decision this epoch (what the report explains)
_decisions: dict[tuple[str, Signature, int], Any] = {}


def model_pick(model: Any, sig: Signature, m: int, candidates: tuple[Config, ...],
               family: str | None = None) -> Config | None:
    """The model tier's pick through the family model's serving rule: its decide() when it has
    one (the GEMM confidence rule: a config serves only beyond its regime's error band), noted
    for the report under `family`; else its pick()."""
    decide = getattr(model, "decide", None)
    if decide is None:
        return model.pick(sig, m, candidates)
    decision = decide(sig, m, candidates)
    if decision is None:
        return None
    if family is not None:
        _decisions[(family, sig, m)] = decision
    return decision.config


def decision(family: str, sig: Signature, m: int) -> Any:
    """The model tier's noted Decision at (sig, m) this epoch, or None."""
    return _decisions.get((family, sig, m))


def decisions(family: str | None = None) -> dict[tuple[str, Signature, int], Any]:
    return {key: d for key, d in _decisions.copy().items() if family is None or key[0] == family}


def forget_decisions() -> None:
    _decisions.clear()
    _fallbacks.clear()


def confidence_line(family: str) -> str | None:
    """`gemm model tier: 3 shape(s) served a config, 5 declined (predicted gain inside the error
    band)`; None when the model tier decided nothing this epoch."""
    mine = decisions(family)
    if not mine:
        return None
    served = sum(1 for d in mine.values() if getattr(d, "best", None) is not None and d.config is d.best)
    declined = sum(1 for d in mine.values() if getattr(d, "declined", False))
    return (f"{family} model tier: {len(mine)} unmeasured shape(s), {served} served a predicted-faster "
            f"config, {declined} declined (predicted gain not beyond the model's error band, or the shape far from every "
            f"measured one: the fallback serves)")
