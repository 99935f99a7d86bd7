"""Every TUNEDB_* environment variable: declared once, typed, documented, read on access.

Nothing here reads the environment at import time. Each setting is read when its
accessor is called, so tests can change ``os.environ`` (or use ``override``) and the
next call sees it.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tunedb.errors import SettingsError


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    doc: str
    allowed: tuple[str, ...] | None = None  # None: free-form

    def raw(self) -> str:
        value = os.environ.get(self.name, self.default)
        if self.allowed is not None and value not in self.allowed:
            raise SettingsError(
                f"{self.name}={value!r} is not allowed; use one of {', '.join(self.allowed)}"
            )
        return value


USER_DB = Setting(
    "TUNEDB_USER_DB", "",
    "User-tier directory; empty means ~/.cache/tunedb/v1; 'off' disables the user tier.",
)
MODEL_FALLBACK = Setting(
    "TUNEDB_MODEL_FALLBACK", "auto",
    "'auto': the cost-model tier ranks configs for uncovered shapes; '0': tier off.",
    ("auto", "0", "1"),
)
COMPILE_SET = Setting(
    "TUNEDB_COMPILE_SET", "tuned",
    "'tuned': configs the DB references + default + coverage basis; 'all': whole space.",
    ("tuned", "all"),
)
HEURISTIC = Setting(
    "TUNEDB_HEURISTIC", "1",
    "'0': every shape uses the family default (tiers are bypassed).",
    ("0", "1"),
)
APPROXIMATE = Setting(
    "TUNEDB_APPROXIMATE", "0",
    "'1': arms that approximate the op (tanh GELU for exact GELU) may serve, gate permitting.",
    ("0", "1"),
)
CAPTURE = Setting(
    "TUNEDB_CAPTURE", "",
    "A file path: record every tuned op's shape at run time, for `tunedb census --capture`.",
)
CACHE_DIR = Setting(
    "TUNEDB_CACHE_DIR", "",
    "Root of tunedb's caches (arch profiles, measurement logs, Triton prebuild); "
    "empty means ~/.cache/tunedb.",
)

JIT_LAUNCH = Setting(
    "TUNEDB_JIT_LAUNCH", "0",
    "'1': every Triton launch goes through JITFunction.run (no direct launch of the compiled binary).",
    ("0", "1"),
)

ALL: tuple[Setting, ...] = (USER_DB, MODEL_FALLBACK, COMPILE_SET, HEURISTIC, APPROXIMATE,
                            CAPTURE, CACHE_DIR, JIT_LAUNCH)


def cache_root() -> Path:
    raw = CACHE_DIR.raw()
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "tunedb"


def triton_cache_dir() -> Path:
    """Where Triton's kernel cache lives: TRITON_CACHE_DIR when set (Triton's own variable), else
    <cache_root>/triton, which `tunedb prebuild` fills and the GEMM launcher points Triton at."""
    raw = os.environ.get("TRITON_CACHE_DIR", "")
    return Path(raw).expanduser() if raw else cache_root() / "triton"


def user_db_dir() -> Path | None:
    """The user tier's root (holding <arch>/<family>.json), or None when disabled."""
    raw = USER_DB.raw()
    if raw.strip().lower() == "off":
        return None
    if raw:
        return Path(raw).expanduser()
    return cache_root() / "v1"


def model_fallback_enabled() -> bool:
    return MODEL_FALLBACK.raw() != "0"


def compile_set() -> str:
    return COMPILE_SET.raw()


def heuristic_enabled() -> bool:
    return HEURISTIC.raw() != "0"


def approximate_allowed() -> bool:
    return APPROXIMATE.raw() == "1"


def capture_path() -> Path | None:
    raw = CAPTURE.raw()
    return Path(raw).expanduser() if raw else None


def jit_launch() -> bool:
    return JIT_LAUNCH.raw() == "1"


@contextlib.contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Temporarily set TUNEDB_* variables by short name: override(USER_DB="off")."""
    by_short: dict[str, Setting] = {s.name.removeprefix("TUNEDB_"): s for s in ALL}
    saved: dict[str, str | None] = {}
    for short, value in values.items():
        if short not in by_short:
            raise SettingsError(f"unknown setting {short!r}; known: {', '.join(by_short)}")
        name = by_short[short].name
        saved[name] = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def describe() -> list[tuple[str, str, str]]:
    """(name, current raw value or default, doc) for every setting: for `tunedb status`."""
    out = []
    for s in ALL:
        out.append((s.name, os.environ.get(s.name, s.default), s.doc))
    return out


