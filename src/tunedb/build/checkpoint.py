"""Build run directories: what a killed build needs to resume.

A run lives in `<cache root>/runs/<run id>/`: `run.json` (what the run was started for: family,
arch, census digest, the flags that change results), `finished/<digest>.json` (one per finished
signature: its entry and the configs it names) and, for `--out user|system`, the measurement
log. Resuming with the same run id skips every finished signature; resuming a run id with other
inputs is refused, since its finished entries would answer a different question. Every file is
written atomically (temp file + os.replace).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from tunedb import settings
from tunedb.database import write_atomic
from tunedb.errors import BuildError
from tunedb.records import Entry, Region, Signature

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RUN_FILE = "run.json"
LOG_FILE = "measurements.jsonl"


def runs_root() -> Path:
    return settings.cache_root() / "runs"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise BuildError(f"bad run id {run_id!r}: use 1-64 characters of [A-Za-z0-9_.-], "
                         f"starting with a letter or digit")
    return run_id


def entry_to_json(entry: Entry) -> dict[str, Any]:
    return {"signature": entry.signature.format(), "regions": [r.to_json() for r in entry.regions],
            "evidence": dict(entry.evidence), "source": entry.source, "notes": list(entry.notes)}


def entry_from_json(data: Mapping[str, Any]) -> Entry:
    regions = tuple(Region(None if hi is None else int(hi), str(cid)) for hi, cid in data["regions"])
    return Entry(Signature.parse(data["signature"]), regions, dict(data.get("evidence") or {}),
                 str(data.get("source", "build")), {}, tuple(data.get("notes") or ()))


@dataclass(frozen=True)
class Finished:
    """One finished signature: its entry, the configs it names, how much it measured."""

    entry: Entry
    config_ids: tuple[str, ...]
    arms_measured: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"entry": entry_to_json(self.entry), "configs": list(self.config_ids),
                "arms_measured": self.arms_measured, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Finished":
        return cls(entry_from_json(data["entry"]), tuple(data.get("configs") or ()),
                   int(data.get("arms_measured", 0)), float(data.get("seconds", 0.0)))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class RunDir:
    path: Path
    run_id: str
    resumed: bool = False

    @property
    def log_path(self) -> Path:
        return self.path / LOG_FILE

    def _finished_path(self, sig: Signature) -> Path:
        return self.path / "finished" / f"{_digest(sig.format())}.json"

    def finished(self) -> dict[Signature, Finished]:
        """Every finished signature of this run; an unreadable checkpoint counts as unfinished."""
        out: dict[Signature, Finished] = {}
        folder = self.path / "finished"
        if not folder.is_dir():
            return out
        for f in sorted(folder.glob("*.json")):
            try:
                done = Finished.from_json(json.loads(f.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # torn or foreign: that signature is measured again
            out[done.entry.signature] = done
        return out

    def save(self, done: Finished) -> Path:
        path = self._finished_path(done.entry.signature)
        write_atomic(path, json.dumps(done.to_json(), sort_keys=True, indent=1) + "\n")
        return path


def open_run(run_id: str, meta: Mapping[str, Any], root: Path | None = None) -> RunDir:
    """Create run `run_id`, or reopen it when `meta` (what the run is for) matches the stored one."""
    check_run_id(run_id)
    path = (root or runs_root()) / run_id
    run_file = path / RUN_FILE
    meta = json.loads(json.dumps(dict(meta), sort_keys=True))  # normalise tuples etc.
    if run_file.exists():
        try:
            stored = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BuildError(f"run {run_id}: cannot read {run_file} ({exc}); "
                             f"start a new run id or delete {path}") from None
        differ = sorted(k for k in set(stored) | set(meta) if stored.get(k) != meta.get(k))
        if differ:
            raise BuildError(
                f"run {run_id} at {path} was started with other inputs ({', '.join(differ)} differ: "
                + "; ".join(f"{k} was {stored.get(k)!r}, now {meta.get(k)!r}" for k in differ)
                + "); resume it with the same census and flags, or use a new --run-id")
        return RunDir(path, run_id, resumed=True)
    write_atomic(run_file, json.dumps(meta, sort_keys=True, indent=1) + "\n")
    return RunDir(path, run_id, resumed=False)
