"""The autotune() cache file: measured winners per signature, keyed by M bucket.

Pure Python (no torch, no GPU). Version 3, the one written:

    {"version": 3,
     "env": {"arch_family": "sm90", "sku": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
             "tunedb": "0.1.0"},
     "results": {"gemm|op=gemm|dt=bf16|N=512|K=256":
                   {"104": {"100": {"config": "b64x64x64_w4_s3_g8", "ms": 0.0123}}}}}

results[signature][bucket][measured M] = the winner measured at that M. A lookup at M takes,
within M's bucket, the closest size measured at or above M: a result serves only sizes at or
below the one it was measured at. Older versions still load:

- version 2: results[signature][bucket] = {"config": ..., "ms": ...}: no measured size; the
  result serves its whole bucket.
- version 1: results[signature][M] = config id: exact shapes, read as results measured at M.

The arch family is a hard validator (a cache from another arch is refused, with a warning);
other environment differences (SKU, torch, Triton, tunedb) warn and the file still serves.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from tunedb.buckets import bucket_of
from tunedb.errors import AutotuneWarning, CorruptDatabaseError, SignatureError
from tunedb.database import lock_path, write_atomic
from tunedb.database.schema import loads as strict_loads
from tunedb.database.store import LOCK_TIMEOUT_S
from tunedb.records import Signature

VERSION = 3
SOFT_KEYS: tuple[str, ...] = ("sku", "torch", "triton", "tunedb")


@dataclass(frozen=True)
class Result:
    """One measured winner. m is None for a version-2 result serving its whole bucket."""

    signature: Signature
    bucket: int
    m: int | None
    config_id: str
    ms: float | None = None


class CacheRefused(Exception):
    """Internal: the file exists but cannot be used (corrupt, another arch, unknown version)."""


class AutotuneCache:
    """The in-memory cache: lookups, new results, and the version-3 file it writes."""

    def __init__(self, env: Mapping[str, str], bucket: Callable[[int], int] = bucket_of) -> None:
        self.env = dict(env)
        self._bucket = bucket
        # signature -> bucket -> measured M (None: bucket-wide) -> Result
        self._results: dict[Signature, dict[int, dict[int | None, Result]]] = {}
        self.dirty = False

    def __len__(self) -> int:
        return sum(len(per_m) for per_b in self._results.values() for per_m in per_b.values())

    def results(self) -> Iterator[Result]:
        for per_b in self._results.values():
            for per_m in per_b.values():
                yield from per_m.values()

    def lookup(self, sig: Signature, m: int) -> Result | None:
        """The closest result measured at or above m in m's bucket, else a bucket-wide one."""
        per_m = self._results.get(sig, {}).get(self._bucket(m))
        if not per_m:
            return None
        above = [mm for mm in per_m if mm is not None and mm >= m]
        if above:
            return per_m[min(above)]
        return per_m.get(None)

    def add(self, result: Result, *, mark_dirty: bool = True) -> None:
        per_b = self._results.setdefault(result.signature, {})
        per_b.setdefault(result.bucket, {})[result.m] = result
        self.dirty = self.dirty or mark_dirty

    def record(self, sig: Signature, m: int, config_id: str, ms: float | None) -> Result:
        """A winner measured now at m."""
        result = Result(sig, self._bucket(m), m, config_id, ms)
        self.add(result)
        return result

    # --- the file -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for sig in sorted(self._results):
            per_b = self._results[sig]
            buckets: dict[str, Any] = {}
            for b in sorted(per_b):
                rows = per_b[b]
                measured = {str(mm): {"config": r.config_id, "ms": r.ms}
                            for mm, r in sorted(rows.items(), key=lambda kv: kv[0] or 0)
                            if mm is not None}
                if None in rows:  # a version-2 result keeps serving its bucket
                    measured["bucket"] = {"config": rows[None].config_id, "ms": rows[None].ms}
                buckets[str(b)] = measured
            out[sig.format()] = buckets
        return {"version": VERSION, "env": self.env, "results": out}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Merge into the file and write it whole, atomically, under its lock: re-read what is
        there (another process sharing the cache may have added results since this one loaded
        it), keep those this cache lacks, write (temp file in the same folder + os.replace).
        CacheRefused when the file there is not a usable cache (corrupt, another arch): it is
        never overwritten."""
        import filelock

        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            with filelock.FileLock(str(lock_path(target)), timeout=LOCK_TIMEOUT_S):
                if os.path.lexists(target):  # a dangling link or a link loop is not "no file"
                    theirs = AutotuneCache(self.env, self._bucket)
                    with warnings.catch_warnings():  # load_into's warnings were given at open
                        warnings.simplefilter("ignore", AutotuneWarning)
                        theirs.load_into(target)
                    for result in theirs.results():
                        if result.m not in self._results.get(result.signature, {}).get(result.bucket, {}):
                            self.add(result, mark_dirty=False)
                write_atomic(target, json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")
        except filelock.Timeout:
            raise CacheRefused(f"could not take the lock {lock_path(target)} within {LOCK_TIMEOUT_S:.0f} s; "
                               f"another writer holds it") from None
        self.dirty = False
        return target

    def load_into(self, path: str | os.PathLike[str]) -> None:
        """Merge a cache file into this one; raise CacheRefused (with the reason) when unusable."""
        data = _read(Path(path))
        version = data.get("version")
        file_env = data.get("env") or {}
        if not isinstance(file_env, dict):
            raise CacheRefused(f"'env' must be an object, got {type(file_env).__name__}")
        arch = file_env.get("arch_family")
        if arch is not None and arch != self.env.get("arch_family"):
            raise CacheRefused(
                f"it was tuned on arch family {arch!r} and this device is "
                f"{self.env.get('arch_family')!r} (hard validator)"
            )
        results = data.get("results")
        if not isinstance(results, dict):
            raise CacheRefused("'results' must be an object")
        try:
            loaded = list(_parse(version, results, self._bucket))
        except (SignatureError, ValueError, TypeError, AttributeError, KeyError) as exc:
            raise CacheRefused(f"bad version-{version} content: {exc}") from exc
        if arch is None:
            warnings.warn(f"autotune cache {path} records no arch family; loading it as this device's",
                          AutotuneWarning, stacklevel=3)
        diffs = [f"{k}: {file_env[k]!r} (here {self.env.get(k)!r})" for k in SOFT_KEYS
                 if k in file_env and file_env[k] != self.env.get(k)]
        if diffs:
            warnings.warn(f"autotune cache {path} was tuned in another environment "
                          f"({'; '.join(diffs)}); its results still serve", AutotuneWarning, stacklevel=3)
        for result in loaded:
            self.add(result, mark_dirty=version != VERSION)


def check_writable(path: Path) -> None:
    """DatabaseError naming the cache path when its write at exit would fail (checked before
    anything is measured)."""
    from tunedb.database.target import unwritable
    from tunedb.errors import DatabaseError

    path = Path(path)
    if path.is_dir():
        raise DatabaseError(f"autotune cache {path} is a directory; cache= takes a file path")
    why = unwritable(path)
    if why is not None:
        raise DatabaseError(f"autotune cache {path} cannot be written: {why}; pass cache= a writable path (or None)")


def _signature(text: str) -> Signature:
    """A result's key, its fields checked as the family's schema wants them (N=abc or N=-5 loaded,
    then sorting the results at exit raised TypeError: the run's cache was never written)."""
    from tunedb import families

    sig = Signature.parse(text)
    families.check_key(sig)
    return sig


def _parse(version: Any, results: dict[str, Any],
           bucket: Callable[[int], int]) -> Iterator[Result]:
    if version == 3:
        for text, per_b in results.items():
            sig = _signature(text)
            for _b, rows in per_b.items():
                for mm, row in rows.items():
                    if mm == "bucket":  # carried-over version-2 result
                        yield Result(sig, int(_b), None, _config(row), _ms(row))
                    else:  # the bucket is recomputed from the measured size, never trusted
                        yield Result(sig, bucket(_size(mm)), _size(mm), _config(row), _ms(row))
    elif version == 2:
        for text, per_b in results.items():
            sig = _signature(text)
            for b, row in per_b.items():
                yield Result(sig, _size(b), None, _config(row), _ms(row))
    elif version == 1:
        for text, per_m in results.items():
            sig = _signature(text)
            for mm, config_id in per_m.items():
                if not isinstance(config_id, str):
                    raise TypeError(f"config for M={mm} must be a string, got {config_id!r}")
                yield Result(sig, bucket(_size(mm)), _size(mm), config_id, None)
    else:
        raise ValueError(f"unknown cache version {version!r}; readable versions are 1, 2, 3")


def _size(text: Any) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"size {text!r} must be a positive int")
    return value


def _config(row: Any) -> str:
    if not isinstance(row, dict) or not isinstance(row.get("config"), str):
        raise TypeError(f"result {row!r} must be an object with a string 'config'")
    return row["config"]


def _ms(row: dict[str, Any]) -> float | None:
    ms = row.get("ms")
    if ms is None:
        return None
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms < 0:
        raise ValueError(f"time {ms!r} must be a finite number >= 0 (ms)")
    return float(ms)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = strict_loads(path.read_text(), str(path))  # the tables' JSON: no repeated key, NaN, Infinity
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheRefused(f"cannot read it: {exc}") from exc
    except CorruptDatabaseError as exc:
        raise CacheRefused(str(exc).removeprefix(f"{path}: ")) from None
    if not isinstance(data, dict):
        raise CacheRefused(f"top level must be an object, got {type(data).__name__}")
    if "version" in data and type(data["version"]) is not int:
        raise CacheRefused(f"'version' must be a whole number, got {data['version']!r}")
    return data
