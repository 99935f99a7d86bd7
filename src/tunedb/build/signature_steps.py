"""One signature's build, in the three steps a serial build runs in line and a multi-GPU build
hands out point by point (build/point_tasks.py): every point's arms (first_requests), then each
point's leaders at the other points (cross_requests, which needs every first result), then the
partition into regions and the evidence it rests on (finish_signature, evidence).
build_signature chains them for one measurer.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tunedb import families
from tunedb.build import partition
from tunedb.build import plan as buildplan
from tunedb.build.steps import pick_rule
from tunedb.families.contract import PickRule
from tunedb.records import Entry, Measurement, Signature


def build_signature(plan: buildplan.SignaturePlan, measure: Callable[..., tuple[Measurement, ...]],
                    opts: Any, on_arms: Callable[[int], None] = lambda n: None, rule: PickRule | None = None,
                    ) -> tuple[Entry, list[Measurement]]:
    """Measure one signature's plan, cross-evaluate, partition under `rule` (default: the
    measurer's, else the family's with --min-speedup): its Entry and every measurement."""
    meas: list[Measurement] = []
    for m, ids, alpha, decides in first_requests(plan):
        got = measure(plan.signature, m, ids, alpha, decides=decides)
        meas.extend(got)
        on_arms(len(got))
    for m, ids in cross_requests(plan, meas, getattr(measure, "valid", None), getattr(opts, "pair_cross", True)).items():
        got = measure(plan.signature, m, ids, point_alpha(plan, m))
        meas.extend(got)
        on_arms(len(got))
    return finish_signature(plan, meas, opts, rule or getattr(measure, "rule", None)), meas


def point_alpha(plan: buildplan.SignaturePlan, m: int) -> float:
    return next(p.eager_share for p in plan.points if p.m == m)


def first_requests(plan: buildplan.SignaturePlan) -> list[tuple[int, tuple[str, ...], float, bool]]:
    """(M, config ids, alpha, decides) per point: the plan's arms at each point. decides: the
    point is its signature's only one (see Measurer.__call__)."""
    alone = len(plan.points) == 1
    return [(p.m, tuple(plan.arms[p.m]), p.eager_share, alone) for p in plan.points]


def cross_requests(plan: buildplan.SignaturePlan, meas: Sequence[Measurement],
                   valid: Callable[[Signature, int, str], bool] | None = None,
                   pair: bool = True) -> dict[int, list[str]]:
    """M -> config ids: every point's top configs measured at the other points (sorted by M),
    minus pairs already measured and pairs the validity predicate refuses; with `pair`
    (BuildOptions.pair_cross), a point with any also times its fallback again, last, so the
    cross arms pair with it (objective_table)."""
    alpha = {p.m: p.eager_share for p in plan.points}
    ranked = {p.m: [cid for _, cid in sorted((x.objective(alpha[p.m]), x.config_id)
                                            for x in meas if x.m == p.m and x.status.ok)]
              for p in plan.points}
    extra: dict[int, list[str]] = {}
    for m, cid in partition.cross_eval_plan(plan.points, ranked, buildplan.CROSS_TOP,
                                            [(x.m, x.config_id) for x in meas]):
        if valid is None or valid(plan.signature, m, cid):
            extra.setdefault(m, []).append(cid)
    fallback = pick_rule(families.get(plan.signature.family)).fallback
    if pair and fallback in plan.forced:
        for ids in extra.values():
            ids.append(fallback)
    return dict(sorted(extra.items()))


def finish_signature(plan: buildplan.SignaturePlan, meas: Sequence[Measurement], opts: Any,
                     rule: PickRule | None = None) -> Entry:
    """The signature's Entry from all its measurements: the partition under `rule` (default:
    the family's with --min-speedup), regions and the evidence they rest on."""
    if rule is None:
        rule = pick_rule(families.get(plan.signature.family), opts.min_speedup, getattr(opts, "gate_noise", None),
                         getattr(opts, "tie_band", None))
    alpha = {p.m: p.eager_share for p in plan.points}
    table = partition.objective_table(meas, alpha, reference=rule.fallback)
    part = partition.partition(plan.points, table, rule, catch_all=True)
    keep = set(part.chosen) | {r.config_id for r in part.regions + (part.regions_native or ())} | set(plan.forced)
    source = "simulated" if opts.simulate else "build"
    gpu = partition.objective_table(meas, 0.0, reference=rule.fallback)
    at = partition.paired_points(meas, rule.fallback)
    paired = {k: v for k, v in gpu.items() if k[0] in at}
    return Entry(plan.signature, part.regions, evidence(meas, keep, paired), source, {}, part.notes, part.regions_native)


def evidence(meas: Sequence[Measurement], keep: set[str],
             paired: Mapping[tuple[int, str], float] | None = None) -> dict[str, Any]:
    """Per M: {config: [median, sigma, n] or its failure status, '_l2': ...}, for `keep` and each
    point's best; the full record is the measurement log. `paired` (partition.objective_table at
    alpha 0 with the fallback as reference) adds what the partition compared at a point where it
    paired: '_stat': 'paired' and '_stat:<arm>' ms per arm (runtime.serving.point_times reads
    them), since a raw median of another protocol call is not on the same footing."""
    out: dict[str, dict[str, Any]] = {}
    best: dict[int, tuple[float, str]] = {}
    for x in meas:
        if x.status.ok and (x.m not in best or (x.median_ms, x.config_id) < best[x.m]):
            best[x.m] = (x.median_ms, x.config_id)
    for x in meas:
        if x.config_id not in keep and best.get(x.m, (0, ""))[1] != x.config_id:
            continue
        row = out.setdefault(f"M={x.m}", {})
        row[x.config_id] = ([round(x.median_ms, 6), round(x.sigma_ms or 0.0, 6), x.n] if x.status.ok
                            else x.status.value)
        row["_l2"] = x.l2
        if paired is not None and x.status.ok and (x.m, x.config_id) in paired:
            row[f"_stat:{x.config_id}"] = round(paired[(x.m, x.config_id)], 6)
    for key, row in out.items():
        arms = [a for a, v in row.items() if not a.startswith("_") and isinstance(v, list)]
        if arms and all(f"_stat:{a}" in row for a in arms):
            row["_stat"] = "paired"
        else:  # never one of each (point_times): a point with an unpaired-only arm keeps medians
            for a in arms:
                row.pop(f"_stat:{a}", None)
    return out
