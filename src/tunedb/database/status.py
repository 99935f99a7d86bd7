"""The data behind `tunedb status`: per tier, which files load, which are skipped, which entries are stale.

Reads the files fresh (not through the epoch cache) and warns about nothing: a skipped file's
reason is part of the report. Rendering (rich table or JSON) is the command's job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from tunedb import settings
from tunedb.database import tiers, validators as vals


@dataclass(frozen=True)
class FileStatus:
    tier: str
    path: Path
    kernel_family: str
    arch_family: str
    state: str  # loaded, corrupt, mismatch, simulated
    problem: str = ""
    entries: int = 0
    stale: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (signature, reasons)
    validators: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "tier": self.tier, "path": str(self.path), "kernel_family": self.kernel_family,
            "arch_family": self.arch_family, "state": self.state, "problem": self.problem,
            "entries": self.entries, "validators": dict(self.validators),
            "stale": [{"signature": s, "reasons": list(r)} for s, r in self.stale],
        }


@dataclass(frozen=True)
class TierStatus:
    tier: str
    root: Path | None  # None: the tier is disabled
    files: tuple[FileStatus, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"tier": self.tier, "root": None if self.root is None else str(self.root),
                "enabled": self.root is not None, "files": [f.to_json() for f in self.files]}


@dataclass(frozen=True)
class StatusReport:
    arch_filter: str | None
    environment: Mapping[str, str]
    tiers: tuple[TierStatus, ...]
    settings: tuple[tuple[str, str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch_filter, "environment": dict(self.environment),
            "tiers": [t.to_json() for t in self.tiers],
            "settings": [{"name": n, "value": v, "doc": d} for n, v, d in self.settings],
        }



def file_status(tier: str, path: Path, arch_family: str, kernel_family: str,
                now: Mapping[str, str]) -> FileStatus:
    """One file's status against environment `now` (the soft validators to compare with)."""
    res = tiers.load_file(tier, path, kernel_family, arch_family)
    if res.db is None:
        return FileStatus(tier, path, kernel_family, arch_family, res.state, res.problem)
    db = res.db
    stale = []
    for sig in sorted(db.entries, key=lambda s: s.format()):
        reasons = vals.stale_reasons(vals.effective(db.validators, db.entries[sig].soft), now)
        if reasons:
            stale.append((sig.format(), reasons))
    return FileStatus(tier, path, kernel_family, arch_family, "loaded", "", len(db.entries),
                      tuple(stale), dict(db.validators))


def report(arch_family: str | None = None,
           environment: Callable[[str], Mapping[str, str]] | None = None) -> StatusReport:
    """Every tier's files (only `arch_family`'s when given). `environment(kernel_family)` gives
    the validators to compare with; by default this process's (validators.current)."""
    base_env = vals.current() if environment is None else None
    by_family: dict[str, Mapping[str, str]] = {}

    def env_for(kernel_family: str) -> Mapping[str, str]:
        if kernel_family not in by_family:
            if environment is not None:
                by_family[kernel_family] = environment(kernel_family)
            else:
                env = dict(base_env or {})
                impl = vals.impl_hash_of(kernel_family)
                if impl:
                    env["impl_hash"] = impl
                by_family[kernel_family] = env
        return by_family[kernel_family]

    out = []
    for tier in tiers.TIERS:
        base = tiers.root(tier)
        files = tuple(file_status(tier, path, arch, fam, env_for(fam))
                      for arch, fam, path in tiers.discover(tier, arch_family))
        out.append(TierStatus(tier, base, files))
    shown_env = dict(base_env) if base_env is not None else {}
    return StatusReport(arch_family, shown_env, tuple(out), tuple(settings.describe()))
