"""Run-time shape capture (TUNEDB_CAPTURE=F): the append helper the runtime calls, and the reader
that turns a capture into a ShapeSet for ``tunedb census --capture``. Pure Python.

A capture is JSONL, one line per record: {"signature": "...", "M": 16, "calls": 1, "captured": false}.
"captured" (optional, default false) says the call ran inside a CUDA-graph capture. Lines are
appended with one write each (O_APPEND), so concurrent processes interleave whole lines. The
runtime should call record_call once per new (signature, M) in a process, or pass aggregated calls.
A truncated last line (a killed process) is skipped; any other bad line is an error naming it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tunedb.input_files import read_text
from tunedb import settings
from tunedb.census.censusfile import CALLS_MAX, M_MAX
from tunedb.errors import CensusError, SignatureError
from tunedb.records import Point, ShapeSet, Signature


def record_call(sig: Signature | str, m: int, calls: int = 1, captured: bool = False,
                path: str | Path | None = None) -> bool:
    """Append one record to `path` (default: TUNEDB_CAPTURE); False when capture is off."""
    target = Path(path) if path is not None else settings.capture_path()
    if target is None:
        return False
    text = sig.format() if isinstance(sig, Signature) else Signature.parse(sig).format()
    line = json.dumps({"signature": text, "M": int(m), "calls": int(calls), "captured": bool(captured)}) + "\n"
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return True


def read_capture(path: str | Path) -> ShapeSet:
    """Aggregate a capture: one point per (signature, M) with its calls; weight = share of calls;
    must_tune when any of its calls were captured; eager_share = share of calls not captured."""
    path = Path(path)
    try:
        # lines end at \n only (str.splitlines splits at U+2028 inside a JSON string); a file ending in
        # \n leaves an empty last element, so a torn line is one the writer left without its \n
        lines = read_text(path).split("\n")
    except OSError as exc:
        raise CensusError(f"cannot read capture {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise CensusError(f"capture {path} is not UTF-8 text (byte {exc.start}): a capture is the JSONL "
                          f"that TUNEDB_CAPTURE writes") from exc
    acc: dict[tuple[Signature, int], list[int]] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:  # not JSON, a 4300-digit integer, brackets nested past the stack
            if lineno == len(lines):
                continue  # the writer died mid-line
            what = "nested too deeply" if isinstance(exc, RecursionError) else getattr(exc, "msg", exc)
            raise CensusError(f"capture {path} line {lineno} is not JSON: {what}") from None
        try:
            sig = Signature.parse(row["signature"])
            from tunedb import families

            families.check_key(sig)  # a key no family serves is refused here, not after the measuring
            m, calls = row["M"], row.get("calls", 1)
            captured = row.get("captured", False)
        except (KeyError, TypeError, SignatureError) as exc:
            raise CensusError(f"capture {path} line {lineno}: needs signature, M, calls ({exc})") from exc
        if (not all(isinstance(v, int) and not isinstance(v, bool) for v in (m, calls))
                or not 1 <= m <= M_MAX or not 0 <= calls <= CALLS_MAX):
            # the census file's own limits: a capture past them wrote a census every reader refused
            raise CensusError(f"capture {path} line {lineno}: M must be an int in [1, {M_MAX}] and calls an int "
                              f"in [0, {CALLS_MAX}], got M={m!r}, calls={calls!r}")
        if not isinstance(captured, bool):
            raise CensusError(f"capture {path} line {lineno}: 'captured' must be true or false, got {captured!r}")
        cur = acc.setdefault((sig, m), [0, 0])
        cur[0] += calls
        cur[1] += calls if captured is True else 0
    if not acc and any(line.strip() for line in lines):
        # a torn last line is a writer killed mid-line, but a file holding nothing else is no capture
        raise CensusError(f"capture {path} holds no captured call (its only line is not JSON): a capture "
                          f"is the JSONL that TUNEDB_CAPTURE writes, one call key a line")
    if not acc:
        raise CensusError(f"capture {path} is empty: no call was captured (run the model with "
                          f"TUNEDB_CAPTURE={path} first)")
    total = sum(c for c, _ in acc.values())
    points = tuple(
        Point(sig, m, weight=(calls / total if total else 0.0), calls=calls, must_tune=cap > 0,
              eager_share=((calls - cap) / calls if calls else 1.0))
        for (sig, m), (calls, cap) in sorted(acc.items()))
    return ShapeSet(points, "capture", (("mode", "capture"), ("capture", str(path))))
