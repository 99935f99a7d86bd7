"""Which arm serves the small linear-algebra ops' eager calls: the family's eager_fallback hook.

The table is measured in CUDA graphs, where a launch costs the host nothing. An eager call costs
about the larger of its host issue time and its kernel time, and at batch <= 4096 most kernels
here take 1-10 us while issuing one from Python takes longer (bench/linalg_eager.py, sessions 29
and 30, H200 host): a Triton arm 46 us a call through the general path, 31-36 us through its
prepared launch (triton_launcher), torch's bmm 13 us,
cholesky_ex 31-33 us, solve_triangular 31 us, the three calls of posv 92-125 us, the CUDA tier's
prepared launch 13-17 us. So a gemv that a Triton arm serves 1.5x faster in a graph ran
0.27-0.31x of torch.bmm eagerly.

Rule: the torch arm serves a shape's eager calls (CUDA-graph captures keep the tuned arm, which
is what the table measured) when torch's estimate, max(host, kernel), is below the arm's. Host
times are in units of the arch profile's eager launch cost (`launch_us_eager`, 7.21 us on the
H200 host), so a slower host scales them all; kernel times are the table entry's own evidence
for the two arms, interpolated in batch (below the smallest measured batch: the time there,
above the largest: linear in batch), or for torch where the entry has none, the memory floor of
the call's bytes at DRAM bandwidth. The CUDA tier's prepared eager launch (cuda_launcher) costs
less host time than any torch form, so its arms always serve eager calls themselves.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from tunedb.records import ArchProfile, Config, Signature

# Host issue time of one eager call, in units of profile.launch_us_eager (7.21 us on the H200's
# host; session 29 calls 4 and 7 measured the us in the module docstring, medians over 700 calls).
TORCH_HOST = {"dot": 1.8, "gemv": 1.8, "gemm": 1.8, "potrf": 4.6, "trsv": 4.3, "posv": 14.0}
# A Triton arm's prepared eager launch (triton_launcher): 31-36 us of host a call on a fast-host
# day and 50-54 us on a slow one (session 30 calls 1, 3 and 4; bench/linalg_eager.py, the gemv
# arms with TUNEDB_EAGER_FALLBACK=0), while these units stay the profile's. 8.5 units (61 us) is
# the slow host's plus 15%: torch.bmm keeps the batch-65536 gemvs at n = 4, 8 (kernel 53-58 us in
# the table's evidence; their arm ran 1.45-1.60x on the fast host but 0.89-0.97x on the slow one)
# and the arm serves n = 16 (torch 66 us; 1.43x / 1.25x) and 32 (2.2x). Was 10.5, the general
# path's on a slow host, which sent n = 16 to torch too.
TRITON_HOST = 8.5
CUDA_HOST = 2.4  # the prepared launch (cuda_launcher): 13-17 us in call 7


def arm_host(config_id: str) -> float:
    """An arm's eager host time in launch_us_eager units."""
    return CUDA_HOST if config_id.startswith("cuda") else TRITON_HOST


def kernel_us(evidence: Mapping[str, Any], arm: str, batch: int) -> float | None:
    """An arm's kernel time (us) at `batch` from an entry's evidence ({"M=<batch>": {arm:
    [median ms, spread, n], ...}}), or None where the entry measured it at no batch."""
    points = []
    for size, arms in evidence.items():
        if not size.startswith("M=") or not isinstance(arms, Mapping):
            continue
        got = arms.get(arm)
        try:
            points.append((int(size[2:]), float(got[0]) * 1000.0))
        except (TypeError, ValueError, IndexError):
            continue
    if not points:
        return None
    points.sort()
    if batch <= points[0][0]:
        return points[0][1]
    for (m0, t0), (m1, t1) in zip(points, points[1:]):
        if batch <= m1:
            return t0 + (t1 - t0) * (batch - m0) / (m1 - m0)
    m_last, t_last = points[-1]
    return t_last * batch / m_last


def floor_us(sig: Signature, batch: int, profile: ArchProfile) -> float:
    """The call's bytes at DRAM bandwidth (us): no kernel of it runs faster."""
    from tunedb.families.linalg.signatures import work

    return work(sig, batch)[1] / (profile.dram_bw_gbs * 1e3)


def decide(sig: Signature, batch: int, config: Config, profile: ArchProfile,
           evidence: Mapping[str, Any] | None | Callable[[], Mapping[str, Any] | None]) -> str | None:
    """'torch' where torch's eager estimate is below the config's, else None. `evidence` may be
    a callable, asked only where the host times leave the question open."""
    if config.is_sentinel or sig.op not in TORCH_HOST:
        return None
    unit = profile.launch_us_eager
    host_arm, host_torch = arm_host(config.id) * unit, TORCH_HOST[sig.op] * unit
    if host_arm <= host_torch:
        return None  # the arm's kernel won in the graph and its host time is no worse
    if callable(evidence):
        evidence = evidence()
    g_torch = kernel_us(evidence, "torch", batch) if evidence else None
    if g_torch is None:
        g_torch = floor_us(sig, batch, profile)
    g_arm = (kernel_us(evidence, config.id, batch) if evidence else None) or 0.0
    return "torch" if max(host_torch, g_torch) < max(host_arm, g_arm) else None


def served_evidence(sig: Signature, batch: int) -> Mapping[str, Any] | None:
    """The evidence of the entry that serves (sig, batch) in this epoch's usable tier files (the
    selector's walk order), or None."""
    from tunedb import database, families
    from tunedb.runtime import selector, serving

    fam = families.get(sig.family)
    files = database.lookup(selector.current_arch_family(), fam.name)
    for res, key, _cid in serving.walk(fam, sig, batch, ((res, res.db.entries) for res in files)):
        entry = res.db.entries.get(key)
        if entry is not None:
            return entry.evidence
    return None


def eager_fallback(sig: Signature, batch: int, config: Config, profile: ArchProfile) -> str | None:
    """The family's eager_fallback hook (runtime/host_bound.py); the serving entry's evidence is
    looked up only where decide() needs it."""
    return decide(sig, batch, config, profile, lambda: served_evidence(sig, batch))
