"""Comparing two database files entry by entry: what `tunedb diff` prints.

Compared: the file header (kernel/arch family, validators, the cost model), entries added and
removed, and per entry its regions, the definitions of the configs its regions name, its own
validators and its source. Evidence and notes are the measurements behind a choice, not the
choice, and are not compared.
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

    def line(self) -> str:
        if self.kind == "added":
            return f"+ {self.subject}: {_short(self.b)}"
        if self.kind == "removed":
            return f"- {self.subject}: {_short(self.a)}"
        return f"~ {self.subject}: {self.what} {_short(self.a)} -> {_short(self.b)}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "subject": self.subject, "what": self.what, "a": self.a, "b": self.b}


def _short(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value


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
    if dict(a.validators) != dict(b.validators):
        out.append(Change("changed", "file", "validators", _plain(dict(a.validators)),
                          _plain(dict(b.validators))))
    if a.model != b.model:
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
