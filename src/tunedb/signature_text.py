"""Short forms of signatures for tables on narrow terminals, and the legend that explains them.

A full key is about 50 characters; in an 80-column table it wraps or is cut. A family's
`short_signature(sig)` gives the short form that keeps every field telling two of its keys apart
and `signature_legend` explains it (the GEMM family's: `2048x512 gelu+b`); keys of other
families fall back to their op and fields without the family name.
"""
from __future__ import annotations

from typing import Any

from tunedb.records import Signature

# What a short form without a family's own rule means.
GENERIC_LEGEND = "signature: OP FIELD=VALUE...; :DT = dtype (else the family's generic one)"


def _family(sig: Signature) -> Any:
    from tunedb import families

    try:
        return families.get(sig.family)
    except Exception:  # a family this process does not know: the generic form
        return None


def short(sig: Signature | str) -> str:
    """The short form of one signature: the family's `short_signature(sig)` when it has one,
    else the op and its fields without the family name."""
    if isinstance(sig, str):
        try:
            sig = Signature.parse(sig)
        except ValueError:
            return sig
    rule = getattr(_family(sig), "short_signature", None)
    if rule is not None:
        return rule(sig)
    dt = "" if sig.dt == "half" else f":{sig.dt}"
    fields = " ".join(f"{key}={value}" for key, value in sig.params)
    return f"{sig.op} {fields}{dt}"


def legend(sigs: Any = None) -> str:
    """The legend of the short forms of `sigs` (every registered family's when None): each
    family's `signature_legend`, two lines of at most 80 characters each."""
    from tunedb import families

    names = sorted({s.family for s in sigs}) if sigs is not None else [families.DEFAULT]
    parts = []
    for name in names:
        try:
            text = getattr(families.get(name), "signature_legend", None)
        except Exception:
            text = None
        parts.append(text or GENERIC_LEGEND)
    return "\n".join(dict.fromkeys(parts))


def fits(console: Any, table: Any) -> bool:
    """Whether `table` prints on `console` without wrapping or cutting any cell."""
    from rich.measure import Measurement

    unbounded = console.options.update_width(10_000)  # its natural width, not clamped to the console's
    return Measurement.get(console, unbounded, table).maximum <= console.width
