"""Writing a matplotlib figure to the path a user names: in the format its suffix names (png, pdf,
svg; no suffix: png), rendered whole in memory and then written in one atomic replace."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tunedb.errors import OutputFileError

FORMATS = ("png", "pdf", "svg")


def figure_format(path: Any) -> str:
    """The format `path`'s suffix names, or OutputFileError naming the suffix and the formats."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if not suffix:
        return "png"
    if suffix not in FORMATS:
        raise OutputFileError(f"figure {path}: suffix '.{suffix}' names no format tunedb writes; "
                              f"use one of {', '.join('.' + f for f in FORMATS)}")
    return suffix


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files, no display), or OutputFileError saying how to get
    it (a declared dependency, but an environment may lack it: the command printed a traceback)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise OutputFileError(f"a figure needs matplotlib, which does not import here ({exc}); "
                              f"pip install matplotlib") from None
    return plt


def save(fig: Any, path: Any, dpi: int) -> None:
    """fig written to `path` (figure_format's format), the figure closed."""
    plt = pyplot()
    from tunedb.database import write_atomic

    fmt = figure_format(path)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, dpi=dpi)
    finally:
        plt.close(fig)
    write_atomic(Path(path), buf.getvalue())
