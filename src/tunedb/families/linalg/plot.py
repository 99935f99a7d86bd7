"""`tunedb linalg plot`: the winner of every cell (ops x n x batch), one panel per dtype.

Each cell is `recommend()`'s plan: its colour is the packing (library, thread, warp, block, lane, ...), its
text the arm, and a cell the table did not measure (the heuristic's) is drawn pale and marked
with "h". matplotlib is imported only here.
"""
from __future__ import annotations

from pathlib import Path

from tunedb.families.linalg import ladder, signatures

COLOURS = {"library": "#9e9e9e", "thread": "#4caf50", "warp": "#2196f3", "block": "#ff9800", "lane": "#9c27b0", "reg": "#e91e63", "rows": "#00bcd4", "shfl": "#795548", "panel": "#cddc39", "pdot": "#8bc34a", "pdottf": "#009688", "nvmath": "#607d8b", "cuda": "#3f51b5"}


def _label(arm: str) -> str:
    return arm.replace("thread_", "t").replace("warp_", "w").replace("block_", "b").replace("lane_", "l").replace("reg_", "r").replace(
        "pdottf_", "pt").replace("pdot_", "pd").replace("panel_", "pa").replace("nvmath_", "nv").replace("cuda_", "cu")


def draw(path: Path, deps: str = "native", arch: str = "sm90") -> tuple[int, int]:
    """Write the PNG; returns (cells drawn, cells measured)."""
    from tunedb.figures import pyplot

    plt = pyplot()
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    from tunedb.families.linalg.plan import recommend

    dtypes = ladder.GRID_DTYPES
    rows = [(op, b) for op in signatures.OPS for b in ladder.GRID_BATCH]
    ns = ladder.GRID_N
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5.2 * len(dtypes), 0.38 * len(rows) + 1.6), squeeze=False)
    total = measured = 0
    for ax, dt in zip(axes[0], dtypes):
        for r, (op, batch) in enumerate(rows):
            for c, n in enumerate(ns):
                plan = recommend(op, dt, n, batch, deps=deps, arch=arch)
                total += 1
                measured += plan.source == "measured"
                alpha = 1.0 if plan.source == "measured" else 0.35
                ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=to_rgba(COLOURS[plan.packing], alpha),
                                           edgecolor="white"))
                text = _label(plan.arm) + ("" if plan.source == "measured" else " h")
                ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=6)
        ax.set_xlim(0, len(ns))
        ax.set_ylim(len(rows), 0)
        ax.set_xticks([c + 0.5 for c in range(len(ns))], [str(n) for n in ns])
        ax.set_yticks([r + 0.5 for r in range(len(rows))], [f"{op} b={b}" for op, b in rows], fontsize=7)
        ax.set_xlabel("n")
        ax.set_title(f"{dt} (deps={deps}, {arch})")
    handles = [Patch(color=col, label=name) for name, col in COLOURS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    from tunedb import figures

    figures.save(fig, path, dpi=120)  # the suffix's format, the whole figure, one atomic replace
    return total, measured
