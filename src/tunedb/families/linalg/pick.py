"""Spec 003's pick rule for one linalg cell (op, dtype, n, batch), through the contract's PickRule.

    1. Dependency-free ("native") arms: the fastest time t*; every native arm within the tie band
       (t <= t* x (1 + tie_band)) ties, and the simplest of them takes the cell: the library arm,
       then thread, then warp, then block; within a packing fewer warps, then fewer problems per
       program (configs.simplicity: a total order, so noise never decides between tied arms).
       The library arm is the fallback: it keeps any cell it ties (min_speedup 1.0: no gate
       beyond the band) and takes a cell no native arm measured.
    2. An arm that needs an optional dependency takes the cell only when the fastest native arm
       is more than dep_margin slower (t* > t_dep x (1 + dep_margin)).
    Each cell keeps both winners: `winner` (all arms) and `native` (no optional dependency).
Because a tie goes to the simpler arm, a re-run whose noise stays inside the band reproduces the
cell. Failed or unmeasured arms (None, non-finite, non-positive times) cannot win.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from tunedb.families.contract import PickRule
from tunedb.families.linalg import configs

TIE_BAND = 0.02
DEP_MARGIN = 0.05

LINALG_RULE = PickRule(fallback=configs.LIBRARY, min_speedup=1.0, tie_band=TIE_BAND, dep_margin=DEP_MARGIN,
                       simplicity=configs.simplicity, dependency=configs.dependency)


@dataclass(frozen=True)
class CellPick:
    """One cell's decision: the full winner, the native winner, and why."""

    winner: str
    native: str
    reason: str


def decide(times: Mapping[str, float | None], rule: PickRule = LINALG_RULE) -> CellPick:
    """The cell's pick from each arm's time (any unit, lower is better)."""
    ok = {a: float(t) for a, t in times.items() if t is not None and math.isfinite(t) and t > 0}
    native = {a: t for a, t in ok.items() if rule.is_native(a)}
    if not native:
        return CellPick(rule.fallback, rule.fallback, "no native arm measured ok: the fallback serves")
    got = rule.pick(ok)
    best = min(native.values())
    why = (f"{got.native}: {native[got.native]:.4g} vs fastest native {best:.4g} "
           f"(tie band {rule.tie_band:.0%}, simplest wins)")
    if got.winner != got.native:
        why = (f"{got.winner} ({rule.dependency(got.winner)}) beats the fastest native arm by "
               f"{best / ok[got.winner]:.3f}x > {1 + rule.dep_margin:.2f}x; native: {why}")
    return CellPick(got.winner, got.native, why)
