"""The compile pool's done log: the jobs a pool already compiled into a compiler cache, so a
later build sends them to no process (build/compile_pool.py re-exports DoneLog and done_log)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Hashable


class DoneLog:
    """The jobs a pool compiled into a compiler cache, kept beside it
    (`<cache>/tunedb-compiled-<family>.json`), so a warm build does not send them to a process
    again: a pool process spends seconds starting and loading a cached binary, and the measuring
    side waited 5.2 s for that in a warm `tunedb tune whisper-base` (session 10, call B). The log
    holds for one fingerprint (the family's impl_hash and the compiler's version); a log of
    another, or one the cache lost, only costs the worker its compile at the first probe."""

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path, self.fingerprint = path, fingerprint
        self._known: set[str] = set()
        self._new: set[str] = set()
        try:
            data = json.loads(path.read_text())
            if data.get("fingerprint") == fingerprint:
                self._known = set(data.get("jobs", ()))
        except (OSError, ValueError, AttributeError):  # absent or unreadable: nothing known
            pass

    def has(self, job: Hashable) -> bool:
        return repr(job) in self._known

    def add(self, job: Hashable) -> None:
        self._new.add(repr(job))

    def save(self) -> None:
        if not self._new:
            return
        from tunedb.database import write_atomic

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps({"fingerprint": self.fingerprint,
                                                "jobs": sorted(self._known | self._new)}, indent=0))
            self._known |= self._new
            self._new.clear()
        except OSError:  # a read-only cache: the next build sends the jobs again
            pass


def done_log(family: Any) -> DoneLog | None:
    """The family's done log in its compiler cache, or None (no cache directory to keep it in)."""
    from tunedb.families.contract import hook

    cache = hook(family, "compiler_cache")()
    if not cache:
        return None
    try:
        from importlib.metadata import version

        compiler = version("triton")
    except Exception:  # noqa: BLE001 - no version to pin the log to: keep none
        return None
    return DoneLog(Path(cache) / f"tunedb-compiled-{family.name}.json", f"{family.impl_hash()}|triton {compiler}")
