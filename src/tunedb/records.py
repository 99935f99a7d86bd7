"""The frozen records that pipeline stages pass to one another.

Signature (the static key of an op), Point (a signature at one M, with traffic),
ShapeSet (a census), Config (explicit kernel parameters with a stable id), Status and
Measurement (one arm at one point), MeasureRequest (one point's request), Region and Entry
(a database row), Provenance (who measured what, where) and ArchProfile (device ceilings,
held in arch_profile.py and re-exported here).
Pure Python: no torch here.
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from tunedb.arch_profile import ArchProfile  # noqa: F401 - re-exported: a stage record
from tunedb.errors import ConfigError, SignatureError

# dtype names follow torch's short names; "half" is the key that serves fp16 and bf16.
DTYPES: tuple[str, ...] = ("half", "fp16", "bf16", "fp32", "fp64", "int8", "fp8")
HALF_DTYPES: tuple[str, ...] = ("fp16", "bf16")
SENTINELS: tuple[str, ...] = ("default", "torch", "fused", "heuristic")

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_VALUE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _parse_value(text: str) -> int | str:
    # digits past any size a key holds stay text (int() of 4300+ digits raises; a corrupt key is
    # then refused where its value is checked, not by a traceback here)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 30 else text


@dataclass(frozen=True, order=True)
class Signature:
    """`family|op=OP|dt=DT|KEY=VALUE...`; params keep their order, so format(parse(s)) == s."""

    family: str
    op: str
    dt: str
    params: tuple[tuple[str, int | str], ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.family):
            raise SignatureError(f"bad kernel family {self.family!r}: expected [a-z][a-z0-9_]*")
        if not _NAME.match(self.op):
            raise SignatureError(f"bad op {self.op!r}: expected [a-z][a-z0-9_]*")
        if self.dt not in DTYPES:
            raise SignatureError(f"bad dtype dt={self.dt!r}: allowed are {', '.join(DTYPES)}")
        seen = set()
        for key, value in self.params:
            if not _KEY.match(key) or key in ("op", "dt"):
                raise SignatureError(f"bad parameter name {key!r} in signature")
            if key in seen:
                raise SignatureError(f"parameter {key!r} appears twice in signature")
            seen.add(key)
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise SignatureError(f"parameter {key}={value!r} must be an int or a string")
            if isinstance(value, int) and value < 0:
                raise SignatureError(f"parameter {key}={value} must not be negative")
            if isinstance(value, str) and not _VALUE.match(value):
                raise SignatureError(f"parameter {key}={value!r} has characters outside [A-Za-z0-9_.-]")
        # The canonical text doubles as the hash key: a str caches its own hash, so the run-time
        # memo (keyed by signatures) hashes a signature once instead of walking its fields.
        tail = "".join(f"|{k}={v}" for k, v in self.params)
        object.__setattr__(self, "_text", f"{self.family}|op={self.op}|dt={self.dt}{tail}")

    def __hash__(self) -> int:
        return hash(self._text)

    @classmethod
    def make(cls, family: str, op: str, dt: str, **params: int | str) -> "Signature":
        return cls(family, op, dt, tuple(params.items()))

    @classmethod
    def parse(cls, text: str) -> "Signature":
        if not isinstance(text, str) or not text:
            raise SignatureError(f"signature must be a non-empty string, got {text!r}")
        parts = text.split("|")
        family, rest = parts[0], parts[1:]
        pairs: list[tuple[str, str]] = []
        for part in rest:
            key, sep, value = part.partition("=")
            if not sep or not key or not value:
                raise SignatureError(f"bad part {part!r} in signature {text!r}: expected KEY=VALUE")
            pairs.append((key, value))
        if len(pairs) < 2 or pairs[0][0] != "op" or pairs[1][0] != "dt":
            raise SignatureError(
                f"signature {text!r} must start with FAMILY|op=OP|dt=DT followed by |KEY=VALUE fields"
            )
        params = tuple((k, _parse_value(v)) for k, v in pairs[2:])
        sig = cls(family, pairs[0][1], pairs[1][1], params)
        if sig.format() != text:  # e.g. N=007 would not round-trip
            raise SignatureError(f"signature {text!r} is not canonical; expected {sig.format()!r}")
        return sig

    def format(self) -> str:
        return self._text

    __str__ = format

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def with_dt(self, dt: str) -> "Signature":
        return Signature(self.family, self.op, dt, self.params)

    def lookup_keys(self) -> tuple["Signature", ...]:
        """Keys to try for this concrete dtype, most specific first: bf16 -> (bf16, half)."""
        if self.dt in HALF_DTYPES:
            return (self, self.with_dt("half"))
        if self.dt == "half":
            return (self,)
        return (self,)


@dataclass(frozen=True)
class Point:
    """A signature at one size M of its dynamic dimension, with its share of traffic."""

    signature: Signature
    m: int
    weight: float = 1.0
    calls: int = 1
    must_tune: bool = False
    eager_share: float = 0.0  # alpha: share of calls issued eagerly (host cost counts)

    def __post_init__(self) -> None:
        if not isinstance(self.m, int) or self.m < 1:
            raise ValueError(f"point M={self.m!r} must be a positive int")
        if self.weight < 0:
            raise ValueError(f"point weight={self.weight} must be >= 0")
        if not 0.0 <= self.eager_share <= 1.0:
            raise ValueError(f"eager_share={self.eager_share} must be in [0, 1]")


def merge_point(group: "Sequence[Point]", at: "Point | None" = None) -> "Point":
    """THE point-merge rule (census merges, the plan's duplicate sizes, thinning, the oracle's
    weights): the points of `group` as one point at `at`'s signature and size (default: the
    first's) -- weights and calls add, must-tune ORs, the eager share is the calls-weighted mean
    (the largest share when no calls were counted)."""
    if not group:
        raise ValueError("merge_point needs at least one point")
    at = at or group[0]
    calls = sum(p.calls for p in group)
    if calls:
        eager = min(1.0, sum(p.eager_share * p.calls for p in group) / calls)
    else:
        eager = max(p.eager_share for p in group)
    return Point(at.signature, at.m, sum(p.weight for p in group), calls,
                 any(p.must_tune for p in group), eager)


@dataclass(frozen=True)
class ShapeSet:
    """What a census found: points (signature x M) with weights and must-tune flags."""

    points: tuple[Point, ...]
    workload: str = ""
    meta: tuple[tuple[str, str], ...] = ()

    def signatures(self) -> tuple[Signature, ...]:
        return tuple(sorted({p.signature for p in self.points}))

    def for_signature(self, sig: Signature) -> tuple[Point, ...]:
        return tuple(sorted((p for p in self.points if p.signature == sig), key=lambda p: p.m))


@dataclass(frozen=True)
class Config:
    """Explicit kernel parameters with a stable id; sentinels have lane == id and no params."""

    id: str
    lane: str
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or not _VALUE.match(self.id):
            raise ConfigError(f"bad config id {self.id!r}: expected [A-Za-z0-9_.-]+")

    @classmethod
    def sentinel(cls, name: str) -> "Config":
        if name not in SENTINELS:
            raise ConfigError(f"unknown sentinel {name!r}; sentinels are {', '.join(SENTINELS)}")
        return cls(name, name, ())

    @property
    def is_sentinel(self) -> bool:
        return self.id in SENTINELS

    def param(self, key: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"lane": self.lane}
        for k, v in self.params:
            out[k] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def from_json(cls, config_id: str, data: Mapping[str, Any]) -> "Config":
        if not isinstance(data, Mapping) or not isinstance(data.get("lane"), str):
            raise ConfigError(f"config {config_id!r} must be an object with a string 'lane'")
        params = []
        for k, v in data.items():
            if k == "lane":
                continue
            if isinstance(v, list):
                v = tuple(v)
            params.append((k, v))
        return cls(config_id, data["lane"], tuple(params))


class Status(str, enum.Enum):
    """The outcome of measuring one arm: failure is a status, never a magic number."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    INCORRECT = "incorrect"
    TIMEOUT = "timeout"
    INFEASIBLE = "infeasible"

    @property
    def ok(self) -> bool:
        return self is Status.OK


@dataclass(frozen=True)
class Provenance:
    utc: str = ""
    git_commit: str = ""
    git_dirty: str = ""
    gpu_name: str = ""
    gpu_uuid: str = ""
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    triton: str = ""
    tunedb: str = ""
    # a build's log: the measured family's implementation hash and the arch family it built for
    # (what `tunedb build --replay` writes as the table's validators and checks against --arch)
    impl_hash: str = ""
    arch: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Provenance":
        if not isinstance(data, Mapping):
            raise ValueError(f"provenance must be an object, got {data!r:.60}")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: str(v) for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Measurement:
    """One arm at one point. Times in milliseconds; samples are the raw per-call times."""

    signature: Signature
    m: int
    config_id: str
    status: Status
    median_ms: float | None = None
    sigma_ms: float | None = None
    n: int = 0
    samples: tuple[float, ...] = ()
    l2: str = "warm"  # "cold" (rotated weights) or "warm"
    host_us: float | None = None  # eager host issue time per call
    contended: bool = False
    detail: str = ""  # why a non-ok status happened
    env: tuple[tuple[str, Any], ...] = ()  # clocks, temperature, throttle reasons

    def __post_init__(self) -> None:
        if self.status is Status.OK and self.median_ms is None:
            raise ValueError("an ok measurement needs median_ms")
        if self.l2 not in ("cold", "warm"):
            raise ValueError(f"l2={self.l2!r} must be 'cold' or 'warm'")

    def objective(self, alpha: float) -> float | None:
        """GPU time + alpha * host issue time, in ms; None when not ok."""
        if not self.status.ok or self.median_ms is None:
            return None
        host_ms = (self.host_us or 0.0) / 1000.0
        return self.median_ms + alpha * host_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "signature": self.signature.format(), "M": self.m, "config": self.config_id,
            "status": self.status.value, "median_ms": self.median_ms, "sigma_ms": self.sigma_ms,
            "n": self.n, "samples": list(self.samples), "l2": self.l2, "host_us": self.host_us,
            "contended": self.contended, "detail": self.detail, "env": dict(self.env),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Measurement":
        """A measurement from a log line; ValueError naming the field when a time is not a finite
        number (a hand-edited or foreign line must not reach the objective as text or inf)."""
        samples = data.get("samples", ())
        env = data.get("env") or {}
        if not isinstance(samples, (list, tuple)):
            raise ValueError(f"field 'samples' must be a list of times, got {samples!r:.60}")
        if not isinstance(env, Mapping):
            raise ValueError(f"field 'env' must be an object, got {env!r:.60}")
        return cls(
            signature=Signature.parse(data["signature"]), m=int(data["M"]),
            config_id=str(data["config"]), status=Status(data["status"]),
            median_ms=_time_field(data, "median_ms"), sigma_ms=_time_field(data, "sigma_ms"),
            n=int(data.get("n", 0)), samples=tuple(_time(v, "samples") for v in samples),
            l2=data.get("l2", "warm"), host_us=_time_field(data, "host_us"),
            contended=bool(data.get("contended", False)), detail=str(data.get("detail", "")),
            env=tuple(sorted(env.items())),
        )


def _time(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"field {name!r}: {value!r:.40} is not a finite number")
    return float(value)


def _time_field(data: Mapping[str, Any], name: str) -> float | None:
    value = data.get(name)
    return None if value is None else _time(value, name)


@dataclass(frozen=True)
class MeasureRequest:
    """What one measure_point call is asked, whole: the arms at one point, the protocol's
    keywords (alpha, seed, served weight bytes, gate...) and the family's implementation hash.
    Two equal requests are the same measurement: one taken ahead of the census (build/
    speculative.py) serves the build's own request equal to it."""

    signature: Signature
    m: int
    config_ids: tuple[str, ...]
    options: tuple[tuple[str, Any], ...]
    impl: str | None = None


@dataclass(frozen=True)
class Region:
    """Serve config_id for every M up to m_hi (inclusive); m_hi None is the catch-all."""

    m_hi: int | None
    config_id: str

    def to_json(self) -> list[Any]:
        return [self.m_hi, self.config_id]


@dataclass(frozen=True)
class Entry:
    """One signature's row in a database file."""

    signature: Signature
    regions: tuple[Region, ...]
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=True, hash=False)
    source: str = "build"
    soft: Mapping[str, str] = field(default_factory=dict, hash=False)
    notes: tuple[str, ...] = ()
    # The winner without optional dependencies (spec 003), for callers that cannot load them;
    # None: the same as `regions`.
    regions_native: tuple[Region, ...] | None = None

    def lookup(self, m: int, native: bool = False) -> str | None:
        """The first region whose m_hi >= m, else the catch-all, else None (native: among the
        dependency-free regions)."""
        regions = self.regions_native if native and self.regions_native is not None else self.regions
        for region in regions:
            if region.m_hi is None or region.m_hi >= m:
                return region.config_id
        return None

    def config_ids(self) -> tuple[str, ...]:
        regions = self.regions + (self.regions_native or ())
        return tuple(dict.fromkeys(r.config_id for r in regions))
