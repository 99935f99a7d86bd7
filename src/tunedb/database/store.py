"""Writing database files: a locked merge-on-write, and the atomic replace under it.

Every writer (the build, autotune()'s flush, prewarm) calls `write_entries`. It takes the
file's lock (a sibling `<file>.lock`), re-reads the file, applies only this writer's entries
and the configs they name, stamps the file with the writer's validators (entries it did not
measure keep theirs in `soft`), and replaces the file atomically. The lock is held for the
merge and the write only. A corrupt or mismatched file is never merged into: only
`fresh=True` replaces it.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from tunedb.database import schema, tiers, validators as vals
from tunedb.database.schema import DatabaseFile
from tunedb.errors import CorruptDatabaseError, DatabaseError, ValidatorMismatchError
from tunedb.records import SENTINELS, Config, Entry, Region

LOCK_TIMEOUT_S = 120.0


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def target_path(target: str | os.PathLike, arch_family: str, kernel_family: str) -> Path:
    """'user' or 'system' -> that tier's file for (arch, family); anything else is a file path."""
    if isinstance(target, str) and target in tiers.TIERS:
        path = tiers.file_path(target, arch_family, kernel_family)
        if path is None:
            raise DatabaseError("the user tier is disabled (TUNEDB_USER_DB=off); "
                                "set TUNEDB_USER_DB to a directory or write to a path")
        return path
    return Path(target)


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace `path` with `text` (str: UTF-8; bytes as they are): a temp file in the same
    directory, fsync, os.replace. A symlink is followed (the file it names is replaced, the link
    stays); a target that is not a regular file (/dev/null, a FIFO) is written through, never
    replaced by a file; an existing file keeps its mode (a new one gets 0644)."""
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        try:
            with open(path, "wb" if isinstance(text, bytes) else "w", **({} if isinstance(text, bytes) else {"encoding": "utf-8"})) as out:
                out.write(text)  # a device or a pipe: what it does with the bytes is its own
        except OSError as exc:  # /dev/full's "No space left on device" named no file
            raise _named(exc, path) from None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:  # named as the file asked for, not the temp file beside it
        raise _named(exc, path) from None
    try:
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8")) as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename == tmp:
            raise _named(exc, path) from None
        raise


def _named(exc: OSError, path: Path) -> OSError:
    """`exc` about the temp file of a write to `path`, as an error about `path` itself."""
    return type(exc)(exc.errno, exc.strerror, str(path)) if exc.errno is not None else exc


def _merge_regions(old: tuple[Region, ...], new: tuple[Region, ...]) -> tuple[Region, ...]:
    # New regions win where they share an m_hi; a catch-all from either side stays last.
    by_hi: dict[int, str] = {r.m_hi: r.config_id for r in old if r.m_hi is not None}
    by_hi.update({r.m_hi: r.config_id for r in new if r.m_hi is not None})
    tail = [r for r in new if r.m_hi is None] or [r for r in old if r.m_hi is None]
    return tuple(Region(m, by_hi[m]) for m in sorted(by_hi)) + tuple(tail[:1])


def _extend_entry(old: Entry, new: Entry) -> Entry:
    evidence = dict(old.evidence)
    for point, arms in new.evidence.items():
        had = evidence.get(point)
        # per arm: an arm this writer did not re-measure at the point keeps its time (dropped, a
        # region the point supported for that arm lost its support: another config served)
        evidence[point] = {**had, **arms} if isinstance(had, Mapping) and isinstance(arms, Mapping) else arms
    notes = tuple(dict.fromkeys(old.notes + new.notes))
    native = None
    if old.regions_native is not None or new.regions_native is not None:
        native = _merge_regions(old.regions_native or old.regions, new.regions_native or new.regions)
    return Entry(new.signature, _merge_regions(old.regions, new.regions), evidence,
                 new.source, {}, notes, native)


def merge(existing: DatabaseFile | None, kernel_family: str, arch_family: str,
          entries: Iterable[Entry], configs: Mapping[str, Config], writer_validators: Mapping[str, str],
          model: Mapping[str, Any] | None = None, extend: bool = False) -> DatabaseFile:
    """Pure: `existing` with this writer's entries applied and the file re-stamped.

    extend=False: each entry replaces the old one (it was rebuilt: its validators are the
    writer's). extend=True: its regions and evidence join the old entry's, which then keeps
    the old validators as well (a mixed entry stays stale until rebuilt).
    """
    writer_validators = dict(writer_validators)
    old_file_vals = dict(existing.validators) if existing else {}
    own: dict[Any, Mapping[str, Any]] = {}  # signature -> the validators its points were measured under
    merged: dict[Any, Entry] = {}
    if existing is not None:
        for sig, entry in existing.entries.items():
            merged[sig] = entry
            own[sig] = vals.effective(old_file_vals, entry.soft)
    for entry in entries:
        if entry.signature.family != kernel_family:
            raise DatabaseError(f"entry {entry.signature} belongs to kernel family "
                                f"{entry.signature.family!r}, not {kernel_family!r}")
        old = merged.get(entry.signature)
        if extend and old is not None:
            merged[entry.signature] = _extend_entry(old, entry)
            own[entry.signature] = vals.mixed(own[entry.signature], writer_validators)
        else:
            merged[entry.signature] = replace(entry, evidence=dict(entry.evidence), soft={})
            own[entry.signature] = writer_validators
    for sig, entry in list(merged.items()):
        soft = vals.soft_field(own[sig], writer_validators)
        merged[sig] = replace(entry, soft=soft)
    all_configs = dict(existing.configs) if existing else {}
    all_configs.update(configs)
    needed = {cid for e in merged.values() for cid in e.config_ids()} - set(SENTINELS)
    evidenced = {arm for e in merged.values() for arms in e.evidence.values() if isinstance(arms, Mapping)
                 for arm in arms if not arm.startswith("_")}
    missing = sorted(needed - set(all_configs))
    if missing:
        raise DatabaseError(f"entries name configs {missing} that neither the writer nor the file "
                            f"defines; pass their Config objects")
    # Configs no region or evidence names any more are dropped, so the file stays reviewable.
    kept = {cid: c for cid, c in all_configs.items() if cid in needed or cid in evidenced}
    new_model = dict(model) if model is not None else (existing.model if existing else None)
    return DatabaseFile(kernel_family, arch_family, writer_validators, kept, merged, new_model)


def write_entries(target: str | os.PathLike, kernel_family: str, arch_family: str,
                  entries: Iterable[Entry], configs: Iterable[Config] | Mapping[str, Config] = (),
                  validators: Mapping[str, str] | None = None, *, model: Mapping[str, Any] | None = None,
                  fresh: bool = False, extend: bool = False) -> Path:
    """Merge `entries` into the (arch, family) file of `target` ('user', 'system' or a path).

    validators: the writer's soft validators (None: this process's, see validators.current).
    model: replaces the file's cost-model object (None keeps the old one).
    fresh: replace the whole file (the only way to overwrite a corrupt or mismatched one).
    extend: add regions/evidence to existing entries instead of replacing them (autotune).
    Returns the path written. The file takes effect in a process at its next epoch.
    """
    import filelock

    path = target_path(target, arch_family, kernel_family)
    if os.path.islink(path):  # one lock per file: a writer through the link and one through its target
        path = Path(os.path.realpath(path))
    entries = tuple(entries)
    given = dict(configs) if isinstance(configs, Mapping) else {c.id: c for c in configs}
    for cid, cfg in given.items():
        if cid != cfg.id:
            raise DatabaseError(f"config {cfg.id!r} is keyed under another id ({cid!r})")
    # Sentinels are never defined in a file; a writer may pass them along with the rest.
    config_map = {cid: cfg for cid, cfg in given.items() if not cfg.is_sentinel}
    for cfg in config_map.values():  # a file every later load would refuse is not written
        why = schema.contradicts_id(cfg, kernel_family)
        if why:
            raise DatabaseError(f"config {cfg.id!r} cannot be written to {path}: {why}")
    if validators is None:
        validators = vals.current(vals.impl_hash_of(kernel_family))
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_path(path)), timeout=LOCK_TIMEOUT_S)
    try:
        with lock:
            existing = None if fresh else _read_for_merge(path, kernel_family, arch_family)
            db = merge(existing, kernel_family, arch_family, entries, config_map, validators,
                       model, extend)
            text = _checked_text(db, path)
            write_atomic(path, text)
    except filelock.Timeout:
        raise DatabaseError(f"could not take the lock {lock_path(path)} within {LOCK_TIMEOUT_S:.0f} s; "
                            f"another writer holds it") from None
    return path


def _checked_text(db: DatabaseFile, path: Path) -> str:
    """The file's text, parsed back first: a writer's bad data never reaches the disk."""
    try:
        text = schema.dumps(db)
        schema.parse(schema.loads(text, str(path)), str(path))
    except (ValueError, CorruptDatabaseError) as exc:
        raise DatabaseError(f"refusing to write {path}: this writer's data would not be a valid "
                            f"file: {exc}") from None
    return text


def _read_for_merge(path: Path, kernel_family: str, arch_family: str) -> DatabaseFile | None:
    if not os.path.lexists(path):  # a dangling link or a link loop is there: read (and refused)
        return None
    try:
        return schema.load(path, kernel_family, arch_family)
    except CorruptDatabaseError as exc:
        raise CorruptDatabaseError(f"{exc}; refusing to merge into it (write with fresh=True / "
                                   f"--fresh to replace it)") from None
    except ValidatorMismatchError as exc:
        raise ValidatorMismatchError(f"{exc}; refusing to merge into it (write with fresh=True / "
                                     f"--fresh to replace it)") from None

