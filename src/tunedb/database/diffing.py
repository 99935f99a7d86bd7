"""Comparing two database files entry by entry: what `tunedb diff` prints.

Compared: the file header (kernel/arch family, validators, the cost model), entries added and
removed, and per entry its regions, the definitions of the configs its regions name, its own
validators and its source. Evidence is compared through what it serves: a region's config serves
only near the sizes its evidence measured (runtime/serving.unsupported), so two entries with the
same regions but other evidence can serve other configs; where they do (at the sizes either side
measured, each one octave off, and at region bounds) that is a `served` change. Notes are not
compared. A refitted cost model (present in both files) is a measurement
too: its line says which of its fields moved, and it does not count as a difference
(`Change.counted` is False; `tunedb diff` exits 0 when nothing else differs).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tunedb.database import validators as vals
from tunedb.database.schema import DatabaseFile
from tunedb.records import SENTINELS, Entry


@dataclass(frozen=True)
class Change:
    """One difference. kind: added, removed, changed; subject: a signature, 'file' or a config."""

    kind: str
    subject: str
    what: str = ""
    a: Any = None
    b: Any = None
    counted: bool = True  # False: reported, but the files still agree (a refitted model)

    def line(self) -> str:
        if not self.counted:
            return f"  {self.subject}: {self.what} (a refit from measurements; not counted as a difference)"
        if self.kind == "added":
            return f"+ {self.subject}: {_short(self.b)}"
        if self.kind == "removed":
            return f"- {self.subject}: {_short(self.a)}"
        return f"~ {self.subject}: {self.what} {_short(self.a)} -> {_short(self.b)}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "what": self.what, "a": self.a, "b": self.b,
                "counted": self.counted}


def model_delta(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Which fields of a fitted cost model moved, e.g. 'model refit: scale 1.39 -> 1.41;
    per_config: 12 changed, 3 added (133 -> 136); fitted_on 3732 -> 4100'."""
    parts = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            changed = sum(1 for k in set(va) & set(vb) if va[k] != vb[k])
            added, removed = len(set(vb) - set(va)), len(set(va) - set(vb))
            counts = [f"{n} {w}" for n, w in ((changed, "changed"), (added, "added"), (removed, "removed")) if n]
            parts.append(f"{key}: {', '.join(counts)} ({len(va)} -> {len(vb)})")
        elif isinstance(va, (int, float)) and isinstance(vb, (int, float)):
            parts.append(f"{key} {va:.6g} -> {vb:.6g}")
        else:
            parts.append(f"{key} {_short(va)} -> {_short(vb)}")
    return "model refit: " + "; ".join(parts)


def _short(value: Any, width: int = 120) -> str:
    text = json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value
    return text if len(text) <= width else f"{text[:width - 20]}... ({len(text)} chars)"


def model_problem(kernel_family: str, model: Any) -> str | None:
    """Why the family's run time would skip this cost-model object (its `model_problem` hook), or None."""
    from tunedb import families
    from tunedb.families.contract import hook

    if kernel_family not in families.names():  # a family not registered here: nothing to ask
        return None
    return hook(families.get(kernel_family), "model_problem")(model)


def _served_changes(kernel_family: str, ea: Entry, eb: Entry) -> list[tuple[int, str, str]]:
    """(M, config a serves, config b serves) where two entries of the same regions serve apart, at
    powers of two, the sizes their evidence measured, an octave either side of each, and the
    region bounds (nothing when the family is not registered here: its serving rule is unknown)."""
    from tunedb import families
    from tunedb.runtime.serving import entry_serves

    if kernel_family not in families.names():
        return []
    fam = families.get(kernel_family)
    sizes: set[int] = {1 << i for i in range(18)}  # powers of two to 128k: an entry without evidence serves everywhere
    for entry in (ea, eb):
        for key in entry.evidence:
            if key.startswith("M=") and key[2:].isdigit():
                m = int(key[2:])
                sizes |= {m, 2 * m, max(1, m // 2)}
        for region in entry.regions:
            if region.m_hi is not None:
                sizes |= {region.m_hi, region.m_hi + 1}
    return [(m, x, y) for m in sorted(sizes) if (x := entry_serves(fam, ea, m)) != (y := entry_serves(fam, eb, m))]


def _regions(entry: Entry) -> list[list[Any]]:
    return [r.to_json() for r in entry.regions]


def _config_defs(db: DatabaseFile, entry: Entry) -> dict[str, Any]:
    return {cid: db.configs[cid].to_json() for cid in entry.config_ids()
            if cid not in SENTINELS and cid in db.configs}


def _plain(v: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(x) if isinstance(x, tuple) else x) for k, x in sorted(v.items())}


def diff(a: DatabaseFile, b: DatabaseFile) -> tuple[Change, ...]:
    """Every difference from `a` to `b`, file header first, then entries by signature."""
    out: list[Change] = []
    for what in ("kernel_family", "arch_family", "schema"):
        if getattr(a, what) != getattr(b, what):
            out.append(Change("changed", "file", what, getattr(a, what), getattr(b, what)))
    if a.kernel_family != b.kernel_family:  # tables of two families share no entry, model or validator
        return tuple(out)
    if dict(a.validators) != dict(b.validators):
        out.append(Change("changed", "file", "validators", _plain(dict(a.validators)),
                          _plain(dict(b.validators))))
    if a.model and b.model and a.model != b.model:
        problems = [model_problem(a.kernel_family, m) for m in (a.model, b.model)]
        if any(problems):  # not a refit: one side's model would be skipped at run time (counted)
            out.append(Change("changed", "file", "model", f"unusable: {problems[0]}" if problems[0] else "usable",
                              f"unusable: {problems[1]}" if problems[1] else "usable"))
        else:
            out.append(Change("changed", "file", model_delta(a.model, b.model), counted=False))
    elif a.model != b.model:
        out.append(Change("changed", "file", "model", "present" if a.model else "absent",
                          "present" if b.model else "absent"))
    keys = sorted(set(a.entries) | set(b.entries), key=lambda s: s.format())
    for sig in keys:
        name = sig.format()
        ea, eb = a.entries.get(sig), b.entries.get(sig)
        if ea is None:
            out.append(Change("added", name, "regions", None, _regions(eb)))
            continue
        if eb is None:
            out.append(Change("removed", name, "regions", _regions(ea), None))
            continue
        if _regions(ea) != _regions(eb):
            out.append(Change("changed", name, "regions", _regions(ea), _regions(eb)))
        elif ea.evidence != eb.evidence:
            served = _served_changes(a.kernel_family, ea, eb)
            if served:
                out.append(Change("changed", name, "served", {f"M={m}": x for m, x, _ in served},
                                  {f"M={m}": y for m, _, y in served}))
        ca, cb = _config_defs(a, ea), _config_defs(b, eb)
        for cid in sorted(set(ca) & set(cb)):
            if ca[cid] != cb[cid]:
                out.append(Change("changed", name, f"config {cid}", ca[cid], cb[cid]))
        va = _plain(vals.effective(a.validators, ea.soft))
        vb = _plain(vals.effective(b.validators, eb.soft))
        if va != vb:
            keys_changed = sorted(k for k in set(va) | set(vb) if va.get(k) != vb.get(k))
            out.append(Change("changed", name, "validators",
                              {k: va.get(k) for k in keys_changed}, {k: vb.get(k) for k in keys_changed}))
        if ea.source != eb.source:
            out.append(Change("changed", name, "source", ea.source, eb.source))
    return tuple(out)
