"""Short forms of signatures for tables on narrow terminals, and the legend that explains them.

A full key (`gemm|op=gemm_act|dt=half|N=2048|K=512|act=gelu|bias=1`) is 50 characters; in an
80-column table it wraps or is cut. The short form keeps every field that tells two keys of one
table apart: `2048x512 gelu+b` (N x K, the activation, +b for a bias), `512x512` for a plain GEMM,
`bmm 8x64x1500` (B x N x K), and `:bf16` / `:fp16` when the dtype is not the generic `half`.
Keys of other families fall back to their fields without the family and op names.
"""
from __future__ import annotations

from typing import Any

from tunedb.records import Signature

# Two lines of at most 80 characters each.
LEGEND = ("signature: NxK = op=gemm, N outputs, K inputs; NxK ACT[+b] = op=gemm_act\n"
          "(activation, +b: with bias); bmm BxNxK = op=bmm; :bf16/:fp16 = dtype (else half)")


def short(sig: Signature | str) -> str:
    """The short form of one signature (see the module docstring)."""
    if isinstance(sig, str):
        try:
            sig = Signature.parse(sig)
        except ValueError:
            return sig
    dt = "" if sig.dt == "half" else f":{sig.dt}"
    n, k = sig.get("N"), sig.get("K")
    if sig.family == "gemm" and sig.op == "gemm":
        return f"{n}x{k}{dt}"
    if sig.family == "gemm" and sig.op == "gemm_act":
        return f"{n}x{k} {sig.get('act')}{'+b' if sig.get('bias') else ''}{dt}"
    if sig.family == "gemm" and sig.op == "bmm":
        return f"bmm {sig.get('B')}x{n}x{k}{dt}"
    fields = " ".join(f"{key}={value}" for key, value in sig.params)
    return f"{sig.op} {fields}{dt}"


def fits(console: Any, table: Any) -> bool:
    """Whether `table` prints on `console` without wrapping or cutting any cell."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(10_000)  # its natural width, not clamped to the console's
    return Measurement.get(console, unbounded, table).maximum <= console.width
