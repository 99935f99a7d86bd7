"""ArchProfile: the frozen record of one device's ceilings (queried limits and micro-benchmarked
throughput) that planning, the cost models and validity checks read. tunedb.arch queries,
measures and caches it; records re-exports it with the other stage records. Pure Python: no
torch here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class ArchProfile:
    """Device ceilings: queried (SMs, shared memory, L2, registers) and micro-benchmarked."""

    arch_family: str  # "sm90"
    sku: str  # "NVIDIA H200"
    sms: int
    smem_per_sm: int  # bytes
    smem_per_block: int  # bytes, opt-in maximum
    l2_bytes: int
    regs_per_sm: int
    dram_bw_gbs: float  # measured copy bandwidth, bytes read + written
    bf16_tflops: float  # measured dense bf16 tensor throughput
    fp16_tflops: float
    launch_us_graph: float  # per-kernel cost inside a CUDA graph
    launch_us_eager: float  # per-kernel host issue cost, eager
    source: str = "measured"  # "measured", "shipped" or "queried"
    # dense throughput of other dtypes, TFLOPS (or TOPS) by dtype name: ("fp64", 67.0), ("int8", ...)
    peaks: tuple[tuple[str, float], ...] = ()

    def peak_tflops(self, dt: str) -> float:
        """The dense throughput for dtype `dt`: `peaks`, else bf16's for half-precision and for
        a dtype with no figure (a ceiling no family is above today)."""
        for name, value in self.peaks:
            if name == dt:
                return float(value)
        return self.fp16_tflops if dt == "fp16" else self.bf16_tflops

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["peaks"]
        if self.peaks:  # absent when empty: the shipped profiles' format stays as it was
            out["peaks"] = {k: v for k, v in self.peaks}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ArchProfile":
        known = {f for f in cls.__dataclass_fields__}
        missing = [f for f in known if f not in data and f not in ("source", "peaks")]
        if missing:
            raise ValueError(f"arch profile lacks {', '.join(sorted(missing))}")
        values = {k: v for k, v in data.items() if k in known}
        if "peaks" in values:
            values["peaks"] = tuple(sorted((str(k), float(v)) for k, v in dict(values["peaks"]).items()))
        return cls(**values)
