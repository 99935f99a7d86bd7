"""The plan `tunedb tune` prints, condensed: one row per signature, heaviest first.

A text model's census has a point per (signature, M) and M runs over every probed length: a
GPT-2 of two layers gave 870 rows, a real one thousands, which no one reads. Past one screen
(FULL_ROWS points) the plan is grouped by signature: how many points, the M range, the share of
the workload's GEMM time (calls x a roofline estimate of one call: its flops at the arch's peak or
its bytes at its bandwidth, whichever is longer; the call share where a family gives no work),
must-tune points, the tiers and configs that serve it. The TOP_ROWS heaviest are listed and the
rest summed in one line; `--all-points` prints one row per point as before.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

FULL_ROWS = 40  # up to this many points the per-point table is printed (one screen)
TOP_ROWS = 20  # signature rows shown in the condensed table


@dataclass(frozen=True)
class SignatureRow:
    """One signature's points in the plan, summed."""

    signature: Any
    points: int
    m_lo: int
    m_hi: int
    share: float  # of the estimated GEMM time (or of calls) of the whole census
    must: int
    tiers: tuple[tuple[str, int], ...]  # tier -> points, most first
    configs: tuple[tuple[str, int], ...]  # config id -> points, most first


def _seconds(point: Any, profile: Any) -> float | None:
    """calls x the roofline time of one call at point.m, or None where the family has no work."""
    from tunedb import families

    try:
        flops, moved = families.get(point.signature.family).work(point.signature, point.m)
        peak = profile.peak_tflops(point.signature.dt) * 1e12
        return point.calls * max(flops / peak, moved / (profile.dram_bw_gbs * 1e9))
    except Exception:  # an op the family does not key (unserved), an unknown dtype: no estimate
        return None


def grouped(served: Sequence[Any], arch_family: str) -> tuple[list[SignatureRow], str]:
    """Rows per signature, heaviest first, and what their share is of ("time" or "calls")."""
    from tunedb import arch

    try:
        profile = arch.shipped_profile(arch_family)
    except Exception:  # an arch without a shipped profile: shares of calls
        profile = None
    times = [_seconds(s.point, profile) if profile is not None else None for s in served]
    by_time = all(t is not None for t in times) and sum(times) > 0
    weights = times if by_time else [float(s.point.calls or s.point.weight) for s in served]
    total = sum(weights) or 1.0
    groups: dict[Any, list[tuple[Any, float]]] = {}
    for s, w in zip(served, weights):
        groups.setdefault(s.point.signature, []).append((s, w))
    rows = []
    for sig, items in groups.items():
        ms = [s.point.m for s, _ in items]
        rows.append(SignatureRow(sig, len(items), min(ms), max(ms), sum(w for _, w in items) / total,
                                 sum(1 for s, _ in items if s.point.must_tune),
                                 tuple(Counter(s.tier for s, _ in items).most_common()),
                                 tuple(Counter(s.config_id for s, _ in items).most_common())))
    rows.sort(key=lambda r: (-r.share, r.signature.format()))
    return rows, "time" if by_time else "calls"


def _counted(pairs: tuple[tuple[str, int], ...], points: int) -> str:
    if len(pairs) == 1:
        return pairs[0][0]
    return ", ".join(f"{name} {n}" for name, n in pairs[:3]) + (f", +{len(pairs) - 3} more" if len(pairs) > 3 else "")


def print_grouped(console: Any, served: Sequence[Any], arch_family: str) -> None:
    """The condensed plan (see the module docstring), short signature forms where the terminal
    is too narrow for the full keys."""
    from rich import box
    from rich.table import Table

    rows, basis = grouped(served, arch_family)
    shown, rest = rows[:TOP_ROWS], rows[TOP_ROWS:]

    def table(sig_text: Any, compact: bool, fold: bool = False) -> Table:
        t = Table(title=f"what tunedb would serve on {arch_family}: {len(served)} points over {len(rows)} "
                        f"signatures, heaviest first", box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD)
        for col in ("signature", "points", "M", f"{basis} %", "must", "tier", "config"):
            # fold: the terminal is too narrow even for the short keys; the wide text cells take
            # more lines instead of cutting the columns after them
            folds = fold and col in ("signature", "tier", "config")
            t.add_column(col, justify="right" if col in ("points", "M", f"{basis} %", "must") else "left",
                         no_wrap=not folds, overflow="fold" if folds else "ellipsis", min_width=8 if folds else None)
        for r in shown:
            m = str(r.m_lo) if r.m_lo == r.m_hi else f"{r.m_lo}-{r.m_hi}"
            t.add_row(sig_text(r.signature), str(r.points), m, f"{100 * r.share:.1f}", str(r.must) if r.must else "",
                      _counted(r.tiers, r.points), _counted(r.configs, r.points))
        return t

    print_keyed(console, table, {r.signature for r in shown})
    if rest:
        console.print(f"... and {len(rest)} more signature(s) with {sum(r.points for r in rest)} point(s), "
                      f"{100 * sum(r.share for r in rest):.1f}% of the {basis}", highlight=False, markup=False)
    what = ("the share of the census's estimated time: calls x one call's roofline time on this arch (its "
            "flops at the peak or its bytes at the bandwidth, the longer)") if basis == "time" else \
        "the share of the census's calls"
    console.print(f"{basis} % = {what}. One row per point: --all-points", highlight=False, markup=False)


def print_keyed(console: Any, table: Any, sigs: Any) -> None:
    """A table of signature rows, `table(sig_text, compact, fold=False)`: with the full keys where
    they fit the terminal, else the short forms (folded if even those do not) and their legend."""
    from tunedb import signature_text

    full = table(lambda sig: sig.format(), compact=False)
    compact = not signature_text.fits(console, full)
    shown = table(signature_text.short, compact=True) if compact else full
    if compact and not signature_text.fits(console, shown):
        shown = table(signature_text.short, compact=True, fold=True)
    print_fitting(console, shown)
    if compact:
        console.print(signature_text.legend(sigs), highlight=False)


def print_fitting(console: Any, table: Any) -> None:
    """`table`, or where even its folded cells leave it wider than the terminal (40 columns), its
    rows one after another as `column=value` lines, which wrap: rich would otherwise cut the last
    columns to a letter (the config a point is served)."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(10_000)  # a table clamps its measure to the width given
    if Measurement.get(console, unbounded, table).minimum <= console.width:
        console.print(table)
        return
    if table.title:
        console.print(str(table.title), highlight=False, markup=False)
    columns = table.columns
    cells = [[str(c) for c in col.cells] for col in columns]
    for i in range(table.row_count):
        console.print("- " + "  ".join(f"{str(col.header).replace(' ', '')}={cells[j][i]}" for j, col in enumerate(columns) if cells[j][i]),
                      highlight=False, markup=False)
