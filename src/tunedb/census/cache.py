"""A preset's census, taken once per code and library version and reused from the cache.

A census of a preset workload on meta tensors is a pure function of its arguments, tunedb's own
source and the model libraries' versions, yet taking it costs seconds of imports and tracing
(11 s of the 20 s warm `tunedb tune whisper-base` on the H200). The census is stored under
<cache root>/census/<key>.json in the census file format and read back on the next call with
the same key. A user's module:callable is never cached (its code is not ours to hash), and a
manifest enters the key by its content.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from tunedb.input_files import read_text
from tunedb.records import ShapeSet

_LIBRARIES = ("torch", "transformers", "torchaudio")


@lru_cache(maxsize=1)
def source_hash() -> str:
    """sha256 of every tunedb .py file (path and bytes): any code change starts a new census."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def key(workload: str, **args: Any) -> str | None:
    """The cache key of a census of `workload` with these arguments (None: not cacheable)."""
    from tunedb.census.presets import PRESETS

    if workload not in PRESETS:
        return None
    manifest = args.get("manifest")
    if manifest is not None:
        if not Path(manifest).is_file():  # a pipe (<(...), a FIFO) reads once: the census's, not the key's
            return None
        try:
            args["manifest"] = hashlib.sha256(read_text(manifest).encode()).hexdigest()
        except (OSError, UnicodeDecodeError):
            return None  # the census itself reports the unreadable manifest
    text = json.dumps({"workload": workload, "args": args, "versions": _versions(), "source": source_hash()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _path(k: str) -> Path:
    from tunedb import settings

    return settings.cache_root() / "census" / f"{k}.json"


def hit(workload: str, **args: Any) -> bool:
    """Whether cached() would read this census from the cache (its file is there)."""
    k = key(workload, **args)
    return k is not None and _path(k).is_file()


def cached(workload: str, take: Callable[[], ShapeSet], **args: Any) -> ShapeSet:
    """The census from the cache when one with this key is there, else take() and store it."""
    from tunedb.census.censusfile import from_json, to_json, write_census

    k = key(workload, **args)
    if k is None:
        return take()
    path = _path(k)
    try:
        return from_json(json.loads(path.read_text()), where=str(path))
    except Exception:  # noqa: BLE001 - absent or unreadable: take it afresh (and overwrite)
        pass
    shapes = take()
    try:
        write_census(path, shapes)
    except OSError:  # a read-only cache costs the next call a census, nothing else
        pass
    # as the file reads back (its meta in key order), so a hit and a miss give equal censuses
    return from_json(to_json(shapes), where="census")
