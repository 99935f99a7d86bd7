"""The size-bucket ladders shared by the build's fill points and the runtime autotuner's keys.

Ladder "m" (GEMM's M): every multiple of 8 up to 128, then 128 * sqrt(2)**k rounded up to a
multiple of 8 up to 1024 (184, 256, 368, 512, 728, 1024), then doubling (2048, 4096, ...).
Ladder "pow2" (a batch of small problems): 1, 2, 4, 8, ... A family's SignatureSchema names its
ladder. Pure integer arithmetic, so every process and every machine computes the same edges.
"""
from __future__ import annotations

import math

_STEP = 8
_FINE_TOP = 128
_SQRT2_TOP = 1024


def _round_up8(x: int) -> int:
    return -(-x // _STEP) * _STEP


def _sqrt2_edge(k: int) -> int:
    """ceil(128 * sqrt(2)**k) rounded up to a multiple of 8, without floating point."""
    base = _FINE_TOP << (k // 2)
    if k % 2 == 0:
        return base
    square = 2 * base * base
    return _round_up8(math.isqrt(square - 1) + 1)  # ceil(sqrt(square))


def _check_m(m: int, name: str = "m") -> None:
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"{name}={m!r} must be a positive int")


LADDERS: tuple[str, ...] = ("m", "pow2")


def _check_kind(kind: str) -> None:
    if kind not in LADDERS:
        raise ValueError(f"unknown bucket ladder {kind!r}; ladders: {', '.join(LADDERS)}")


def edges_upto(m: int, kind: str = "m") -> tuple[int, ...]:
    """Every bucket edge <= bucket_of(m), ascending."""
    _check_m(m)
    _check_kind(kind)
    out: list[int] = []
    edge = 0
    while edge < m:
        edge = _next_edge(edge) if kind == "m" else max(1, edge * 2)
        out.append(edge)
    return tuple(out)


def _next_edge(edge: int) -> int:
    if edge < _FINE_TOP:
        return edge + _STEP
    if edge < _SQRT2_TOP:
        k = 0
        while _sqrt2_edge(k) <= edge:
            k += 1
        return _sqrt2_edge(k)
    return edge * 2


def bucket_of(m: int, kind: str = "m") -> int:
    """The upper edge of m's bucket: the smallest edge >= m."""
    _check_m(m)
    _check_kind(kind)
    if kind == "pow2":
        return 1 << (m - 1).bit_length()
    if m <= _FINE_TOP:
        return _round_up8(m)
    if m <= _SQRT2_TOP:
        k = 1
        while _sqrt2_edge(k) < m:
            k += 1
        return _sqrt2_edge(k)
    edge = _SQRT2_TOP
    while edge < m:
        edge *= 2
    return edge


def ladder(m_lo: int, m_hi: int, kind: str = "m") -> tuple[int, ...]:
    """Fill points: every bucket edge from m_lo up to bucket_of(m_hi) inclusive, so the largest
    census point always has a measured size at or above it (regions round up)."""
    _check_m(m_lo, "m_lo")
    _check_m(m_hi, "m_hi")
    if m_lo > m_hi:
        raise ValueError(f"ladder needs m_lo <= m_hi, got m_lo={m_lo}, m_hi={m_hi}")
    return tuple(e for e in edges_upto(m_hi, kind) if e >= m_lo)
