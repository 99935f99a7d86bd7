"""Persist: the fitted decision, with the capture it came from, in the user's configuration.

One JSON file, `<cache root>/cutoff/decisions.json` (the cache root is TUNEDB_CACHE_DIR, else
~/.cache/tunedb; see settings.py), written whole and atomically. It maps "<problem>@<device>" to
a decision: the cutoff, the switch rule (which policy below, which above), the band, the
statistic and tolerance it was fitted for, the fit's numbers, and the probe's provenance (UTC,
git commit, GPU name/UUID/driver, CUDA/torch/Triton/tunedb versions). Re-measuring a problem
class on a GPU replaces its one entry and keeps the others. `solve(..., linsys="auto")` reads
the entry of its problem class on the current device (memoized per file modification time).
"""
from __future__ import annotations

import functools
import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tunedb.database.schema import no_duplicate_keys
from tunedb.input_files import read_text
from tunedb.errors import CutoffError

FORMAT = "tunedb-cutoff-decisions"
VERSION = 1


@dataclass(frozen=True)
class Decision:
    problem: str
    device: str
    cutoff: float
    below: str = "iterative"
    above: str = "direct"
    statistic: str = "p99"
    tolerance: float = 0.02
    band: tuple[float, float] = (float("nan"), float("nan"))
    fit: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # one built by hand is checked as one read from a file: a misspelt policy or a NaN cutoff
        # was found only by the solve applying it (named wrong there), or never (NaN: always `above`)
        self._check()

    def policy_for(self, signal: float) -> str:
        """The policy of one solve: `below` at or under the cutoff, `above` past it."""
        return self.below if signal <= self.cutoff else self.above

    def to_json(self) -> dict[str, Any]:
        from tunedb.cutoff.fitting import json_floats  # an open band's edge as "inf": standard JSON

        return json_floats({"problem": self.problem, "device": self.device, "cutoff": self.cutoff,
                            "below": self.below, "above": self.above, "statistic": self.statistic,
                            "tolerance": self.tolerance, "band": list(self.band), "fit": dict(self.fit),
                            "provenance": dict(self.provenance)})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Decision":
        if not isinstance(data, Mapping):
            raise CutoffError(f"malformed decision {data!r}: a JSON object expected")
        try:
            made = cls(str(data["problem"]), str(data["device"]), float(data["cutoff"]),
                       str(data["below"]), str(data["above"]), str(data["statistic"]),
                       float(data["tolerance"]), tuple(float(v) for v in data["band"]),
                       dict(data.get("fit", {})), {k: str(v) for k, v in dict(data.get("provenance", {})).items()})
        except CutoffError:  # the check's own words (a CutoffError is a ValueError too)
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise CutoffError(f"malformed decision {dict(data)!r}: {type(exc).__name__}: {exc}") from exc
        return made

    def _check(self) -> None:
        """CutoffError naming a value no fit writes (read from a file someone edited): found at
        load, not as a confusing error of the solve that applies it."""
        from tunedb.cutoff.fitting import STATISTICS
        from tunedb.cutoff.solvers import POLICIES

        what = f"decision {key(self.problem, self.device)!r}"
        for name in ("below", "above"):
            if getattr(self, name) not in POLICIES:
                raise CutoffError(f"{what}: {name}={getattr(self, name)!r}; allowed: {', '.join(POLICIES)}")
        if self.statistic not in STATISTICS:
            raise CutoffError(f"{what}: statistic={self.statistic!r}; allowed: {', '.join(STATISTICS)}")
        for name in ("problem", "device"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise CutoffError(f"{what}: {name}={getattr(self, name)!r}; a non-empty string is needed")
        if not _real(self.cutoff) or math.isnan(self.cutoff):
            raise CutoffError(f"{what}: cutoff={self.cutoff!r}; a number (not NaN) is needed")
        if not (_real(self.tolerance) and math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise CutoffError(f"{what}: tolerance={self.tolerance!r}; a finite number >= 0 is needed")


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def config_path() -> Path:
    from tunedb import settings

    return settings.cache_root() / "cutoff" / "decisions.json"


def key(problem: str, device: str) -> str:
    return f"{problem}@{device}"


def problem_class(strip: Any) -> str:
    """The default problem class of a strip: dtype, n, T and batch."""
    batch, steps, n, _ = strip.shape
    dt = {"torch.float32": "fp32", "torch.float64": "fp64"}.get(str(strip.dtype), str(strip.dtype))
    return f"btd|dt={dt}|n={n}|T={steps}|batch={batch}"


@functools.lru_cache(maxsize=16)
def _device_name(kind: str, index: int | None) -> str:
    if kind != "cuda":
        return kind
    import torch

    return torch.cuda.get_device_name(index)


def device_name(device: Any) -> str:
    """"cpu", or the GPU's name ("NVIDIA H200"): decisions are per GPU model."""
    import torch

    d = torch.device(device)
    return _device_name(d.type, d.index)


def load(path: str | Path | None = None) -> dict[str, Decision]:
    """Every decision in the file ({} when it does not exist)."""
    path = Path(path) if path is not None else config_path()
    if not path.exists():
        return {}
    try:
        data = json.loads(read_text(path), object_pairs_hook=no_duplicate_keys)
    except (OSError, ValueError) as exc:
        raise CutoffError(f"cannot read cutoff decisions {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CutoffError(f"{path} is not a cutoff decision file (format {FORMAT!r} expected)")
    if data.get("version") != VERSION:
        # a newer tunedb's file: refused, so that persist() never rewrites (and drops) what it cannot read
        raise CutoffError(f"{path} is a cutoff decision file of version {data.get('version')!r}; this tunedb "
                          f"reads version {VERSION} (the file is left as it is)")
    decisions = data.get("decisions", {})
    if not isinstance(decisions, dict):
        raise CutoffError(f"{path}: 'decisions' must be an object of problem@device -> decision, "
                          f"got {type(decisions).__name__}")
    out = {}
    for k, v in decisions.items():
        try:
            out[k] = Decision.from_json(v)
        except CutoffError as exc:
            raise CutoffError(f"{path}: {exc}") from None
    return out


_memo: dict[tuple[str, int], dict[str, Decision]] = {}


def lookup(problem: str, device: str, path: str | Path | None = None) -> Decision:
    """The persisted decision of one problem class on one device; CutoffError when none."""
    p = Path(path) if path is not None else config_path()
    try:
        stamp = p.stat().st_mtime_ns
    except OSError:
        stamp = -1
    table = _memo.get((str(p), stamp))
    if table is None:
        table = load(p)
        _memo.clear()
        _memo[(str(p), stamp)] = table
    got = table.get(key(problem, device))
    if got is None:
        raise CutoffError(f"no cutoff for problem {problem!r} on {device!r} in {p} (have: "
                          f"{sorted(table) or 'none'}); run `tunedb cutoff probe --persist` for it")
    return got


def persist(fit: Any, probe: Any, *, path: str | Path | None = None) -> Decision:
    """Write the fit of `probe` as the decision of its problem class on its device (atomically,
    keeping every other entry); returns the decision."""
    from tunedb.database.store import write_atomic

    p = Path(path) if path is not None else config_path()
    for name, value, wants in (("fit", fit, "cutoff"), ("probe", probe, "problem")):
        if not hasattr(value, wants):  # was an AttributeError from inside
            raise CutoffError(f"persist's {name}={value!r} is not a {'Fit (tunedb.cutoff.fit)' if name == 'fit' else 'Probe (tunedb.cutoff.probe / Probe.load)'}")
    decision = Decision(probe.problem, probe.device, fit.cutoff, fit.below, fit.above, fit.statistic,
                        fit.tolerance, tuple(fit.band), fit.to_json(),
                        {**dict(probe.provenance), "timer": probe.timer,
                         "contended_by": ",".join(str(x) for x in probe.contended_by)})
    table = load(p)
    table[key(decision.problem, decision.device)] = decision
    doc = {"format": FORMAT, "version": VERSION, "decisions": {k: d.to_json() for k, d in sorted(table.items())}}
    write_atomic(p, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return decision
