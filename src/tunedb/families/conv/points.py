"""Exact-point conv entries (spec 000: "Conv1D entries use exact points ("1x3000") until they are
re-measured as regions over M = B * T_out") and their conversion to regions.

An exact point is `BxL`: a batch B and an input length L (frames; conv2d: input height, its width
is in the key). A PointEntry serves only the exact (B, L) it was measured at. `to_regions()`
turns it into the database's region form over M = B * T_out (conv2d: B * H_out * W_out): points
sorted by M, each point's config serving from the previous point's M + 1 up to its own (regions
round up, as every entry's do), equal neighbours merged, no catch-all unless one is given (a size
above the largest point then falls through to the next tier, as autotune()'s entries do). Two
points at one M with different configs cannot become one region: PointConflict names both.
Pure Python.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from tunedb.errors import SignatureError
from tunedb.families.conv import keys
from tunedb.records import Entry, Region, Signature

_POINT = re.compile(r"^(?P<b>[1-9]\d*)x(?P<l>[1-9]\d*)$")


class PointConflict(ValueError):
    """Two exact points reach the same M with different configs."""


@dataclass(frozen=True, order=True)
class ExactPoint:
    batch: int
    length: int

    @classmethod
    def parse(cls, text: str) -> "ExactPoint":
        m = _POINT.match(str(text))
        if not m:
            raise SignatureError(f"bad exact point {text!r}: expected BxL with positive integers, e.g. '1x3000'")
        return cls(int(m["b"]), int(m["l"]))

    def format(self) -> str:
        return f"{self.batch}x{self.length}"

    def size(self, sig: Signature) -> int:
        """M of this point for `sig` (B * T_out, or B * H_out * W_out)."""
        return keys.size_of(sig, self.batch, self.length)


@dataclass(frozen=True)
class PointEntry:
    signature: Signature
    points: tuple[tuple[ExactPoint, str], ...]

    @classmethod
    def from_json(cls, signature: str, data: Mapping[str, Any]) -> "PointEntry":
        """{"points": {"1x3000": "config id", ...}} for one signature text."""
        sig = Signature.parse(signature)
        why = keys.sig_reason(sig)
        if why:
            raise SignatureError(f"exact-point entry {signature!r}: {why}")
        raw = data.get("points") if isinstance(data, Mapping) else None
        if not isinstance(raw, Mapping) or not raw:
            raise SignatureError(f"exact-point entry {signature!r} needs a non-empty 'points' object")
        pts = []
        for text, cid in raw.items():
            if not isinstance(cid, str) or not cid:
                raise SignatureError(f"exact-point entry {signature!r}: point {text!r} maps to {cid!r}, not a config id")
            pts.append((ExactPoint.parse(text), cid))
        return cls(sig, tuple(sorted(pts)))

    def to_json(self) -> dict[str, Any]:
        return {"points": {p.format(): cid for p, cid in self.points}}

    def lookup(self, batch: int, length: int) -> str | None:
        """The config measured at exactly (batch, length), else None: a point serves only itself."""
        for p, cid in self.points:
            if p.batch == batch and p.length == length:
                return cid
        return None

    def to_regions(self, catch_all: str | None = None) -> tuple[Region, ...]:
        by_m: dict[int, tuple[ExactPoint, str]] = {}
        for p, cid in self.points:
            m = p.size(self.signature)
            seen = by_m.get(m)
            if seen is not None and seen[1] != cid:
                raise PointConflict(f"{self.signature}: points {seen[0].format()} ({seen[1]}) and {p.format()} "
                                    f"({cid}) are both M={m}; re-measure that size before converting")
            by_m[m] = (p, cid)
        regions: list[Region] = []
        for m in sorted(by_m):
            cid = by_m[m][1]
            if regions and regions[-1].config_id == cid:
                regions[-1] = Region(m, cid)
            else:
                regions.append(Region(m, cid))
        if catch_all is not None:
            regions.append(Region(None, catch_all))
        return tuple(regions)

    def to_entry(self, catch_all: str | None = None) -> Entry:
        """The region entry, its evidence naming each point it came from."""
        evidence = {f"M={p.size(self.signature)}": {"point": p.format(), "config": cid} for p, cid in self.points}
        return Entry(self.signature, self.to_regions(catch_all), evidence=evidence, source="points",
                     notes=("converted from exact points " + ", ".join(p.format() for p, _ in self.points),))


def load(data: Mapping[str, Any]) -> tuple[PointEntry, ...]:
    """Every exact-point entry of a spec-000 style file: {"entries": {signature: {"points": ...}}}."""
    entries = data.get("entries") if isinstance(data, Mapping) else None
    if not isinstance(entries, Mapping):
        raise SignatureError("an exact-point file needs an 'entries' object keyed by signature")
    return tuple(PointEntry.from_json(sig, body) for sig, body in entries.items())
