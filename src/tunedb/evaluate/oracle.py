"""Regret against the measured oracle: measurement logs + database files + censuses ->
evaluate.Evaluation (`tunedb evaluate`, and `tunedb tune`'s report).

The contenders are the default config, torch, the cost model (the first file's calibrated model,
else the uncalibrated structure) and each file served as the runtime would serve it with that
file as its only tier; census weights and eager shares weight the points.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tunedb import database, families

from tunedb.build import steps as buildsteps

from tunedb.families.gemm import costmodel
from tunedb import evaluate as evaluation
from tunedb.errors import BuildError
from tunedb.records import ArchProfile, Config, ShapeSet, Signature


def census_weights(censuses: Sequence[ShapeSet]) -> tuple[dict[tuple[Signature, int], float], dict[tuple[Signature, int], float]]:
    """(weight, eager share) per (signature, M) over every census given; shares weighted by calls."""
    weights: dict[tuple[Signature, int], float] = {}
    calls: dict[tuple[Signature, int], float] = {}
    eager: dict[tuple[Signature, int], float] = {}
    for shapes in censuses:
        for p in shapes.points:
            key = (p.signature, p.m)
            weights[key] = weights.get(key, 0.0) + p.weight
            calls[key] = calls.get(key, 0.0) + p.calls
            eager[key] = eager.get(key, 0.0) + p.eager_share * p.calls
    alphas = {k: min(1.0, eager[k] / calls[k]) if calls[k] else 0.0 for k in weights}
    return weights, alphas


def selectors(family: Any, arch: ArchProfile, dbs: Sequence[tuple[str, database.DatabaseFile]]
              ) -> tuple[dict[str, evaluation.Selector], evaluation.Equivalents]:
    """default, torch, the cost model (the first file's model, else the uncalibrated structure,
    ranking the compile set the runtime would have) and each file (then model, then default:
    the runtime's chain with that file as its only tier)."""
    params = buildsteps.model_params(dbs[0][1].model) if dbs else None
    default_of = buildsteps.default_of(family, arch)
    ranker = costmodel.make_ranker(arch, params, family.invalid_reason, default_of)
    referenced = sorted({c for _, db in dbs for c in db.referenced_config_ids()})
    compiled = tuple(c for c in family.compile_set(arch.arch_family, referenced) if not c.is_sentinel)
    cache: dict[tuple[Signature, int], str | None] = {}

    def model(sig: Signature, m: int) -> str | None:
        if (sig, m) not in cache:
            cands = tuple(c for c in compiled if family.invalid_reason(c, sig, None, arch) is None)
            if cands and "torch" in family.sentinels(sig):  # as the selector's model tier does
                cands += (Config.sentinel("torch"),)
            pick = ranker(sig, m, cands) if cands else None
            cache[(sig, m)] = pick.id if pick is not None else "default"
        return cache[(sig, m)]

    def from_file(db: database.DatabaseFile) -> evaluation.Selector:
        def select(sig: Signature, m: int) -> str | None:
            for key in family.serving_keys(sig) if hasattr(family, "serving_keys") else sig.lookup_keys():
                entry = db.entries.get(key)
                cid = entry.lookup(m) if entry is not None else None
                if cid is not None:
                    return cid
            return model(sig, m)
        return select

    def equivalents(sig: Signature, cid: str) -> tuple[str, ...]:
        concrete = family.default_config(sig, arch).id
        return (concrete,) if cid == "default" else ("default",) if cid == concrete else ()

    out: dict[str, evaluation.Selector] = {"default": lambda s, m: "default", "torch": lambda s, m: "torch",
                                           "cost model": model}
    for name, db in dbs:
        out[name] = from_file(db)
    return out, equivalents


def evaluate_logs(logs: Sequence[str | Path], dbs: Sequence[tuple[str, str | Path]],
                  censuses: Sequence[ShapeSet] = (), arch_family: str | None = None,
                  family: str = "gemm") -> tuple[evaluation.Evaluation, dict[str, dict[str, Any]]]:
    """`tunedb evaluate`: the Evaluation, and each file's regions per signature (for the figure)."""
    from tunedb.measure.log import read_measurements

    names = [n for n, _ in dbs]
    dupes = sorted({n for n in names if names.count(n) > 1} | ({"default", "torch", "cost model"} & set(names)))
    if dupes:
        raise BuildError(f"--db names must be distinct and not default/torch/cost model; repeated or "
                         f"reserved: {', '.join(dupes)}")
    fam = families.get(family)
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
