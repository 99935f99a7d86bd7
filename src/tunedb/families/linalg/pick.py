"""Spec 003's pick rule for one cell (op, dtype, n, batch): a pure function of measured times.

    1. Dependency-free ("native") arms: the fastest time t*; every native arm within the tie band
       (t <= t* x (1 + tie_band)) is a contender, and the simplest contender takes the cell
       (library arm, then thread, then warp, then block; within a packing fewer warps, then
       fewer problems per program; then the id: never the noise). The library arm is the
       fallback: it keeps any cell it ties, and takes a cell nobody else could.
    2. An arm that needs an optional dependency takes the cell only when it beats the fastest
       native arm by more than dep_margin (t* / t_dep > 1 + dep_margin); among such arms the
       same tie-band rule picks.
    The cell keeps both: `winner` (all arms) and `native` (no optional dependency).

Margins are the PickRule's (tunedb.families.contract when it is there; LINALG_RULE otherwise).
Because a tie goes to the simpler arm, a re-run whose noise stays inside the band reproduces the
cell: the rule never chases sub-noise differences.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tunedb.families.linalg import configs

TIE_BAND = 0.02
DEP_MARGIN = 0.05


@dataclass(frozen=True)
class CellRule:
    """The margins and orders of the cell decision (the contract's PickRule fields)."""

    fallback: str = configs.LIBRARY
    tie_band: float = TIE_BAND
    dep_margin: float = DEP_MARGIN
    simplicity: Callable[[str], int] = configs.simplicity
    dependency: Callable[[str], "str | None"] = configs.dependency

    def __post_init__(self) -> None:
        for name in ("tie_band", "dep_margin"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name}={value!r} must be a fraction in [0, 1), e.g. 0.02 for 2%")


LINALG_RULE = CellRule()


@dataclass(frozen=True)
class CellPick:
    """One cell's decision: the full winner, the native winner, and why."""

    winner: str
    native: str
    reason: str


def _band_pick(times: Mapping[str, float], rule: Any) -> str:
    best = min(times.values())
    band = [a for a, t in times.items() if t <= best * (1.0 + rule.tie_band)]
    return min(band, key=lambda a: (rule.simplicity(a), a))


def decide(times: Mapping[str, float | None], rule: Any = LINALG_RULE) -> CellPick:
    """The cell's pick from each arm's time (any unit; None or a non-positive/non-finite time:
    the arm failed or was not measured and cannot win). With no usable native arm the fallback
    takes the cell."""
    ok = {a: float(t) for a, t in times.items()
          if t is not None and t == t and 0.0 < float(t) < float("inf")}
    native = {a: t for a, t in ok.items() if rule.dependency(a) is None}
    deps = {a: t for a, t in ok.items() if rule.dependency(a) is not None}
    if not native:
        return CellPick(rule.fallback, rule.fallback, "no native arm measured ok: the fallback serves")
    nat = _band_pick(native, rule)
    best = min(native.values())
    why = f"{nat}: {native[nat]:.4g} vs fastest native {best:.4g} (tie band {rule.tie_band:.0%})"
    if deps:
        dep = _band_pick(deps, rule)
        if best / deps[dep] > 1.0 + rule.dep_margin:
            return CellPick(dep, nat, f"{dep} ({rule.dependency(dep)}) beats the fastest native arm "
                                      f"by {best / deps[dep]:.3f}x > {1 + rule.dep_margin:.2f}x; "
                                      f"native: {why}")
        why += f"; {dep} ({rule.dependency(dep)}) only {best / deps[dep]:.3f}x, not beyond {rule.dep_margin:.0%}"
    return CellPick(nat, nat, why)
