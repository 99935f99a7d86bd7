"""What an activation costs each side of the model tier's decision: pure Python, no torch.

torch runs gemm_act with an activation (act != none) as F.linear and then a separate elementwise
kernel: one more launch, that kernel's fixed cost, and a read and a write of the M x N output at
DRAM bandwidth (arms.torch_arm). Bias needs no pass of its own (addmm puts it in cuBLAS's
epilogue: measured on the H200, act=none bias=1 costs torch 0.2-0.4 us over the plain GEMM).
A Triton config fuses the activation into its epilogue, but that is not free either: each CTA
computes it on its bm x bn tile after the K loop (measured, erf GELU costs a Triton tile more
than torch's whole separate pass: +160 us at 16384 x 5120, against torch's +98 us; SiLU about
0.3-0.7 us). Both are fitted by calibration.fit from the act signatures' measurements, with the
plain GEMM's terms fixed:

    torch:  act_us  = fixed_us + scale * 2 * M * N * elem / dram_bw          (sentinel 'torch+act')
    Triton: cta_us += per_cta_us + per_elem_us * bm * bn   on every CTA      (act_epilogue[act])

Without a fit the pass is priced by structure alone (one launch, the vendor arm's fitted per-kernel
overhead, the traffic at the profile's bandwidth) and an activation with no epilogue fit of its own
takes the costliest fitted one (a Triton config is never made to look cheaper than measured).
"""
from __future__ import annotations

from typing import Any, Mapping

from tunedb.records import ArchProfile

ACT_PASS = "torch+act"  # params.sentinel key of the torch arm's activation pass: (scale, fixed_us)
Pair = tuple[float, float]


def act_of(sig: Any) -> str | None:
    """The activation a signature applies after its GEMM (None: none, or no signature)."""
    if sig is None:
        return None
    act = sig.get("act")
    return None if act in (None, "none") else str(act)


def traffic_us(m: int, n: int, elem: int, arch: ArchProfile) -> float:
    """A separate elementwise pass's DRAM time: the M x N output read once and written once."""
    return 2.0 * m * n * elem / (arch.dram_bw_gbs * 1e3)


def vendor_pass_us(name: str, act: str | None, m: int, n: int, elem: int, arch: ArchProfile,
                   sentinel: Mapping[str, Pair]) -> float:
    """The time the vendor arm `name` spends on the activation beyond its GEMM: 0 for 'fused'
    (cuBLASLt's epilogue) and for no activation, else torch's separate elementwise kernel."""
    if act is None or name != "torch":
        return 0.0
    fitted = sentinel.get(ACT_PASS)
    if fitted is not None:
        scale, fixed = fitted
    else:  # structure: one more vendor kernel (a launch and the arm's per-kernel overhead)
        overhead = (sentinel.get("torch") or (1.0, 0.0))[1]
        scale, fixed = 1.0, arch.launch_us_graph + overhead
    return fixed + scale * traffic_us(m, n, elem, arch)


def epilogue_pair(act: str | None, fitted: Mapping[str, Pair]) -> Pair:
    """(per_cta_us, per_elem_us) a Triton CTA pays for `act` in its epilogue: its own fit, else the
    costliest fitted activation's (per element, then per CTA), else nothing known: (0, 0)."""
    if act is None:
        return (0.0, 0.0)
    if act in fitted:
        return fitted[act]
    if not fitted:
        return (0.0, 0.0)
    return max(fitted.values(), key=lambda p: (p[1], p[0]))


def epilogue_us(act: str | None, bm: int, bn: int, fitted: Mapping[str, Pair]) -> float:
    """One CTA's activation epilogue on its bm x bn tile."""
    per_cta, per_elem = epilogue_pair(act, fitted)
    return per_cta + per_elem * bm * bn
