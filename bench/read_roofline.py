"""A pure streaming read of one weight: the ceiling any M <= 16 GEMV can reach at that size.

bench/decode_limit.py times it exactly like the decode GEMMs (cold copies rotated in one CUDA
graph), so its per-call time includes what every kernel pays besides bytes: the launch inside a
graph, the DRAM latency ramp before the first bytes arrive and the tail of the last wave.

The kernel reads the weight as a flat array: BLOCK contiguous elements per step (16-byte vectors,
BLOCK / (32 x warps) elements per thread in flight), grid-stride over the blocks, so a config is
(BLOCK, warps, stages) compiled and the grid (one CTA per block, or a persistent grid of a few
CTAs per SM) chosen at launch. Each CTA stores one fp32 partial sum, so the read cannot be
optimised away and its result is checked (the partials sum to the weight's sum). `_pdl` binaries
load their first block before `gdc_wait`, as the lane's `_pdl` configs do with their first W
tile: under programmatic dependent launch that read overlaps the previous kernel's tail. `_pdlate`
binaries (session 33) trigger their dependents only after their own last block (not right after
`gdc_wait`), so the next kernel's CTAs take an SM's slots only as this one drains instead of
waiting at `gdc_wait` through its whole last wave (bench/decode_chain.py times both in chains).
Imports triton (bench only; tunedb never imports this).
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass


@triton.jit
def read_kernel(w_ptr, out_ptr, numel, n_blocks, BLOCK: tl.constexpr, EVEN: tl.constexpr, PDL: tl.constexpr,
                LATE: tl.constexpr = False):
    """out[pid] = sum over the blocks pid, pid + grid, ... of w (fp32)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    start = pid.to(tl.int64) * BLOCK
    if EVEN:
        v = tl.load(w_ptr + start + offs)
    else:
        v = tl.load(w_ptr + start + offs, mask=start + offs < numel, other=0.0)
    if PDL:
        # nothing here depends on the previous kernel; the wait is where a GEMV's would be
        tl.extra.cuda.gdc_wait()
        if not LATE:
            tl.extra.cuda.gdc_launch_dependents()
    acc = v.to(tl.float32)
    stride = step.to(tl.int64) * BLOCK
    base = start
    for _ in range(pid + step, n_blocks, step):
        base += stride
        if EVEN:
            v = tl.load(w_ptr + base + offs)
        else:
            v = tl.load(w_ptr + base + offs, mask=base + offs < numel, other=0.0)
        acc += v.to(tl.float32)
    if PDL and LATE:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@dataclass(frozen=True)
class ReadConfig:
    """One read arm: the compiled (block, warps, stages, pdl) and the grid (ctas_per_sm 0: one
    CTA per block; otherwise a persistent grid of ctas_per_sm x SMs, capped at the blocks)."""

    block: int
    warps: int
    stages: int
    ctas_per_sm: int = 0
    pdl: bool = False
    late: bool = False  # with pdl: trigger the dependents after the last block, not at the start

    @property
    def id(self) -> str:
        grid = "all" if self.ctas_per_sm == 0 else f"{self.ctas_per_sm}xsm"
        return f"read_b{self.block}_w{self.warps}_s{self.stages}_{grid}" + (("_pdlate" if self.late else "_pdl") if self.pdl else "")

    def grid(self, numel: int, sms: int) -> int:
        blocks = -(-numel // self.block)
        return blocks if self.ctas_per_sm == 0 else max(1, min(blocks, self.ctas_per_sm * sms))


def configs(quick: bool = False, pdl: bool = True) -> list[ReadConfig]:
    """The read sweep: 4 binaries (x2 with PDL), each at one CTA per block and persistent grids."""
    # stages stay 1: Triton 3.6 pipelines no plain loads (no cp.async in the sm90 PTX), so the
    # bytes in flight are BLOCK / (32 x warps) elements per thread, 16-byte vectors
    binaries = [(8192, 8, 1), (16384, 8, 1)] if quick else [(4096, 4, 1), (8192, 4, 1), (8192, 8, 1), (16384, 8, 1)]
    grids = (0, 4) if quick else (0, 2, 4, 8)
    return [ReadConfig(b, w, s, g, p) for b, w, s in binaries for g in grids for p in ((False, True) if pdl else (False,))]


def late_twins(cfgs: list[ReadConfig]) -> list[ReadConfig]:
    """The `_pdlate` twin of every PDL config in `cfgs` (kept out of configs(): the sweeps that
    call it time each arm alone, where no next kernel exists to trigger)."""
    return [ReadConfig(c.block, c.warps, c.stages, c.ctas_per_sm, True, True) for c in cfgs if c.pdl and not c.late]


def by_id(config_id: str) -> ReadConfig:
    """The read config of an id configs() makes (ValueError naming it otherwise)."""
    for cfg in configs(quick=False) + late_twins(configs(quick=False)):
        if cfg.id == config_id:
            return cfg
    raise ValueError(f"unknown read config {config_id!r}; e.g. {configs(quick=False)[0].id!r}")


def launcher(cfg: ReadConfig, numel: int, sms: int, interpret: bool = False):
    """fn(w, out) reading the contiguous tensor w (numel elements) into out[:grid] partials."""
    grid = cfg.grid(numel, sms)
    n_blocks = -(-numel // cfg.block)
    kw = {"BLOCK": cfg.block, "EVEN": numel % cfg.block == 0, "PDL": cfg.pdl and not interpret,
          "LATE": cfg.late, "num_warps": cfg.warps, "num_stages": cfg.stages}
    if cfg.pdl and not interpret:
        kw["launch_pdl"] = True

    def run(w, out):
        read_kernel[(grid,)](w, out, numel, n_blocks, **kw)
        return out

    run.grid = grid
    return run
