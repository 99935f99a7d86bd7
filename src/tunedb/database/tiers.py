"""Where the tiers' files live, and loading them once per epoch.

system: package data `tunedb/db/<arch>/<family>.json` (read through importlib.resources).
user:   `settings.user_db_dir()/<arch>/<family>.json` (TUNEDB_USER_DB moves it, `off` disables).
A file that is corrupt, fails a hard validator or holds simulated entries (`--simulate`: cost
model plus noise, never a measurement) is skipped with one DatabaseWarning per (file, reason) per
epoch; every other file still serves. `reload()` starts a new epoch: the
next lookup re-reads every file, so nothing else changes what a process selects.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tunedb import settings
from tunedb.database import schema
from tunedb.errors import CorruptDatabaseError, DatabaseError, DatabaseWarning, ValidatorMismatchError

TIERS: tuple[str, ...] = ("user", "system")  # precedence order
log = logging.getLogger("tunedb")
# a library's logger: records reach the handlers an application configures, and without any,
# logging's last-resort handler no longer prints each skip a second time beside its DatabaseWarning
log.addHandler(logging.NullHandler())


@dataclass(frozen=True)
class LoadResult:
    """One file's fate in one epoch. state: loaded, missing, corrupt, mismatch or simulated."""

    tier: str
    path: Path
    kernel_family: str
    arch_family: str
    state: str
    db: schema.DatabaseFile | None = None
    problem: str = ""

    @property
    def usable(self) -> bool:
        return self.db is not None


_lock = threading.RLock()
_epoch = 0
_cache: dict[tuple[str, str, str], LoadResult] = {}
_warned: set[tuple[str, str]] = set()
_system_root_override: Path | None = None
_reload_hooks: list[Callable[[], None]] = []


def system_root() -> Path:
    """The system tier's root directory (holding <arch>/<family>.json)."""
    if _system_root_override is not None:
        return _system_root_override
    from importlib import resources

    return Path(str(resources.files("tunedb").joinpath("db")))


def user_root() -> Path | None:
    return settings.user_db_dir()


def root(tier: str) -> Path | None:
    if tier == "user":
        return user_root()
    if tier == "system":
        return system_root()
    raise DatabaseError(f"unknown tier {tier!r}; tiers are {', '.join(TIERS)}")


def file_path(tier: str, arch_family: str, kernel_family: str) -> Path | None:
    """Where `tier` keeps (arch, family)'s file; None when the tier is disabled."""
    base = root(tier)
    return None if base is None else base / arch_family / f"{kernel_family}.json"


@contextlib.contextmanager
def system_root_override(path: Path | None) -> Iterator[None]:
    """Point the system tier elsewhere (tests, a checkout under review); starts new epochs."""
    global _system_root_override
    saved = _system_root_override
    _system_root_override = None if path is None else Path(path)
    reload()
    try:
        yield
    finally:
        _system_root_override = saved
        reload()


def epoch() -> int:
    return _epoch


def on_reload(hook: Callable[[], None]) -> None:
    """Call `hook` at every new epoch (the selector drops its memo there)."""
    if hook not in _reload_hooks:
        _reload_hooks.append(hook)


def reload() -> int:
    """Start a new epoch: forget every loaded file and every warning already given."""
    global _epoch
    with _lock:
        _epoch += 1
        _cache.clear()
        _warned.clear()
        epoch = _epoch
    # Hooks run outside the lock: the selector's hook takes the selector's lock, and a thread
    # resolving a new shape holds that one while it reads files under this one.
    for hook in list(_reload_hooks):
        hook()
    return epoch


def load_file(tier: str, path: Path, kernel_family: str, arch_family: str) -> LoadResult:
    """Read one file now (no caching, no warning): what status and the epoch cache share."""
    def result(state: str, db: schema.DatabaseFile | None = None, problem: str = "") -> LoadResult:
        return LoadResult(tier, path, kernel_family, arch_family, state, db, problem)

    try:
        raw = schema.read_raw(path)
    except FileNotFoundError:
        return result("missing")
    except CorruptDatabaseError as exc:
        return result("corrupt", problem=str(exc))
    except OSError as exc:
        return result("corrupt", problem=f"{path}: unreadable: {exc.strerror or exc}")
    try:
        db = schema.parse(raw, str(path), kernel_family, arch_family)
    except ValidatorMismatchError as exc:
        return result("mismatch", problem=str(exc))
    except CorruptDatabaseError as exc:
        return result("corrupt", problem=str(exc))
    except (TypeError, ValueError, ArithmeticError, RecursionError) as exc:  # a shape parse() did not foresee
        return result("corrupt", problem=f"{path}: unreadable structure: {exc}")
    fake = simulated_problem(db, path)
    if fake:
        return result("simulated", problem=fake)
    return result("loaded", db)


def simulated_problem(db: schema.DatabaseFile, path: Path) -> str:
    """Why a file holding `--simulate` entries may not serve ('' when it holds none): their
    numbers came from the cost model plus noise, and a tier serves measurements only."""
    fake = sorted(sig.format() for sig, e in db.entries.items() if e.source == "simulated")
    if not fake:
        return ""
    return (f"{path}: {len(fake)} entr{'y' if len(fake) == 1 else 'ies'} with source 'simulated' "
            f"(e.g. {fake[0]}): made by --simulate from the cost model plus noise, not measured; "
            f"a tier serves measured results only (delete the file, or rebuild it on a GPU)")


def warn_once(key: str, reason: str, message: str) -> None:
    """One DatabaseWarning (and one log record, for an application's handlers) per (key, reason) per epoch."""
    with _lock:
        if (key, reason) in _warned:
            return
        _warned.add((key, reason))
    log.warning(message)
    warnings.warn(message, DatabaseWarning, stacklevel=3)


def get(tier: str, arch_family: str, kernel_family: str) -> LoadResult | None:
    """This epoch's view of one tier file (read on first use); None when the tier is off."""
    key = (tier, arch_family, kernel_family)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            return hit
        path = file_path(tier, arch_family, kernel_family)
        if path is None:
            return None
        res = load_file(tier, path, kernel_family, arch_family)
        _cache[key] = res
    if res.state in ("corrupt", "mismatch", "simulated"):
        kind = {"corrupt": "corrupt", "mismatch": "hard validator mismatch",
                "simulated": "simulated, not measured"}[res.state]
        warn_once(str(path), res.problem,
                  f"tunedb: skipping {tier}-tier database file ({kind}): {res.problem}")
    return res


def loaded(arch_family: str, kernel_family: str) -> tuple[LoadResult, ...]:
    """The usable files for (arch, family), in precedence order (user first)."""
    out = []
    for tier in TIERS:
        res = get(tier, arch_family, kernel_family)
        if res is not None and res.usable:
            out.append(res)
    return tuple(out)


def discover(tier: str, arch_family: str | None = None) -> tuple[tuple[str, str, Path], ...]:
    """(arch family, kernel family, path) of every *.json file under a tier's root, sorted."""
    base = root(tier)
    if base is None:
        return ()
    try:
        if not base.is_dir():  # (is_dir raises for EACCES or a name too long: a reader's warning)
            return ()
    except OSError as exc:
        _unreadable(tier, base, exc)
        return ()
    out = []
    try:
        arch_dirs = sorted(p for p in base.iterdir() if p.is_dir())
    except OSError as exc:
        _unreadable(tier, base, exc)
        return ()
    for arch_dir in arch_dirs:
        if arch_family is not None and arch_dir.name != arch_family:
            continue
        try:
            files = sorted(p for p in arch_dir.iterdir() if p.suffix == ".json")
        except OSError as exc:
            _unreadable(tier, arch_dir, exc)
            continue
        out.extend((arch_dir.name, path.stem, path) for path in files)
    return tuple(out)


def _unreadable(tier: str, where: Path, exc: OSError) -> None:
    """A tier directory that cannot be listed: one warning naming it (its files are skipped, as a
    corrupt file is), never an error for a reader; a writer says so when it writes."""
    warnings.warn(f"skipping {tier}-tier directory {where}: {exc.strerror or exc} (its database files "
                  f"cannot be listed)", DatabaseWarning, stacklevel=3)
