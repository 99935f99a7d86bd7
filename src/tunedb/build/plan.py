"""What a build measures per signature: census points + ladder fill points, and the arms per point.

Per signature: the census points, plus the bucket ladder's edges between the smallest and the
largest census M (weight 0: they locate region boundaries, traffic does not flow through them);
per point: the cost model's top-k valid configs plus the forced arms (the family's sentinels:
default, torch, and fused where it applies), or every valid config with `exhaustive`; each point
also measures its neighbours' ranked configs (``borrow_neighbours``), so a config the model ranks
just past a region edge is measured on both sides of it in every build. The
ranking and the time prediction come in as callables, so this module needs neither the cost
model nor torch; the plan it returns is what `--dry-run` prints and what the build measures.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from tunedb import buckets
from tunedb.errors import BuildError
from tunedb.families import KernelFamily
from tunedb.records import SENTINELS, ArchProfile, Config, Point, Signature, merge_point

TOP_K = 16
CROSS_TOP = 3
# A point borrows the ranked arms of the census points next to it when they lie within this
# factor in M. Why: cross-evaluation picks each point's measured top-3, a rank that noise
# reorders among near-equal configs; a config the model ranks only above a region edge was then
# measured below it in one build and not in the next (session 32: the LM head's M <= 32, a
# 1.06x config, in 5 of 11 builds; the builds agreed on 84-90% of points across that split,
# 95-99% within either side). Borrowing is decided by the model alone, so every build measures it.
# 1.25: dense decode censuses (M = 1..64) borrow (+3.6% arms on Llama-3-8B decode); the ladder's
# sqrt(2) and 2x steps do not (2x would add 77% to whisper-base's arms, and its tune's wall).
NEIGHBOUR_SPAN = 1.25
# Protocol cost per (point, arm) beyond the kernel's own time: the numerical gate, graph capture,
# warm-up and the interleaved rounds' bookkeeping. Used for --dry-run's estimate only.
ARM_OVERHEAD_S = 0.12
# Compiling one Triton config the first time (0 when the prebuild cache has it).
COMPILE_S = 2.0
# Kernel calls timed per (point, arm): rounds x calls per graph replay.
TIMED_CALLS = 400

Ranker = Callable[[Signature, int, Sequence[Config], int], Sequence[str]]  # -> ids, best first
Predictor = Callable[[Signature, int, str], "float | None"]  # -> ms, None when unknown


@dataclass(frozen=True)
class SignaturePlan:
    """One signature's points and, per M, the config ids to measure (ranked first, forced last)."""

    signature: Signature
    points: tuple[Point, ...]  # census points and fill points (weight 0), sorted by M
    census_ms: tuple[int, ...]
    arms: Mapping[int, tuple[str, ...]] = field(hash=False)
    forced: tuple[str, ...] = ()
    cross_pairs: int = 0  # estimated cross-evaluation measurements (from the predicted top-3)
    est_seconds: float = 0.0

    @property
    def fill_ms(self) -> tuple[int, ...]:
        return tuple(p.m for p in self.points if p.m not in set(self.census_ms))

    @property
    def arm_count(self) -> int:
        return sum(len(v) for v in self.arms.values())

    def config_ids(self) -> tuple[str, ...]:
        return tuple(sorted({c for ids in self.arms.values() for c in ids}))


def fill_points(census: Sequence[Point], ladder: bool = True, kind: str = "m") -> tuple[Point, ...]:
    """Census points (one per size) plus, with `ladder`, the edges of the bucket ladder `kind`
    (the family schema's) between their smallest and largest size (weight 0), by size."""
    if not census:
        return ()
    sig = census[0].signature
    if any(p.signature != sig for p in census):
        raise BuildError("fill_points() takes the census points of one signature")
    by_m: dict[int, Point] = {}
    for p in census:
        if p.m in by_m:  # two census rows at one M (two workloads): their traffic adds up
            by_m[p.m] = merge_point([by_m[p.m], p])
        else:
            by_m[p.m] = p
    lo, hi = min(by_m), max(by_m)
    for m in buckets.ladder(lo, hi, kind) if ladder else ():
        by_m.setdefault(m, Point(sig, m, weight=0.0, calls=0))
    return tuple(by_m[m] for m in sorted(by_m))


def candidates(family: KernelFamily, sig: Signature, m: int | None, arch: ArchProfile,
               space: Sequence[Config] | None = None) -> tuple[Config, ...]:
    """The family's non-sentinel configs that its validity predicate accepts for `sig` at M."""
    space = family.config_space(arch.arch_family) if space is None else space
    return tuple(c for c in space
                 if not c.is_sentinel and family.invalid_reason(c, sig, m, arch) is None)


def forced_arms(family: KernelFamily, sig: Signature, approximate: bool = False) -> tuple[str, ...]:
    return tuple(dict.fromkeys(family.sentinels(sig, approximate)))


def arms_for_point(family: KernelFamily, sig: Signature, m: int, arch: ArchProfile, rankers: Sequence[Ranker],
                   *, top_k: int = TOP_K, exhaustive: bool = False, approximate: bool = False,
                   space: Sequence[Config] | None = None) -> tuple[str, ...]:
    """Config ids to measure at one point: the union of every ranker's top-k, then the forced
    arms. The family's concrete default config is measured once, as the sentinel 'default'."""
    valid = candidates(family, sig, m, arch, space)
    forced = forced_arms(family, sig, approximate)
    default_id = family.default_config(sig, arch).id if "default" in forced else None
    if exhaustive:
        ranked = [c.id for c in sorted(valid, key=lambda c: c.id)]
    else:
        ranked = []
        for rank in rankers:
            ranked.extend(rank(sig, m, valid, top_k))
    ids = [c for c in dict.fromkeys(ranked) if c != default_id and c not in forced]
    return tuple(ids) + forced


def borrow_neighbours(arms: Mapping[int, tuple[str, ...]], forced: Sequence[str],
                      valid: Callable[[int, str], bool], span: float = NEIGHBOUR_SPAN) -> dict[int, tuple[str, ...]]:
    """Each point's arms plus the ranked (non-forced) arms of the points next to it in M that lie
    within `span` of it and that `valid` (the family's predicate at this M) accepts; borrowed
    ids come after the point's own ranked ones, the forced arms stay last. Depends on the plan
    only, never on a measurement, so every build of the same points measures the same pairs."""
    ms = sorted(arms)
    out: dict[int, tuple[str, ...]] = {}
    skip = set(forced)
    for i, m in enumerate(ms):
        own = [c for c in arms[m] if c not in skip]
        borrowed: list[str] = []
        for j in (i - 1, i + 1):
            if 0 <= j < len(ms) and max(m, ms[j]) <= span * min(m, ms[j]):
                borrowed += [c for c in arms[ms[j]] if c not in skip and c not in own and valid(m, c)]
        out[m] = tuple(dict.fromkeys(own + borrowed)) + tuple(c for c in arms[m] if c in skip)
    return out


def estimate_seconds(sig: Signature, arms: Mapping[int, Sequence[str]], predict: Predictor | None,
                     cross_pairs: int = 0, compiled: Iterable[str] = ()) -> float:
    """Rough wall time of measuring `arms` (+ cross-evaluation): protocol overhead per arm, the
    timed calls at the predicted kernel time, a compile per config not already compiled."""
    total = 0.0
    known = set(compiled)
    configs: set[str] = set()
    for m, ids in arms.items():
        for cid in ids:
            ms = predict(sig, m, cid) if predict is not None else None
            total += ARM_OVERHEAD_S + TIMED_CALLS * (ms or 0.0) / 1000.0
            configs.add(cid)
    mean_arm = total / max(1, sum(len(v) for v in arms.values()))
    total += cross_pairs * mean_arm
    total += COMPILE_S * len({c for c in configs if c not in known and c not in SENTINELS})
    return total




def plan_signature(family: KernelFamily, census: Sequence[Point], arch: ArchProfile,
                   rankers: Sequence[Ranker], *, top_k: int = TOP_K, exhaustive: bool = False,
                   approximate: bool = False, thin: Callable[[Sequence[Point]], Sequence[Point]] | None = None,
                   fill: bool = True, ladder: str = "m") -> SignaturePlan:
    """The points and arms of one signature. `thin` (partition.thin with --max-points bound)
    caps census + fill points together; fill=False (--no-fill) measures the census's Ms only."""
    points = fill_points(census, ladder=fill, kind=ladder)
    if thin is not None:
        points = tuple(sorted(thin(points), key=lambda p: p.m))
    sig = points[0].signature
    space = family.config_space(arch.arch_family)
    arms = {p.m: arms_for_point(family, sig, p.m, arch, rankers, top_k=top_k, exhaustive=exhaustive,
                                approximate=approximate, space=space) for p in points}
    if not exhaustive:
        by_id = {c.id: c for c in space}
        forced = forced_arms(family, sig, approximate)
        arms = borrow_neighbours(arms, forced, lambda m, cid: cid in by_id and family.invalid_reason(by_id[cid], sig, m, arch) is None)
    census_ms = tuple(sorted({p.m for p in census} & {p.m for p in points}))
    return SignaturePlan(sig, points, census_ms, arms, forced_arms(family, sig, approximate))


def plan_rows(plans: Sequence[SignaturePlan]) -> list[dict[str, Any]]:
    """One JSON-able row per signature for the dry-run table and --json."""
    return [{"signature": p.signature.format(), "census_points": len(p.census_ms),
             "fill_points": len(p.fill_ms), "arms": p.arm_count, "cross_eval": p.cross_pairs,
             "configs": len(p.config_ids()), "forced": list(p.forced), "est_seconds": round(p.est_seconds, 1),
             "M": [pt.m for pt in p.points]} for p in plans]
