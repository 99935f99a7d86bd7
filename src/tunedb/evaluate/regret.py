"""Regret of each selector against the measured oracle, and the figures that show it.

The oracle at a point (signature, M) is the best ok arm measured there in the logs given; a
selector's regret is objective(its pick) / objective(best) - 1, the objective being GPU time +
alpha * host issue time (alpha: the point's eager share from the census, else 0). A pick that
was never measured at a point is counted as unmeasured for that selector, never given a number.
Selectors are plain callables (signature, M) -> config id, so this module stays pure: the
pipeline builds them from database files, the cost model and the family. matplotlib and rich
are imported only by the functions that draw.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from tunedb.records import Measurement, Region, Signature

Selector = Callable[[Signature, int], "str | None"]
# The ids that run the same kernel as `config_id` at `sig` (the sentinel 'default' and the
# family's concrete default config, say); the first one measured is used.
Equivalents = Callable[[Signature, str], Sequence[str]]
PointKey = tuple[Signature, int]


@dataclass(frozen=True)
class Pick:
    config_id: str | None  # None: the selector made no pick
    measured_as: str | None  # the id whose measurement was used (an equivalent of config_id)
    regret: float | None  # None: unmeasured


@dataclass(frozen=True)
class PointResult:
    signature: Signature
    m: int
    weight: float
    best_id: str
    best: float  # the oracle's objective, ms
    picks: Mapping[str, Pick]


@dataclass(frozen=True)
class Summary:
    """One selector over every point: regrets as fractions (0.05 = 5% slower than the oracle)."""

    name: str
    measured: int
    unmeasured: int
    geomean: float | None
    weighted: float | None
    p95: float | None
    max: float | None
    per_signature: tuple[tuple[str, float, int], ...]  # (signature, geomean regret, points), worst first

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "measured": self.measured, "unmeasured": self.unmeasured,
                "geomean": self.geomean, "weighted_geomean": self.weighted, "p95": self.p95,
                "max": self.max,
                "per_signature": [{"signature": s, "geomean": g, "points": n}
                                  for s, g, n in self.per_signature]}


@dataclass(frozen=True)
class Evaluation:
    points: tuple[PointResult, ...]
    summaries: tuple[Summary, ...]

    def summary(self, name: str) -> Summary:
        for s in self.summaries:
            if s.name == name:
                return s
        raise KeyError(f"no selector {name!r}; evaluated: {', '.join(s.name for s in self.summaries)}")

    def to_json(self) -> dict[str, Any]:
        return {
            "selectors": [s.to_json() for s in self.summaries],
            "points": [{"signature": p.signature.format(), "M": p.m, "weight": p.weight,
                        "best": p.best_id, "best_ms": p.best,
                        "picks": {n: {"config": k.config_id, "measured_as": k.measured_as,
                                      "regret": k.regret} for n, k in p.picks.items()}}
                       for p in self.points],
        }


def latest(measurements: Iterable[Measurement]) -> dict[tuple[Signature, int, str], Measurement]:
    """One measurement per (signature, M, config): the last ok one given (logs append in order),
    else the last one. As in the build's partition, a failed re-measurement does not hide an ok
    measurement of the same arm."""
    out: dict[tuple[Signature, int, str], Measurement] = {}
    for meas in measurements:
        key = (meas.signature, meas.m, meas.config_id)
        if meas.status.ok or key not in out or not out[key].status.ok:
            out[key] = meas
    return out


def carry_weights(weights: Mapping[tuple[Signature, int], float],
                  measured: Iterable[tuple[Signature, int]]) -> dict[tuple[Signature, int], float]:
    """Census weights on the measured points: an unmeasured census point's weight moves to the
    next measured M above it (the point whose region serves it, as --thin does); above the
    largest measured M it has no measured stand-in and is left out."""
    by_sig: dict[Signature, list[int]] = {}
    for sig, m in set(measured):
        by_sig.setdefault(sig, []).append(m)
    for ms in by_sig.values():
        ms.sort()
    out: dict[tuple[Signature, int], float] = {}
    for (sig, m), w in weights.items():
        ms = by_sig.get(sig, [])
        i = bisect.bisect_left(ms, m)
        if i < len(ms):
            out[(sig, ms[i])] = out.get((sig, ms[i]), 0.0) + w
    return out


def _geomean(regrets: Sequence[float], weights: Sequence[float] | None = None) -> float | None:
    if not regrets:
        return None
    ws = list(weights) if weights is not None else [1.0] * len(regrets)
    total = sum(ws)
    if total <= 0:
        return None
    return math.exp(sum(w * math.log1p(r) for r, w in zip(regrets, ws)) / total) - 1.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]): the smallest value with q% of values at or below it."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(s)))
    return s[rank - 1]


def evaluate(measurements: Iterable[Measurement], selectors: Mapping[str, Selector], *,
             weights: Mapping[PointKey, float] | None = None,
             alphas: Mapping[PointKey, float] | None = None,
             equivalents: Equivalents | None = None,
             points: Iterable[PointKey] | None = None, worst: int = 5) -> Evaluation:
    """Score every selector at every point that has an ok measurement (or at `points`, those of
    them that have one). weights: census weights per point (absent: 0 in the weighted geomean;
    no mapping at all: uniform). alphas: eager share per point (absent: 0)."""
    table: dict[PointKey, dict[str, float]] = {}
    for (sig, m, cid), meas in latest(measurements).items():
        value = meas.objective((alphas or {}).get((sig, m), 0.0))
        if value is not None and value > 0:
            table.setdefault((sig, m), {})[cid] = value
    keys = sorted(table) if points is None else sorted(k for k in set(points) if k in table)
    results: list[PointResult] = []
    for sig, m in keys:
        arms = table[(sig, m)]
        best_id = min(arms, key=lambda c: (arms[c], c))
        best = arms[best_id]
        picks = {}
        for name, select in selectors.items():
            cid = select(sig, m)
            measured_as = None
            if cid is not None:
                for alias in (cid, *(equivalents(sig, cid) if equivalents else ())):
                    if alias in arms:
                        measured_as = alias
                        break
            regret = arms[measured_as] / best - 1.0 if measured_as is not None else None
            picks[name] = Pick(cid, measured_as, regret)
        w = 1.0 if weights is None else float(weights.get((sig, m), 0.0))
        results.append(PointResult(sig, m, w, best_id, best, picks))
    summaries = tuple(_summarize(name, results, worst) for name in selectors)
    return Evaluation(tuple(results), summaries)


def _summarize(name: str, results: Sequence[PointResult], worst: int) -> Summary:
    scored = [(p, p.picks[name].regret) for p in results if p.picks[name].regret is not None]
    regrets = [r for _, r in scored]
    by_sig: dict[str, list[float]] = {}
    for p, r in scored:
        by_sig.setdefault(p.signature.format(), []).append(r)
    per_sig = sorted(((s, _geomean(rs) or 0.0, len(rs)) for s, rs in by_sig.items()),
                     key=lambda x: (-x[1], x[0]))
    return Summary(
        name=name, measured=len(scored), unmeasured=len(results) - len(scored),
        geomean=_geomean(regrets), weighted=_geomean(regrets, [p.weight for p, _ in scored]),
        p95=percentile(regrets, 95.0), max=max(regrets) if regrets else None,
        per_signature=tuple(per_sig[:worst] if worst else per_sig),
    )


# ---------------------------------------------------------------- presentation

def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}%"


def render_table(ev: Evaluation, console: Any = None) -> None:
    """The rich table of every selector, then each selector's worst signatures."""
    from rich.console import Console

    from tunedb import signature_text

    console = console or Console()
    full = _regret_table(ev, lambda sig: sig, worst_column=True)
    if signature_text.fits(console, full):
        console.print(full)
    else:  # narrow terminal: the worst signatures below the table, short, never cut
        console.print(_regret_table(ev, signature_text.short, worst_column=False))
        for s in ev.summaries:
            if s.per_signature:
                console.print(f"worst for {s.name}: {signature_text.short(s.per_signature[0][0])} "
                              f"({_pct(s.per_signature[0][1])})", highlight=False)
        console.print(signature_text.legend({p.signature for p in ev.points}), highlight=False)
    for s in ev.summaries:
        if s.unmeasured:
            console.print(f"{s.name}: {s.unmeasured} point(s) where its pick was not measured "
                          f"(not counted; measure them, e.g. with `tunedb build --exhaustive`)")


def _regret_table(ev: Evaluation, sig_text: Callable[[str], str], worst_column: bool) -> Any:
    from rich.table import Table

    table = Table(title=f"regret against the measured oracle ({len(ev.points)} points)")
    cols = ("selector", "measured", "unmeasured", "geomean", "weighted", "p95", "max")
    for col in cols + (("worst signature",) if worst_column else ()):
        table.add_column(col, justify="left" if col in ("selector", "worst signature") else "right",
                         no_wrap=col == "worst signature")
    for s in ev.summaries:
        worst = f"{sig_text(s.per_signature[0][0])} ({_pct(s.per_signature[0][1])})" if s.per_signature else "-"
        table.add_row(s.name, str(s.measured), str(s.unmeasured), _pct(s.geomean), _pct(s.weighted),
                      _pct(s.p95), _pct(s.max), *((worst,) if worst_column else ()))
    return table


def size_axis(rows: Sequence[str]) -> str:
    """The size axis the rows' signatures share (M for GEMM, batch for linalg); M when they are
    not signatures or their families' axes differ."""
    from tunedb import families
    from tunedb.errors import SignatureError

    axes = set()
    for row in rows:
        try:
            sig = Signature.parse(row)
        except (SignatureError, ValueError):
            return "M"
        axes.add(families.get(sig.family).schema.size if sig.family in families.names() else "M")
    return axes.pop() if len(axes) == 1 else "M"


def draw_regions(ax: Any, regions: Mapping[str, Sequence[Region]], m_max: Mapping[str, int] | None = None,
                 title: str | None = None) -> None:
    """One horizontal bar per row label, split into its regions along a log M axis; each config
    gets one colour across rows. The catch-all ends at m_max[row] x 2 (or twice the last edge)."""
    import matplotlib.pyplot as plt

    rows = list(regions)
    ids = sorted({r.config_id for rs in regions.values() for r in rs})
    cmap = plt.get_cmap("tab20")
    colour = {cid: cmap(i % 20) for i, cid in enumerate(ids)}
    # past 20 configs the colours repeat: a hatch tells the repeats apart (the linalg table has 40+)
    hatch = {cid: ("", "///", "...", "xxx", "\\\\\\")[(i // 20) % 5] for i, cid in enumerate(ids)}
    seen: set[str] = set()
    for y, row in enumerate(rows):
        lo = 1.0
        finite = [r.m_hi for r in regions[row] if r.m_hi is not None]
        top = max([*finite, (m_max or {}).get(row, 1), 1]) * 2.0
        for r in regions[row]:
            hi = float(r.m_hi) if r.m_hi is not None else top
            label = r.config_id if r.config_id not in seen else None
            seen.add(r.config_id)
            ax.barh(y, hi - lo, left=lo, color=colour[r.config_id], edgecolor="black", linewidth=0.4,
                    label=label, hatch=hatch[r.config_id])
            lo = hi
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=6)
    axis = size_axis(rows)
    ax.set_xlabel(axis)
    ax.set_title(title or f"regions along {axis}")
    if ids:
        ax.legend(fontsize=5, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def draw_regret(ax: Any, ev: Evaluation) -> None:
    """Per signature, each selector's geomean regret (points with a measured pick), log scale."""
    sigs = sorted({p.signature.format() for p in ev.points})
    names = [s.name for s in ev.summaries]
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        ys = []
        for sig in sigs:
            rs = [p.picks[name].regret for p in ev.points
                  if p.signature.format() == sig and p.picks[name].regret is not None]
            g = _geomean(rs)
            ys.append(100.0 * g if g is not None else float("nan"))
        ax.bar([x + i * width for x in range(len(sigs))], [max(y, 0.01) for y in ys], width, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("geomean regret, % (log)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(sigs))])
    ax.set_xticklabels(sigs, rotation=60, ha="right", fontsize=5)
    ax.set_title("regret per signature against the measured oracle")
    ax.legend(fontsize=6)


FIGURE_FORMATS = (".png", ".pdf", ".svg")


def check_figure_path(flag: str, path: str) -> None:
    """EvaluationError unless `path` names a figure format matplotlib writes by its suffix and
    does not name a directory: checked before any work, so a typo costs nothing."""
    from pathlib import Path

    from tunedb.errors import EvaluationError

    if Path(path).suffix.lower() not in FIGURE_FORMATS:
        raise EvaluationError(f"{flag} {path}: the figure is written as {', '.join(FIGURE_FORMATS)} "
                              "(chosen by the file's suffix)")
    if Path(path).is_dir():
        raise EvaluationError(f"{flag} {path} is a directory; name the figure's file")
    from tunedb.out_paths import why_unwritable

    why = why_unwritable(path)  # a read-only place failed only after the whole evaluation printed
    if why is not None:
        raise EvaluationError(f"{flag} {path}: {why}; write the figure elsewhere")


def save_figure(path: str, ev: Evaluation | None, regions: Mapping[str, Sequence[Region]],
                m_max: Mapping[str, int] | None = None) -> None:
    """A PNG: the regret panel (when `ev` is given) above the regions panel (when any)."""
    from tunedb.figures import pyplot

    plt = pyplot()

    panels = (1 if ev is not None else 0) + (1 if regions else 0)
    if panels == 0:
        raise ValueError("nothing to draw: no evaluation and no regions")
    rows_h = [4.0] * (1 if ev is not None else 0) + ([max(2.0, 0.25 * len(regions))] if regions else [])
    fig, axes = plt.subplots(panels, 1, figsize=(11, sum(rows_h) + 1.5),
                             gridspec_kw={"height_ratios": rows_h}, squeeze=False)
    i = 0
    if ev is not None:
        draw_regret(axes[i][0], ev)
        i += 1
    if regions:
        draw_regions(axes[i][0], regions, m_max)
    fig.tight_layout()
    from tunedb import figures

    figures.save(fig, path, dpi=130)  # the suffix's format, the whole figure, one atomic replace
