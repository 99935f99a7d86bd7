"""Hysteresis for a re-tune: the arms a table already serves keep their cells while they still tie.

A cell's pick is the simplest arm inside a tie band around the fastest (pick.py), and any band has
an edge: an arm 0.1-1.2 points past it in one process and inside it in the next moves the cell
(issue 19's re-measurements, s25-s26: every served move between two whole-grid tunes was such an
edge tie; docs/linalg_agreement.md). A re-tune against the table in use (`tunedb linalg tune
--keep FILE`) therefore lets the incumbent keep a cell unless the new pick beats it by more than
one more band: an arm enters a cell by the rule of pick.py and leaves it only when something is
clearly faster. The price is bounded: a kept arm is within the band of the new pick, which is
within the band of the fastest. Pure Python.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from tunedb.families.linalg import pick


def keep_incumbent(got: pick.CellPick, times: Mapping[str, float | None], batch: int,
                   incumbent: tuple[str, str] | None, rule: object = pick.LINALG_RULE,
                   jitter_ns: float = pick.LAUNCH_JITTER_NS) -> pick.CellPick:
    """`got` (a cell's pick from `times`, ns a problem, the statistic the pick compared) with the
    incumbent's (winner, native) arms kept where each is measured ok here and no more than one
    band slower than the arm that would replace it: the cell's noise band (pick.cell_band)
    between dependency-free arms, the optional tiers' own band (rule.dep_tie_band) where either
    needs a dependency."""
    if incumbent is None:
        return got
    ok = {a: float(t) for a, t in times.items() if t is not None and math.isfinite(t) and t > 0}
    band = pick.cell_band(ok, batch, rule, jitter_ns)
    inc_winner, inc_native = incumbent
    native = got.native
    if (inc_native != native and inc_native in ok and native in ok and rule.is_native(inc_native)
            and ok[inc_native] <= ok[native] * (1.0 + band)):
        native = inc_native
    winner = native if got.winner == got.native else got.winner
    if inc_winner != winner and inc_winner in ok and winner in ok:
        both_native = rule.is_native(inc_winner) and rule.is_native(winner)
        margin = band if both_native else max(rule.dep_tie_band or rule.dep_margin, band)
        # a dependency-free incumbent serves as the native pick too: only where it keeps that
        consistent = not rule.is_native(inc_winner) or inc_winner == native
        if consistent and ok[inc_winner] <= ok[winner] * (1.0 + margin):
            winner = inc_winner
    if (winner, native) == (got.winner, got.native):
        return got
    return replace(got, winner=winner, native=native,
                   reason=f"kept the table's {winner}" + (f" / native {native}" if native != winner else "")
                          + f" (within one band of the new pick {got.winner}); new pick: {got.reason}")


def incumbents(entries: Mapping[object, object]) -> dict[tuple[str, str, int, int], tuple[str, str]]:
    """(op, dt, n, batch) -> (served winner, native winner) of every cell a table's entries
    measured (its evidence points): what `--keep FILE` lets keep its cells."""
    from tunedb.families.linalg.table import old_cells

    return {(sig.op, sig.dt, int(sig.get("n")), batch): (winner, native)
            for sig, entry in entries.items() for batch, (winner, native, _point) in old_cells(entry).items()}
