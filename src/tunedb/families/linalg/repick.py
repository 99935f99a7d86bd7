"""A measured linalg table re-decided under the current pick rule, without measuring.

Each point of a `--pick low` table keeps the statistic its tune compared (`_stat:<arm>`, ms a
call: the median over blocks of each block's lower quartile). A rule change (the tie band, the
optional tier's own band, the margin) then moves exactly the cells it should, from the same
measurements, and the moves are reviewable before anything is written (`tunedb linalg repick
--dry-run`). What this cannot redo: the tune measured more blocks where the rule *of its time*
saw an edge, so a cell near an edge of the new rule was measured no more than the old one asked.
Points without the statistic (tables tuned before session 17's `--pick low`) keep their winners.
Pure Python: no torch, no GPU.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from tunedb.families.linalg import configs, pick, table
from tunedb.records import SENTINELS, Entry

STAT_PREFIX = "_stat:"


def point_pick(point: Mapping[str, Any], batch: int, rule: Any = pick.LINALG_RULE,
               jitter_ns: float = pick.LAUNCH_JITTER_NS) -> pick.CellPick | None:
    """The pick of one evidence point under `rule` from its recorded statistic (what
    pick.decide_low decides on those numbers), or None where the point has none."""
    stat = {k[len(STAT_PREFIX):]: float(v) for k, v in point.items()
            if k.startswith(STAT_PREFIX) and isinstance(v, (int, float)) and v > 0}
    stat.pop(configs.EAGER_ONLY, None)  # timed eagerly, never served
    if not stat or batch < 1:
        return None
    times = {a: ms * 1e6 / batch for a, ms in stat.items()}  # ns a problem, as the tune compares
    return pick.decide_times(times, batch, rule, jitter_ns)


def repick_entry(entry: Entry, rule: Any = pick.LINALG_RULE,
                 jitter_ns: float = pick.LAUNCH_JITTER_NS) -> Entry:
    """The entry with every point that carries the statistic re-decided, regions rebuilt."""
    full: list[tuple[int, str]] = []
    native: list[tuple[int, str]] = []
    evidence = dict(entry.evidence)
    for key, point in sorted(entry.evidence.items(), key=lambda kv: int(kv[0][2:])):
        batch = int(key[2:])
        got = point_pick(point, batch, rule, jitter_ns) if isinstance(point, Mapping) else None
        if got is None:
            full.append((batch, entry.lookup(batch)))
            native.append((batch, entry.lookup(batch, native=True)))
            continue
        full.append((batch, got.winner))
        native.append((batch, got.native))
        fresh = {k: v for k, v in point.items() if k != "_native"}
        if got.native != got.winner:
            fresh["_native"] = got.native
        if got.winner != entry.lookup(batch):  # the point's winner fields describe the new winner
            med = point.get(got.winner)
            fresh["_ns_per_problem"] = round(med[0] * 1e6 / batch, 3) if isinstance(med, list) else None
            fresh["_residual"] = None  # the tune kept the gate's ratio for its own winner only (it passed)
        evidence[key] = fresh
    if not full:
        return entry
    regions, regions_native = table.regions(full), table.regions(native)
    return replace(entry, regions=regions, evidence=evidence, notes=table.notes(evidence),
                   regions_native=None if regions_native == regions else regions_native)


def repick(db: Any, rule: Any = pick.LINALG_RULE, jitter_ns: float = pick.LAUNCH_JITTER_NS,
           when: str = "") -> Any:
    """The DatabaseFile re-decided under `rule`: entries re-picked, config definitions for the
    ids now named, and the record of the rule it was re-decided under (model["repick"])."""
    entries = {sig: repick_entry(e, rule, jitter_ns) for sig, e in db.entries.items()}
    named = {r.config_id for e in entries.values() for r in (*e.regions, *(e.regions_native or ()))}
    ids = sorted(named - set(SENTINELS))
    model = dict(db.model or {})
    model["repick"] = {"utc": when, "tie_band": rule.tie_band, "dep_margin": rule.dep_margin,
                       "dep_tie_band": rule.dep_band(), "launch_jitter_ns": jitter_ns,
                       "from": "each point's recorded statistic (_stat:<arm>); no measurement"}
    return replace(db, entries=entries, configs=table.config_defs(ids), model=model)
