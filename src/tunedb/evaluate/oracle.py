"""Regret against the measured oracle: measurement logs + database files + censuses ->
evaluate.Evaluation (`tunedb evaluate`, and `tunedb tune`'s report).

The contenders are the default config, the pick rule's fallback (torch for GEMM), the family's
cost model when it has one (the first file's calibrated model, else the uncalibrated structure)
and each file served as the runtime would serve it with that file as its only tier (the
serving walk and the model's candidates are runtime.serving's); census weights and eager
shares weight the points.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tunedb import database, families
from tunedb import evaluate as evaluation
from tunedb.errors import BuildError
from tunedb.families.contract import hook
from tunedb.records import ArchProfile, Point, ShapeSet, Signature, merge_point
from tunedb.runtime import serving, untuned


def census_weights(censuses: Sequence[ShapeSet]) -> tuple[dict[tuple[Signature, int], float], dict[tuple[Signature, int], float]]:
    """(weight, eager share) per (signature, M) over every census given; shares weighted by calls."""
    groups: dict[tuple[Signature, int], list[Point]] = {}
    for shapes in censuses:
        for p in shapes.points:
            groups.setdefault((p.signature, p.m), []).append(p)
    merged = {key: merge_point(group) for key, group in groups.items()}
    return {k: p.weight for k, p in merged.items()}, {k: p.eager_share for k, p in merged.items()}


def selectors(family: Any, arch: ArchProfile, dbs: Sequence[tuple[str, database.DatabaseFile]]
              ) -> tuple[dict[str, evaluation.Selector], evaluation.Equivalents]:
    """default, the fallback, the cost model (the first file's model, else the uncalibrated
    structure, ranking the compile set the runtime would have; absent without one) and each file
    (then model, then default: the runtime's chain with that file as its only tier)."""
    params = (dbs[0][1].model or None) if dbs else None
    model_obj = hook(family, "cost_model")(arch, params)
    referenced = sorted({c for _, db in dbs for c in db.referenced_config_ids()})
    compiled = tuple(c for c in family.compile_set(arch.arch_family, referenced) if not c.is_sentinel)
    cache: dict[tuple[Signature, int], str | None] = {}
    fallback = hook(family, "pick_rule")().fallback

    def model(sig: Signature, m: int) -> str | None:
        if (sig, m) not in cache:
            cands = serving.model_candidates(family, sig, compiled, arch)
            pick = model_obj.pick(sig, m, cands) if cands and model_obj is not None else None
            # no pick: the runtime's default tier (heuristic, else fallback, else default)
            cache[(sig, m)] = pick.id if pick is not None else untuned.answer(family, sig, arch, m, concrete=True).id
        return cache[(sig, m)]

    def from_file(db: database.DatabaseFile) -> evaluation.Selector:
        def select(sig: Signature, m: int) -> str | None:
            for _, _, cid in serving.walk(family, sig, m, ((None, db.entries),)):
                return cid
            return model(sig, m)
        return select

    def equivalents(sig: Signature, cid: str) -> tuple[str, ...]:
        concrete = family.default_config(sig, arch).id
        return (concrete,) if cid == "default" else ("default",) if cid == concrete else ()

    out: dict[str, evaluation.Selector] = {"default": lambda s, m: "default", fallback: lambda s, m: fallback}
    if model_obj is not None:
        out["cost model"] = model
    for name, db in dbs:
        out[name] = from_file(db)
    return out, equivalents


def evaluate_logs(logs: Sequence[str | Path], dbs: Sequence[tuple[str, str | Path]],
                  censuses: Sequence[ShapeSet] = (), arch_family: str | None = None,
                  family: str = families.DEFAULT) -> tuple[evaluation.Evaluation, dict[str, dict[str, Any]]]:
    """`tunedb evaluate`: the Evaluation, and each file's regions per signature (for the figure)."""
    from tunedb.measure.log import read_measurements

    names = [n for n, _ in dbs]
    fam = families.get(family)
    reserved = {"default", hook(fam, "pick_rule")().fallback, "cost model"}
    dupes = sorted({n for n in names if names.count(n) > 1} | (reserved & set(names)))
    if dupes:
        raise BuildError(f"--db names must be distinct and not {'/'.join(sorted(reserved))}; repeated or "
                         f"reserved: {', '.join(dupes)}")
    files = [(name, database.load(Path(path), family)) for name, path in dbs]
    arch_family = arch_family or (files[0][1].arch_family if files else "sm90")
    from tunedb import arch as arch_mod

    arch = arch_mod.shipped_profile(arch_family)
    meas = read_measurements(*logs)
    meas = [m for m in meas if m.signature.family == family]
    weights, alphas = census_weights(censuses) if censuses else (None, {})
    if weights is not None:  # census points the build thinned away count at the point serving them
        weights = evaluation.carry_weights(weights, ((m.signature, m.m) for m in meas))
    chosen, equivalents = selectors(fam, arch, files)
    ev = evaluation.evaluate(meas, chosen, weights=weights, alphas=alphas, equivalents=equivalents)
    sigs = {p.signature for p in ev.points}
    regions = {name: {s.format(): db.entries[s].regions for s in sorted(sigs) if s in db.entries}
               for name, db in files}
    return ev, regions
