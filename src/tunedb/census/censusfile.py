"""The census file: read (validated), write (atomically) and merge ShapeSets. Pure Python.

    {"schema": 1, "workload": "whisper-base", "mode": "offline", "meta": {...},
     "points": [{"signature": "gemm|op=gemm|dt=half|N=512|K=512", "M": 1500, "weight": 0.12,
                 "calls": 32, "must_tune": true, "eager_share": 0.0}, ...]}

The mode is kept in ShapeSet.meta under "mode". Merging adds weights and calls per
(signature, M), ORs must_tune and averages eager_share weighted by calls (records.merge_point).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from tunedb.input_files import read_text
from tunedb import families
from tunedb.errors import CensusError, SignatureError
from tunedb.records import Point, ShapeSet, Signature, merge_point

SCHEMA = 1


M_MAX = 2**31 - 1  # a size M past any tensor dimension a GEMM is launched with (32-bit)
WEIGHT_MAX = 1e15  # a weight is a share or a call count: far below what a sum could overflow
CALLS_MAX = 10**15  # a call count: far past any census, far below what a sum of counts could overflow


def to_json(census: ShapeSet) -> dict[str, Any]:
    meta = dict(census.meta)
    points = sorted(census.points, key=lambda p: (p.signature, p.m))
    return {"schema": SCHEMA, "workload": census.workload, "mode": meta.pop("mode", ""), "meta": meta,
            "points": [{"signature": p.signature.format(), "M": p.m, "weight": p.weight, "calls": p.calls,
                        "must_tune": p.must_tune, "eager_share": p.eager_share} for p in points]}


def check_out(path: str | Path, inputs: tuple[tuple[str, Any], ...] = ()) -> None:
    """CensusError when a census cannot be written to `path` (checked before the census is taken):
    a directory, a parent that is not a writable directory, one of the run's `inputs` (option,
    path) other than a census merged, or an existing file that is not a census (a tuning
    database, a manifest: overwritten, it was lost)."""
    import os

    path = Path(path).expanduser()
    if path.is_dir():
        raise CensusError(f"--out {path} is a directory; --out takes the census file to write "
                          f"(e.g. {path / 'census.json'})")
    for option, given in inputs:
        if given is not None and path.exists() and Path(given).expanduser().exists() and \
                os.path.samefile(path, Path(given).expanduser()):
            raise CensusError(f"--out {path} is this run's {option} input; write the census elsewhere")
    if path.is_file() and path.stat().st_size:
        held = _holds(path)
        if held is not None:
            raise CensusError(f"--out {path} exists and holds {held}, not a census; tunedb census "
                              f"overwrites only a census file: write it elsewhere or remove that file first")
    from tunedb.out_paths import why_unwritable

    why = why_unwritable(path)  # the nearest existing directory: one, and writable
    if why is not None:
        raise CensusError(f"--out {path}: {why}" + ("; write the census elsewhere" if "writable" in why else ""))


def _holds(path: Path) -> str | None:
    """What an existing file holds when it is not a census file (None: a census, overwritable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return "something that is not JSON (a manifest or a recording?)"
    if isinstance(data, dict) and "kernel_family" in data:
        return f"a tuning database (kernel_family {data['kernel_family']!r})"
    if isinstance(data, dict) and "schema" in data and "points" in data:
        return None
    return "JSON that is not a census (no 'schema' and 'points')"


def write_census(path: str | Path, census: ShapeSet) -> None:
    """Write atomically (the database's writer: temp file, fsync, os.replace)."""
    from tunedb.database import write_atomic

    write_atomic(Path(path), json.dumps(to_json(census), indent=1) + "\n")


def _field(row: dict, name: str, kinds: tuple[type, ...], where: str) -> Any:
    if name not in row:
        raise CensusError(f"{where}: missing field {name!r}")
    value = row[name]
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        allowed = " or ".join(k.__name__ for k in kinds)
        raise CensusError(f"{where}: field {name!r} must be {allowed}, got {value!r}")
    return value


def from_json(data: Any, where: str = "census") -> ShapeSet:
    if not isinstance(data, dict):
        raise CensusError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if "points" not in data and "entries" in data and "kernel_family" in data:
        return _from_database(data, where)
    if data.get("schema") != SCHEMA:
        raise CensusError(f"{where}: field 'schema' must be {SCHEMA}, got {data.get('schema')!r}")
    workload = _field(data, "workload", (str,), where)
    mode = _field(data, "mode", (str,), where)
    meta = _field(data, "meta", (dict,), where) if "meta" in data else {}
    rows = _field(data, "points", (list,), where)
    points = []
    for i, row in enumerate(rows):
        at = f"{where}: points[{i}]"
        if not isinstance(row, dict):
            raise CensusError(f"{at}: expected an object, got {row!r:.60}")
        try:
            sig = Signature.parse(_field(row, "signature", (str,), at))
            families.check_key(sig)
        except SignatureError as exc:
            raise CensusError(f"{at}: field 'signature': {exc}") from exc
        m = _field(row, "M", (int,), at)
        weight = float(_field(row, "weight", (int, float), at))
        calls = _field(row, "calls", (int,), at)
        must = _field(row, "must_tune", (bool,), at)
        eager = float(_field(row, "eager_share", (int, float), at))
        if not 1 <= m <= M_MAX:
            raise CensusError(f"{at}: field 'M' must be in [1, {M_MAX}], got {m}")
        if not 0 <= weight <= WEIGHT_MAX:  # (NaN fails too) sums of weights must stay finite
            raise CensusError(f"{at}: field 'weight' must be a number in [0, {WEIGHT_MAX:g}], got {weight}")
        if not 0 <= calls <= CALLS_MAX:
            raise CensusError(f"{at}: field 'calls' must be an integer in [0, {CALLS_MAX}], got "
                              f"{calls if calls < 10**30 else f'an integer of {len(str(calls))} digits'}")
        if not 0.0 <= eager <= 1.0:
            raise CensusError(f"{at}: field 'eager_share' must be in [0, 1], got {eager}")
        points.append(Point(sig, m, weight, calls, must, eager))
    seen: dict[tuple[Signature, int], int] = {}
    for i, p in enumerate(points):
        j = seen.setdefault((p.signature, p.m), i)
        if j != i:
            raise CensusError(f"{where}: points[{j}] and points[{i}] are the same point "
                              f"({p.signature.format()!r} at M={p.m}); merge them into one (sum their calls)")
    meta_items = tuple(sorted((str(k), str(v)) for k, v in meta.items() if k != "mode"))
    return ShapeSet(tuple(points), workload, (("mode", mode),) + meta_items)


def _from_database(data: dict, where: str) -> ShapeSet:
    """A database file read as a census: every entry at the sizes it was measured at (its
    evidence's M=... keys; its region bounds where it kept none), each a must-tune point of weight
    1. `tunedb build` / `prebuild --census` of a shipped table re-plans the points it measured."""
    entries = data["entries"]
    if not isinstance(entries, dict):
        raise CensusError(f"{where}: database field 'entries' must be an object keyed by signature, "
                          f"got {type(entries).__name__}")
    points = []
    for text, entry in entries.items():
        at = f"{where}: entries[{text!r:.80}]"
        try:
            sig = Signature.parse(text)
            families.check_key(sig)
        except SignatureError as exc:
            raise CensusError(f"{at}: {exc}") from exc
        if not isinstance(entry, dict):
            raise CensusError(f"{at}: expected an object, got {entry!r:.60}")
        evidence = entry.get("evidence") if isinstance(entry.get("evidence"), dict) else {}
        sizes = {int(k[2:]) for k in evidence if isinstance(k, str) and k[:2] == "M=" and k[2:].isdigit()}
        if not sizes:
            regions = entry.get("regions") if isinstance(entry.get("regions"), list) else []
            sizes = {r[0] for r in regions if isinstance(r, list) and r and type(r[0]) is int}
        sizes = {m for m in sizes if 1 <= m <= M_MAX} or {1}
        points.extend(Point(sig, m, 1.0, 1, True, 0.0) for m in sorted(sizes))
    name = data.get("kernel_family") if isinstance(data.get("kernel_family"), str) else ""
    return ShapeSet(tuple(points), f"database:{name}", (("mode", ""),))


def read_census(path: str | Path) -> ShapeSet:
    path = Path(path)
    try:
        data = json.loads(read_text(path))
    except OSError as exc:
        raise CensusError(f"cannot read census {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CensusError(f"census {path} is not UTF-8 text (byte {exc.start}): is it a census file?") from exc
    except json.JSONDecodeError as exc:
        raise CensusError(f"census {path} is not JSON: {exc.msg} (line {exc.lineno})") from exc
    except ValueError as exc:  # an integer past Python's 4300-digit limit
        raise CensusError(f"census {path}: {str(exc)[:120]}") from exc
    except RecursionError:
        raise CensusError(f"census {path} is not a census: its JSON is nested too deeply") from None
    return from_json(data, str(path))


def merge_points(points: Iterable[Point]) -> tuple[Point, ...]:
    """One point per (signature, M): weights and calls add, must_tune ORs, eager_share by calls."""
    groups: dict[tuple[Signature, int], list[Point]] = {}
    for p in points:
        groups.setdefault((p.signature, p.m), []).append(p)
    return tuple(merge_point(groups[key]) for key in sorted(groups))


def merge(*censuses: ShapeSet) -> ShapeSet:
    """Merge censuses (e.g. offline + streaming, or a census + a capture)."""
    if not censuses:
        raise CensusError("merge needs at least one census")
    workloads = sorted({c.workload for c in censuses if c.workload})
    modes = sorted({dict(c.meta).get("mode", "") for c in censuses} - {""})
    meta: dict[str, str] = {}
    forwards = 0
    for c in censuses:
        for k, v in c.meta:
            if k == "forwards" and v.isascii() and v.isdigit():
                forwards += int(v)  # the calls add up, so the forwards they came from do too
            elif k != "mode":
                meta.setdefault(k, v)
    if forwards:
        meta["forwards"] = str(forwards)
    return ShapeSet(merge_points(p for c in censuses for p in c.points), "+".join(workloads),
                    (("mode", "+".join(modes)),) + tuple(sorted(meta.items())))
