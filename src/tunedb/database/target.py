"""Checking a build's target file before anything is measured.

A build writes its file at the end, after minutes of measuring on a GPU; a target that cannot
be written or merged into must stop it at the start instead. `check_target` asks what the
final write will need: the directory can be created and written, the path is not a directory,
and an existing file is readable and mergeable (parses, same kernel and arch family, not
corrupt), unless `fresh` replaces it.
"""
from __future__ import annotations

import os
from pathlib import Path

from tunedb.database import schema
from tunedb.database.store import lock_path
from tunedb.errors import CorruptDatabaseError, DatabaseError, ValidatorMismatchError

NOTHING_MEASURED = "nothing was measured"


def check_target(path: Path, kernel_family: str, arch_family: str, *, fresh: bool = False,
                 write: bool = True) -> None:
    """DatabaseError naming the problem when the build's final write to `path` would fail.
    write=False (--no-write): only the existing file must be readable and mergeable."""
    path = Path(path)
    if path.is_dir():
        raise DatabaseError(f"target {path} is a directory; a database target is a file "
                            f"(--out DIR writes DIR/<arch>/<family>.json); {NOTHING_MEASURED}")
    if write:
        _check_writable(path)
    if os.path.lexists(path) and _is_census(path):  # --fresh would replace the build's own input, perhaps
        raise DatabaseError(f"target {path} holds a census (`tunedb census` output), not a tuning database; "
                            f"--out another file ({NOTHING_MEASURED})")
    if fresh or not os.path.lexists(path):  # a dangling link or a link loop is not "no file"
        return
    try:
        schema.load(path, kernel_family, arch_family)
    except (CorruptDatabaseError, ValidatorMismatchError) as exc:
        raise type(exc)(f"{exc}; a build cannot merge into it ({NOTHING_MEASURED}): pass --fresh to "
                        f"replace it, or --out another place") from None
    except OSError as exc:
        raise DatabaseError(f"target {path} is unreadable: {exc.strerror or exc}; {NOTHING_MEASURED}") from None


def unwritable(path: Path) -> str | None:
    """Why a whole-file write of `path` (under its lock, atomically) would fail, or None. A new
    file is made and removed in the nearest directory that exists (what the writer's directories,
    lock file and temporary file need), so a refused command leaves no directory or lock behind
    (session 53: a refused build left <family>.json.lock in a new tree)."""
    import tempfile

    base = next((p for p in (path.parent, *path.parent.parents) if os.path.lexists(p)), None)
    if base is None or not base.is_dir():
        return f"{base or path.parent}: not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".tunedb-writable-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{base}: {exc.strerror or exc}"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base}: permission denied (a new file cannot be made there)"
    for f in (path, lock_path(path)):
        if f.exists() and not os.access(f, os.W_OK):
            return f"{f}: permission denied"
    return None


def _check_writable(path: Path) -> None:
    why = unwritable(path)
    if why is not None:
        raise DatabaseError(f"cannot write the target {path}: {why}; choose a writable place (--out DIR, or "
                            f"TUNEDB_USER_DB=DIR for the user tier); {NOTHING_MEASURED}")


def _is_census(path: Path) -> bool:
    """Whether `path` holds a census file (its "schema" and "points", no "kernel_family"); read as a
    table is (schema.read_raw: a regular file under the size cap), anything unreadable is not one."""
    try:
        data = schema.read_raw(path)
    except (DatabaseError, OSError, RecursionError, ValueError):
        return False
    return isinstance(data, dict) and "points" in data and "schema" in data and "kernel_family" not in data
