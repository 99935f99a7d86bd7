"""The measurement log: JSONL, one Measurement.to_json() per line plus "provenance" and "run_id".

Appends are safe from concurrent processes: each line goes out in one write() on an O_APPEND
descriptor under an exclusive flock, so lines never interleave. The reader skips (with a
warning naming file and line) a line that is not a measurement, e.g. the torn last line of a
killed writer; strict=True raises instead.
"""
from __future__ import annotations

import fcntl
import gzip
import json
import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from tunedb.errors import MeasurementError
from tunedb.records import Measurement, Provenance


@dataclass(frozen=True)
class LogRecord:
    measurement: Measurement
    provenance: Provenance
    run_id: str


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def encode(m: Measurement, provenance: Provenance, run_id: str) -> str:
    line = dict(m.to_json())
    line["provenance"] = provenance.to_json()
    line["run_id"] = run_id
    return json.dumps(line, sort_keys=True, allow_nan=False) + "\n"


class MeasurementLog:
    """An append-only JSONL log stamped with one run's provenance and run id."""

    def __init__(self, path: str | Path, provenance: Provenance, run_id: str | None = None) -> None:
        self.path = Path(path)
        self.provenance = provenance
        self.run_id = run_id or new_run_id()

    def append(self, measurements: Iterable[Measurement]) -> int:
        """Append one line per measurement; returns how many were written."""
        lines = [encode(m, self.provenance, self.run_id) for m in measurements]
        if not lines:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                for line in lines:
                    data = line.encode()
                    written = os.write(fd, data)
                    if written != len(data):  # a short write would tear the line: say so
                        raise MeasurementError(
                            f"short write to measurement log {self.path}: {written} of {len(data)} bytes"
                        )
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        return len(lines)


def iter_log(path: str | Path, strict: bool = False) -> Iterator[LogRecord]:
    """The log's records; a `.gz` log (as committed under bench/results) is read as it is. A line
    that is not a measurement (torn, not UTF-8, a field of the wrong type) is skipped with a
    warning naming file and line (the first SHOWN_BAD_LINES; the rest counted in one warning); a
    file of several lines none of which is a measurement (a census or a database given by
    mistake) is a MeasurementError; a compressed log cut short ends where it was cut."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise MeasurementError(f"measurement log {path} is not a regular file")
    try:
        fh = gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
    except OSError as exc:
        raise MeasurementError(f"cannot read measurement log {path}: {exc.strerror or exc}") from exc

    skipped: list[str] = []
    yielded = 0

    def bad(lineno: int, exc: BaseException) -> None:
        msg = f"measurement log {path}:{lineno}: skipped a bad line ({type(exc).__name__}: {exc})"
        if strict:
            raise MeasurementError(msg) from exc
        skipped.append(msg)
        if len(skipped) <= SHOWN_BAD_LINES:  # a file that is no log at all is one error below, not a line each
            warnings.warn(msg, RuntimeWarning, stacklevel=4)

    for rec in _records(path, fh, bad):
        yielded += 1
        yield rec
    if len(skipped) > 1 and not yielded:  # one torn line alone is a writer killed mid-line, not a wrong file
        raise MeasurementError(f"{path} is not a measurement log: none of its lines is a measurement "
                               f"({len(skipped)} skipped; the first: {skipped[0].split(': ', 1)[1]})")
    if len(skipped) > SHOWN_BAD_LINES:
        warnings.warn(f"measurement log {path}: {len(skipped) - SHOWN_BAD_LINES} more bad line(s) skipped "
                      f"({len(skipped)} in all, {yielded} measurements read)", RuntimeWarning, stacklevel=2)


SHOWN_BAD_LINES = 5  # bad lines of a log warned about one by one; the rest are counted


def _records(path: Path, fh, bad) -> Iterator[LogRecord]:
    with fh:
        lineno = 0
        while True:
            try:
                raw = fh.readline()
            except (OSError, EOFError) as exc:  # a truncated or corrupt .gz: keep what was read
                bad(lineno + 1, exc)
                return
            if not raw:
                return
            lineno += 1
            try:
                # the first line may start with the byte-order mark a Windows editor writes
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
                if not text.strip():
                    continue
                data = json.loads(text)
                if not isinstance(data, dict):
                    raise ValueError("a line must be a JSON object")
                rec = LogRecord(
                    Measurement.from_json(data),
                    Provenance.from_json(data.get("provenance") or {}),
                    str(data.get("run_id", "")),
                )
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
                bad(lineno, exc)
                continue
            yield rec


def read_log(path: str | Path, strict: bool = False) -> list[LogRecord]:
    """Every record of a measurement log, in file order."""
    return list(iter_log(path, strict=strict))


def read_measurements(*paths: str | Path) -> list[Measurement]:
    """The measurements of every log given, in order (their records' provenance dropped)."""
    return [r.measurement for path in paths for r in iter_log(path)]
