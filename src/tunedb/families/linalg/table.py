"""The linalg table (`db/<arch>/linalg.json`) from ladder results: regions, evidence, provenance.

One entry per signature (op, dtype, n); its regions run over the batch, each measured batch's
winner serving every batch up to it (rounding up) and the largest measured batch's winner
serving the rest. `regions_native` keeps the winners without optional dependencies where the
entry format has it (it is written only when it differs; absent means the same as `regions`).
Evidence per measured batch: every arm's [median_ms, sigma_ms, rounds] or failure status, and
the winner's ns per problem and gate residual (over torch's), and for a failed arm the reason
the timer gave (`_error:<arm>`; the entry's notes repeat them, one line per failed arm). A pick that
compared another statistic than the median (`--pick low`: lower quartiles) names it (`_stat`) and
keeps it per arm (`_stat:<arm>`, ms a call like the median), so serving (runtime/serving.point_times)
compares what the pick compared; a point without `_stat` was decided on medians. The file's `model` object carries
the retune's record (the format has no other free-form top-level field): provenance (UTC start,
commit, dirty digest, GPU, versions), the pick rule's margins, the legs and per-leg correctness
fingerprints (a digest of every arm's gate outcome per cell). A new table keeps the entries of
the legs not measured this time (and of a leg a foreign process invalidated) from the old one.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

from tunedb.errors import BuildError
from tunedb.families.linalg import configs, pick, signatures
from tunedb.families.linalg.ladder import CellResult, LegReport
from tunedb.records import Entry, Region, Signature

SOURCE = "linalg-tune"
ERROR_KEY = "_error:"  # evidence key prefix: a failed arm's reason


def notes(evidence: Mapping[str, Mapping[str, Any]]) -> tuple[str, ...]:
    """'M=<batch> <arm> <status>: <why>' for every failed arm with a reason, batch by batch."""
    out = []
    for key in sorted(evidence, key=lambda k: int(k[2:])):
        point = evidence[key]
        for name in sorted(point):
            if name.startswith(ERROR_KEY):
                arm = name[len(ERROR_KEY):]
                out.append(f"{key} {arm} {point.get(arm)}: {point[name]}")
    return tuple(out)


def point_key(batch: int) -> str:
    """The evidence key of a measured batch (the format names size-axis points M=)."""
    return f"M={batch}"


def regions(winners: Sequence[tuple[int, str]]) -> tuple[Region, ...]:
    """[(batch, winner)] sorted by batch -> regions rounding up, the last winner as catch-all."""
    out: list[Region] = []
    for i, (batch, winner) in enumerate(winners):
        if i + 1 < len(winners) and winners[i + 1][1] == winner:
            continue  # the next region up serves this batch too
        out.append(Region(batch if i + 1 < len(winners) else None, winner))
    return tuple(out)


def _sigma(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = ordered[len(ordered) // 2]
    dev = sorted(abs(v - mid) for v in ordered)
    return 1.4826 * dev[len(dev) // 2]


def _evidence(result: CellResult, policy: str) -> dict[str, Any]:
    batch = result.cell.batch
    point: dict[str, Any] = {}
    for arm, status in sorted(result.statuses.items()):
        values = result.samples.get(arm)
        if status != "ok" or not values:
            point[arm] = status if status != "ok" else "launch_error"
            if arm in result.errors:
                point[ERROR_KEY + arm] = result.errors[arm]
            continue
        med = result.median(arm)
        point[arm] = [round(med * batch / 1e6, 6), round(_sigma(values) * batch / 1e6, 6), len(values)]
    if result.pick.stat != "median":  # what the pick compared, beside the medians (serving.point_times)
        from tunedb.runtime import serving

        point[serving.STAT] = result.pick.stat
        for arm, t in sorted(result.pick.times.items()):
            if isinstance(point.get(arm), list):
                point[serving.STAT_KEY + arm] = round(t * batch / 1e6, 6)
    winner = result.pick.winner
    med = result.median(winner)
    point["_ns_per_problem"] = None if med is None else round(med, 3)
    point["_residual"] = result.residuals.get(winner)
    point["_inputs"] = policy
    if result.pick.native != winner:
        point["_native"] = result.pick.native
    return point


def fingerprint(results: Sequence[CellResult]) -> str:
    """A digest of every arm's gate outcome per cell: equal for two runs whose gates agree."""
    h = hashlib.sha256()
    for result in sorted(results, key=lambda r: r.cell):
        for arm, status in sorted(result.statuses.items()):
            h.update(f"{result.cell}|{arm}|{status}\n".encode())
    return h.hexdigest()[:16]


def old_cells(entry: Entry | None) -> dict[int, tuple[str, str, Any]]:
    """batch -> (winner, native winner, evidence point) of every cell an old entry measured."""
    if entry is None:
        return {}
    out = {}
    for key, point in entry.evidence.items():
        batch = int(key[2:])
        winner, native = entry.lookup(batch), entry.lookup(batch, native=True)
        if winner is not None:
            out[batch] = (winner, native or winner, point)
    return out


def entries(results: Sequence[CellResult], soft: Mapping[str, str],
            old: Mapping[Signature, Entry] | None = None) -> dict[Signature, Entry]:
    """One entry per signature measured now: its cells measured now, over the cells of the old
    entry (`old`) at batches not measured now, regions regenerated from all of them."""
    by_sig: dict[Signature, list[CellResult]] = {}
    for result in results:
        by_sig.setdefault(result.cell.signature, []).append(result)
    out = {}
    for sig, group in by_sig.items():
        policy = "ring" if sig.op in signatures.SOLVER_OPS else "rotate"
        cells = old_cells((old or {}).get(sig))
        for r in group:
            cells[r.cell.batch] = (r.pick.winner, r.pick.native, _evidence(r, policy))
        batches = sorted(cells)
        full = regions([(b, cells[b][0]) for b in batches])
        native = regions([(b, cells[b][1]) for b in batches])
        evidence = {point_key(b): cells[b][2] for b in batches}
        fields: dict[str, Any] = {}
        if native != full:
            if "regions_native" not in Entry.__dataclass_fields__:
                raise BuildError(f"{sig}: the native winners differ from the full ones, and this tunedb's "
                                 f"entry format has no regions_native to keep them in")
            fields["regions_native"] = native
        out[sig] = Entry(sig, full, evidence, SOURCE, dict(soft), notes(evidence), **fields)
    return out


def build(reports: Sequence[LegReport], old: Any, *, arch_family: str, file_validators: Mapping[str, str],
          provenance: Mapping[str, Any], rule: Any, legs: Sequence[str], quick: bool,
          decide: str = "median", max_rounds: int | None = None, jitter_ns: float | None = None) -> Any:
    """The new DatabaseFile: this run's valid legs' cells over the old file's (a cell not measured
    now keeps its old decision and evidence)."""
    from tunedb.database.schema import DatabaseFile

    measured = [r for rep in reports if not rep.invalid for r in rep.results]
    new = entries(measured, {}, old.entries if old is not None else None)
    kept = {sig: e for sig, e in (old.entries.items() if old is not None else ()) if sig not in new}
    merged = {**kept, **new}
    ids = sorted({cid for e in merged.values() for cid in _ids(e)} - {"torch", "default", "heuristic"})
    defs = config_defs(ids)
    legs_record = {rep.leg: ({"invalid": rep.invalid} if rep.invalid else
                             {"cells": len(rep.results), "fingerprint": fingerprint(rep.results),
                              **({"contended_by": rep.contended} if rep.contended else {})})
                   for rep in reports}
    old_tune = ((old.model or {}).get("tune") or {}) if old is not None else {}
    record = {
        "provenance": dict(provenance),
        "rule": {"tie_band": rule.tie_band, "dep_margin": rule.dep_margin, "dep_tie_band": rule.dep_band(),
                 "fallback": rule.fallback,
                 "simplicity": "torch < thread < warp < block < lane", "rounds_min": 9, "decide": decide,
                 **({"rounds_max": max_rounds} if max_rounds else {}),
                 **({"launch_jitter_ns": jitter_ns, "statistic": "lower quartile",
                     "blocks": "median over blocks of rounds_min rounds, each a fresh capture",
                     "edge_sigma_ns": pick.CAPTURE_SIGMA_NS, "edge_sigma_rel": pick.CAPTURE_SIGMA_REL}
                    if decide == "low" else {})},
        "quick": quick,
        "legs": {**(old_tune.get("legs") or {}), **legs_record},
        "absent_dependencies": {name: "not installed: no arm measured" for name in configs.DEPENDENCIES.values()},
    }
    return DatabaseFile(signatures.FAMILY, arch_family, dict(file_validators), defs, merged, {"tune": record})


def _ids(entry: Entry) -> set[str]:
    native = getattr(entry, "regions_native", None) or ()
    return {r.config_id for r in (*entry.regions, *native)}


def config_defs(ids: Sequence[str]) -> dict[str, Any]:
    """Config definitions for the file's `configs` object."""
    return {cid: configs.parse(cid) for cid in ids}


def table_changes(old: Any, new: Any) -> list[str]:
    """Lines describing what changed in the decisions (regions, configs), not the evidence nor
    the retune's record."""
    from tunedb.database import diffing

    if old is None:
        return [f"+ {sig}: {[r.to_json() for r in e.regions]}" for sig, e in sorted(new.entries.items())]
    return [c.line() for c in diffing.diff(old, new)
            if not (c.subject == "file" and c.what in ("model", "validators"))
            and c.what != "validators"]


def moved_cells(old: Any, new: Any, tie_band: float) -> list[str]:
    """Each measured cell whose winner changed from `old` to `new`, with how much slower the old
    winner measured this time (new evidence): a move inside the tie band is noise the rule could
    not absorb (an arm at the band's edge), one beyond it is a real change."""
    from tunedb.runtime import serving

    if old is None:
        return []
    lines = []
    for sig, entry in sorted(new.entries.items()):
        before = old.entries.get(sig)
        if before is None:
            continue
        for key, point in sorted(entry.evidence.items(), key=lambda kv: int(kv[0][2:])):
            batch = int(key[2:])
            was, now = before.lookup(batch), entry.lookup(batch)
            if was is None or was == now:
                continue
            got = serving.point_times(point, was, now)
            if got is not None and got[1] > 0:
                slower = got[0] / got[1] - 1.0
                where = "inside" if slower <= tie_band else "beyond"
                how = f"the old winner {slower:+.1%} now: {where} the {tie_band:.0%} band"
            else:
                how = f"the old winner measured {point.get(was)!r} now"
            lines.append(f"{sig} batch={batch}: {was} -> {now} ({how})")
    return lines
