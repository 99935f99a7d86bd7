"""Partitioning one signature's M axis into regions: pure, deterministic, noise-stable.

Steps (DESIGN.md "The build"): the caller measures the census and fill points plus a
cross-evaluation set (``cross_eval_plan``); ``partition`` then chooses a shared config set by
weighted greedy set cover (every point gets a config within ``tol`` of its best), segments the
sorted M axis by dynamic programming (one config per contiguous region), gates every region
against the fallback arm, or its fastest peer (``rule.peers``: a region of the fallback's group
goes to the fastest of it) -- a config must beat it by ``min_speedup`` at the weighted geomean over
the region's points, else that reference keeps the region -- merges equal neighbours and rounds
regions up (a region's m_hi is the largest measured M it covers). ``thin`` caps a dense census.

Every margin comes from the family's PickRule (families.contract): noise stability (spec 003's
tie band) -- a config within ``tie_band`` of a point's best counts exactly as good as the best,
and ties go to the simpler arm (``rule.order``), so a re-run whose noise stays inside the
margins emits the same regions; the gate (``min_speedup`` over the fallback); and the dependency
margin, with the dependency-free partition kept beside the full one (``regions_native``).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from tunedb.errors import BuildError
from tunedb.families.contract import PickRule
from tunedb.records import Measurement, Point, Region, merge_point

Table = Mapping[tuple[int, str], float]  # (M, config id) -> objective in ms (ok measurements only)


@dataclass(frozen=True)
class Partition:
    """What partition() decided for one signature."""

    regions: tuple[Region, ...]
    notes: tuple[str, ...]
    chosen: tuple[str, ...]  # the set cover's configs, in the order greedy picked them
    regions_native: tuple[Region, ...] | None = None  # the dependency-free winner (spec 003)


def objective_table(measurements: Iterable[Measurement], alpha: Mapping[int, float] | float = 0.0,
                    reference: str | None = None) -> dict[tuple[int, str], float]:
    """{(M, config id): GPU time + alpha * host time} over ok measurements; alpha per M or global.
    A config measured twice at one M keeps its later measurement (a log is appended in order).

    With `reference` (the rule's fallback), an arm timed in the same protocol call as the
    reference (env "run") gets its GPU time from paired rounds: the median over their shared
    rounds of arm / reference, times the reference's level at that M (the median of its calls'
    medians). Why: a level shift in the middle of a call (clocks, a neighbour's traffic) moves
    both arms of a round, but not equally many samples of each, so two medians taken apart can
    differ by 10% on a 7 us kernel (session 12, N=1024 at M=7); the paired ratio does not move.
    Arms without a paired reference call (older logs, a failed reference) keep their median."""
    meas = list(measurements)
    refs = _references(meas, reference) if reference is not None else {}
    level = {m: statistics.median(r.median_ms for r in by_run.values()) for m, by_run in refs.items()}
    out: dict[tuple[int, str], float] = {}
    for x in meas:
        a = alpha.get(x.m, 0.0) if isinstance(alpha, Mapping) else float(alpha)
        value = x.objective(a)
        if value is None or not value > 0:  # no valid time (a log from before the protocol said so)
            continue
        if x.m in level:
            ref = refs[x.m].get(_run_of(x)) if x.config_id != reference else None
            gpu = level[x.m] if x.config_id == reference else _paired(x, ref, level[x.m])
            if gpu is not None:
                value = gpu + a * (x.host_us or 0.0) / 1000.0
        out[(x.m, x.config_id)] = value
    return out


PAIRED_MIN_ROUNDS = 3


def _references(meas: Sequence[Measurement], reference: str) -> dict[int, dict[str, Measurement]]:
    """M -> call id -> the reference's ok measurement in that call ('' for a log without ids)."""
    refs: dict[int, dict[str, Measurement]] = {}
    for x in meas:
        if x.config_id == reference and x.status.ok and x.median_ms is not None:
            refs.setdefault(x.m, {})[_run_of(x)] = x
    return refs


def paired_points(measurements: Iterable[Measurement], reference: str) -> set[int]:
    """The Ms where objective_table puts arms on the reference's level from paired rounds: the
    reference was timed there, ok, by a call with an id (logs from before session 32 have none)."""
    return {m for m, by_run in _references(list(measurements), reference).items() if any(by_run)}


def _run_of(x: Measurement) -> str:
    return str(dict(x.env).get("run", ""))


def _paired(x: Measurement, ref: Measurement | None, level: float) -> float | None:
    """x's GPU time on the reference's level from their shared rounds; None when unpaired."""
    if ref is None or not _run_of(x):
        return None
    n = min(len(x.samples), len(ref.samples))
    if n < PAIRED_MIN_ROUNDS or any(r <= 0 for r in ref.samples[:n]):
        return None
    return statistics.median(s / r for s, r in zip(x.samples[:n], ref.samples[:n])) * level


def cross_eval_plan(points: Sequence[Point] | Sequence[int], ranked_per_point: Mapping[int, Sequence[str]],
                    top: int = 3, measured: Iterable[tuple[int, str]] = ()) -> tuple[tuple[int, str], ...]:
    """(M, config id) pairs to measure: every point's top-`top` configs at every other point,
    minus pairs already measured. Sorted, so the plan is the same on every run."""
    if top < 1:
        raise BuildError(f"cross-evaluation top={top} must be >= 1")
    ms = sorted({p.m if isinstance(p, Point) else int(p) for p in points})
    done = set(measured)
    for m, ranked in ranked_per_point.items():
        done.update((m, cid) for cid in ranked)
    tops = sorted({cid for m in ms for cid in list(ranked_per_point.get(m, ()))[:top]})
    return tuple((m, cid) for m in ms for cid in tops if (m, cid) not in done)


def _bands(ms: Sequence[int], table: Table, rule: PickRule) -> tuple[dict[tuple[int, str], bool], dict[tuple[int, str], float]]:
    """Per (M, config): whether it is as good as the point's best (inside the tie band of the
    winning kind), and its cost ratio to that best (1 inside the band). The winning kind at a
    point is dependency-free unless the fastest arm needing a dependency beats the fastest
    dependency-free one by more than the rule's dep_margin (spec 003); arms of the other kind
    never count as tied, and the dependency kind ties within its own band (PickRule.dep_band)."""
    covers: dict[tuple[int, str], bool] = {}
    cost: dict[tuple[int, str], float] = {}
    for m in ms:
        row = {c: t for (mm, c), t in table.items() if mm == m}
        native = [t for c, t in row.items() if rule.is_native(c)]
        deps = [t for c, t in row.items() if not rule.is_native(c)]
        dep_wins = bool(deps) and (not native or min(native) > min(deps) * (1.0 + rule.dep_margin))
        best = min(deps) if dep_wins else min(native)
        for c, t in row.items():
            ratio = t / best
            same_kind = rule.is_native(c) != dep_wins
            band = rule.dep_band() if dep_wins else rule.tie_band  # the tier's own band (PickRule.pick)
            covers[(m, c)] = same_kind and ratio <= 1.0 + band
            cost[(m, c)] = 1.0 if covers[(m, c)] else max(ratio, 1.0 + band)
    return covers, cost


def _effective_weights(points: Sequence[Point]) -> dict[int, float]:
    """Per-M weight; fill points (weight 0) get 1% of the mean positive weight so that they
    still matter a little to the DP and the gate without outvoting real traffic."""
    # math.fsum (exactly rounded) so that the weights, and every tie the greedy cover breaks on
    # them, do not depend on the order the points come in
    parts: dict[int, list[float]] = {}
    for p in points:
        parts.setdefault(p.m, []).append(p.weight)
    by_m = {m: math.fsum(ws) for m, ws in parts.items()}
    positive = [w for w in by_m.values() if w > 0]
    floor = 0.01 * (math.fsum(positive) / len(positive)) if positive else 1.0
    return {m: w + floor for m, w in by_m.items()}


def set_cover(ms: Sequence[int], table: Table, weights: Mapping[int, float], rule: PickRule) -> tuple[str, ...]:
    """Weighted greedy set cover: configs in pick order until every M has one as good as its best
    (the rule's tie band)."""
    configs = sorted({cid for (_, cid) in table}, key=rule.order)
    rank = {c: i for i, c in enumerate(configs)}
    band, _ = _bands(ms, table, rule)
    covers: dict[str, set[int]] = {c: {m for m in ms if band.get((m, c))} for c in configs}
    uncovered, chosen = set(ms), []
    while uncovered:
        # Most covered weight; ties: more points, then the simpler arm (configs are in that order).
        pick = max(configs, key=lambda c: (math.fsum(weights[m] for m in covers[c] & uncovered),
                                           len(covers[c] & uncovered), -rank[c]))
        chosen.append(pick)
        uncovered -= covers[pick]
    return tuple(chosen)


def segment(ms: Sequence[int], table: Table, weights: Mapping[int, float], chosen: Sequence[str],
            rule: PickRule) -> list[tuple[int, int, str]]:
    """DP over sorted ms: contiguous (i, j, config) segments from `chosen` minimising
    sum(w * cost) + penalty * regions. cost is 1 inside the tie band and time/best beyond it, so
    noise inside the band moves nothing; the penalty is half the smallest point's band, so a
    region is added only to serve a point inside its band."""
    n = len(ms)
    order = sorted(chosen, key=rule.order)
    _, costs = _bands(ms, table, rule)
    penalty = 0.5 * rule.tie_band * min(weights[m] for m in ms)
    # prefix[c][i]: cost of serving ms[:i] with c; gaps[c][i]: how many of ms[:i] c lacks
    prefix: dict[str, list[float]] = {}
    gaps: dict[str, list[int]] = {}
    for c in order:
        acc, missing, row, gap = 0.0, 0, [0.0], [0]
        for m in ms:
            if (m, c) not in costs:
                missing += 1
            else:
                acc += weights[m] * costs[(m, c)]
            row.append(acc)
            gap.append(missing)
        prefix[c], gaps[c] = row, gap
    # dp[j] = (cost, regions) of the best segmentation of ms[:j]; equal ones keep the first found,
    # and the loops visit simpler configs and longer last segments first.
    dp: list[tuple[float, int] | None] = [None] * (n + 1)
    back: list[tuple[int, str] | None] = [None] * (n + 1)
    dp[0] = (0.0, 0)
    for j in range(1, n + 1):
        for i in range(j):
            if dp[i] is None:
                continue
            for c in order:
                if gaps[c][j] != gaps[c][i]:
                    continue  # c was not measured somewhere in the segment
                seg = prefix[c][j] - prefix[c][i]
                cand = (dp[i][0] + seg + penalty, dp[i][1] + 1)
                if dp[j] is None or _better(cand, dp[j]):
                    dp[j], back[j] = cand, (i, c)
    if dp[n] is None:
        raise BuildError("no chosen config is measured at every point of any segmentation")
    out, j = [], n
    while j > 0:
        i, c = back[j]
        out.append((i, j, c))
        j = i
    return out[::-1]


def _better(a: tuple[float, int], b: tuple[float, int]) -> bool:
    """Lower cost beyond float rounding, then fewer regions."""
    scale = max(abs(a[0]), abs(b[0]), 1e-30)
    if abs(a[0] - b[0]) > 1e-9 * scale:
        return a[0] < b[0]
    return a[1] < b[1]


def _geomean_speedup(ms: Sequence[int], table: Table, weights: Mapping[int, float], config: str,
                     fallback: str) -> float | None:
    num = den = 0.0
    for m in ms:
        t, f = table.get((m, config)), table.get((m, fallback))
        if t is None or f is None or t <= 0 or f <= 0:
            continue
        num += weights[m] * math.log(f / t)
        den += weights[m]
    return math.exp(num / den) if den > 0 else None


def _reference(ms: Sequence[int], table: Table, weights: Mapping[int, float], rule: PickRule) -> str:
    """The gate's reference over a region: the fallback, or a peer of it (rule.peers) measured at
    every point of the region and faster than it at the weighted geomean (the fastest such)."""
    best, best_speedup = rule.fallback, 1.0
    for peer in rule.peers:
        if all((m, peer) in table for m in ms):
            speedup = _geomean_speedup(ms, table, weights, peer, rule.fallback)
            if speedup is not None and speedup > best_speedup:
                best, best_speedup = peer, speedup
    return best


def partition(points: Sequence[Point], table: Table, rule: PickRule | None = None, *, catch_all: bool = True,
              fallback: str | None = None, min_speedup: float | None = None, tol: float | None = None) -> Partition:
    """Regions for one signature's points from measured objectives {(M, config id): ms}, under
    the pick rule (default: PickRule(); fallback/min_speedup/tol override its fields).

    Points with no ok measurement are skipped (noted). With catch_all (the build) a last region
    [None, fallback] serves every M above the largest measured one; without it (autotune) every
    region ends at a measured M. An empty result means nothing was measured. When the table
    holds arms that need a dependency, regions_native is the same partition over the
    dependency-free arms alone."""
    rule = _rule(rule, fallback, min_speedup, tol)
    if len({p.signature for p in points}) > 1:
        raise BuildError("partition() takes the points of one signature")
    for (m, cid), t in table.items():
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise BuildError(f"objective at M={m} for {cid!r} is {t!r}; expected a positive finite time")
    full = _partition(points, table, rule, catch_all)
    if all(rule.is_native(c) for (_, c) in table):
        return full
    native = _partition(points, {k: t for k, t in table.items() if rule.is_native(k[1])}, rule, catch_all)
    return replace(full, regions_native=native.regions)


def _rule(rule: PickRule | None, fallback: str | None, min_speedup: float | None, tol: float | None) -> PickRule:
    rule = rule or PickRule()
    if min_speedup is not None and not 1.0 <= min_speedup < float("inf"):  # NaN included
        raise BuildError(f"min_speedup={min_speedup} must be a finite number >= 1.0")
    if tol is not None and not 0.0 <= tol < 1.0:
        raise BuildError(f"tol={tol} must be in [0, 1)")
    over = {k: v for k, v in (("fallback", fallback), ("min_speedup", min_speedup), ("tie_band", tol))
            if v is not None}
    return replace(rule, **over) if over else rule


def effective_points(ms: Sequence[int], weights: Mapping[int, float]) -> float:
    """Kish's effective sample size of the region's weighted geomean: (sum w)^2 / sum w^2."""
    ws = [weights.get(m, 0.0) for m in ms]
    sq = sum(w * w for w in ws)
    return (sum(ws) ** 2 / sq) if sq > 0 else float(len(ms))


def _partition(points: Sequence[Point], table: Table, rule: PickRule, catch_all: bool) -> Partition:
    fallback, min_speedup = rule.fallback, rule.min_speedup
    notes: list[str] = []
    measured_ms = {m for (m, _) in table}
    ms = sorted({p.m for p in points} & measured_ms)
    skipped = sorted({p.m for p in points} - measured_ms)
    if skipped:
        notes.append(f"no ok measurement at M={','.join(map(str, skipped))}: not partitioned")
    if not ms:
        return Partition((Region(None, fallback),) if catch_all else (), tuple(notes), ())
    kept = set(ms)
    table = {(m, c): t for (m, c), t in table.items() if m in kept}
    weights = _effective_weights([p for p in points if p.m in kept])
    chosen = set_cover(ms, table, weights, rule)
    segments = segment(ms, table, weights, chosen, rule)
    must = {p.m for p in points if p.must_tune}
    gated: list[tuple[int, str]] = []  # (index of last M, config)
    for i, j, c in segments:
        region_ms = ms[i:j]
        ref = _reference(region_ms, table, weights, rule)
        if c in (fallback, *rule.peers):  # the fallback's group serves its fastest (rule.peers)
            if c != ref:
                notes.append(f"M<={region_ms[-1]}: {c} gave way to its peer {ref}")
            c = ref
        speedup = _geomean_speedup(region_ms, table, weights, c, ref) if c != ref else 1.0
        need = rule.required(effective_points(region_ms, weights))
        if c != ref and speedup is not None and speedup < need and min_speedup > 1.0:
            notes.append(f"M<={region_ms[-1]}: {c} kept {ref} ({speedup:.2f}x < {need:.2f}x gate)")
            c = ref
        elif c != ref:
            heavy = max(region_ms, key=lambda m: (weights[m], m))
            star = "*" if heavy in must else ""
            note = f" ({speedup:.2f}x vs {ref})" if speedup is not None else f" ({ref} unmeasured)"
            notes.append(f"M={heavy}{star}: {c}{note}")
        if gated and gated[-1][1] == c:
            gated[-1] = (j - 1, c)
        else:
            gated.append((j - 1, c))
    regions = [Region(ms[last], c) for last, c in gated]
    if catch_all:
        # Regions round up: a config serves only sizes at or below the largest M it was
        # measured at; above that the fallback answers.
        if regions[-1].config_id == fallback:
            regions[-1] = Region(None, fallback)
        else:
            regions.append(Region(None, fallback))
    return Partition(tuple(regions), tuple(notes), chosen)


def thin(points: Sequence[Point], max_points: int) -> tuple[Point, ...]:
    """Per signature: keep the smallest and largest M and the heaviest point of each of
    max_points - 2 equal log-M bins; a dropped point's weight, calls and must-tune move to the
    next kept point above it (the one whose region serves it). Result sorted by (signature, M)."""
    if max_points < 2:
        raise BuildError(f"--max-points={max_points} must be >= 2 (the smallest and largest M stay)")
    by_sig: dict = {}
    for p in points:
        by_sig.setdefault(p.signature, []).append(p)
    out: list[Point] = []
    for sig in sorted(by_sig):
        pts = sorted(by_sig[sig], key=lambda p: p.m)
        if len(pts) <= max_points:
            out.extend(pts)
            continue
        lo, hi = math.log(pts[0].m), math.log(pts[-1].m)
        bins = max_points - 2
        keep = {0, len(pts) - 1}
        heaviest: dict[int, int] = {}
        for idx in range(1, len(pts) - 1) if bins > 0 else ():
            b = min(bins - 1, int((math.log(pts[idx].m) - lo) / (hi - lo) * bins)) if hi > lo else 0
            cur = heaviest.get(b)
            if cur is None or pts[idx].weight > pts[cur].weight:
                heaviest[b] = idx
        keep.update(heaviest.values())
        carry: list[Point] = []
        for idx, p in enumerate(pts):
            if idx not in keep:
                carry.append(p)
                continue
            out.append(merge_point(carry + [p], at=p))
            carry = []
    return tuple(out)
