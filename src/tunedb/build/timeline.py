"""When the stages of a `tunedb tune` happened, in seconds since this process started.

A cold tune overlaps a census, a speculative plan's compiles in a pool and a pass measuring
ahead (build/speculative.py); which of them is on the critical path shows only in their start
and end times on one clock. Stages call mark(name) (the first call wins) or mark(name,
last=True) (the latest wins: "last compile done"); `tunedb tune` prints line() under
TUNEDB_TIMELINE=1 and bench/tune_wall.py parses it (parse()). The clock starts at the process's
start as the kernel recorded it (/proc/self/stat, 10 ms ticks), so interpreter start and imports
are counted; where that cannot be read, at this module's import. Marks are set from several
threads (the pool's done callbacks, the pass beside the census): a dict item store is atomic.
"""
from __future__ import annotations

import os
import re
import time

# The order stages are printed in (others follow in the order they were marked)
ORDER = ("pool prestart", "worker prestart", "torch imported", "mirror start", "mirror census", "mirror plan",
         "first compile submitted", "mirror plan (measured profile)", "last compile submitted",
         "first compile done", "ahead pass start", "ahead first point", "census end", "build start",
         "last compile done", "build end", "evaluation end")
_LINE = "timeline (s since process start): "
_ITEM = re.compile(r"([a-z][a-z ()]*?) ([0-9]+(?:\.[0-9]+)?)(?:,|$)")  # "mirror plan (measured profile)"


def _process_start() -> float:
    """This process's start on time.monotonic()'s clock (CLOCK_MONOTONIC and the kernel's
    starttime both count from boot, the latter in clock ticks; CLOCK_BOOTTIME also counts
    suspend, which the starttime does as well)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5), after pid and comm
        return time.monotonic() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()


_START = _process_start()
_MARKS: dict[str, float] = {}


def since_start() -> float:
    return time.monotonic() - _START


def mark(name: str, last: bool = False) -> None:
    """Record `name` now (the first time only, unless `last`)."""
    if last or name not in _MARKS:
        _MARKS[name] = since_start()


def marks() -> dict[str, float]:
    """Every mark, in ORDER then in the order marked."""
    known = [k for k in ORDER if k in _MARKS]
    return {k: _MARKS[k] for k in known + [k for k in list(_MARKS) if k not in ORDER]}


def clear() -> None:
    _MARKS.clear()


def line() -> str:
    """'timeline (s since process start): pool prestart 0.41, mirror plan 5.20, ...'."""
    return _LINE + ", ".join(f"{k} {v:.2f}" for k, v in marks().items())


def parse(text: str) -> dict[str, float] | None:
    """A line() read back ({stage: seconds}); None for any other line."""
    if not text.startswith(_LINE):
        return None
    return {k.strip(): float(v) for k, v in _ITEM.findall(text[len(_LINE):])}
