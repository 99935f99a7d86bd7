"""The tuning database: one JSON file per (arch family, kernel family), in a user and a system tier.

Public API (importing it touches neither torch, the GPU nor the disk):

    load(path, kernel_family=None, arch_family=None) -> DatabaseFile   parse one file (strict)
    dumps(db) -> str                                                   its deterministic text
    write_entries(target, kernel_family, arch_family, entries, configs, validators=None,
                  *, model=None, fresh=False, extend=False) -> Path    locked merge-on-write
    merge(...) -> DatabaseFile                                         the pure merge under it
    lookup(arch_family, kernel_family) -> tuple[LoadResult, ...]       this epoch's usable files
    reload() -> int, epoch() -> int                                    database epochs
    diff(a, b) -> tuple[Change, ...]                                   `tunedb diff`
    report(arch_family=None) -> StatusReport                           `tunedb status`
    check_target(path, kernel_family, arch_family, *, fresh, write)    a build's target, before measuring
    current_validators(impl_hash=None) -> dict                         this process's soft validators

docs/database.md is the file-format reference.
"""
from __future__ import annotations

from tunedb.database.diffing import Change, diff
from tunedb.database.schema import (SCHEMA_VERSION, SOFT_VALIDATORS, DatabaseFile, dumps, load,
                                    parse, to_json)
from tunedb.database.target import check_target
from tunedb.database.status import FileStatus, StatusReport, TierStatus, report
from tunedb.database.store import lock_path, merge, target_path, write_atomic, write_entries
from tunedb.database.tiers import (TIERS, LoadResult, epoch, file_path, load_file, reload,
                                   system_root, system_root_override, user_root)
from tunedb.database.tiers import loaded as lookup
from tunedb.database.validators import current as current_validators
from tunedb.database.validators import stale_reasons

__all__ = [
    "SCHEMA_VERSION", "SOFT_VALIDATORS", "TIERS", "Change", "DatabaseFile", "FileStatus", "LoadResult",
    "StatusReport", "TierStatus", "check_target", "current_validators", "diff", "dumps", "epoch", "file_path", "load",
    "load_file", "lock_path", "lookup", "merge", "parse", "reload", "report", "stale_reasons",
    "system_root", "system_root_override", "target_path", "to_json", "user_root", "write_atomic",
    "write_entries",
]
