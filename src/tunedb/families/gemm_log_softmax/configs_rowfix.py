"""The triton_rowfix lane's configs (small M: a head's call at M <= 1024): ids, grid, the lane's
part of THE validity predicate (configs.invalid_reason asks it), shared memory. Pure Python.

    rf_b{BM}x{BN}x{BK}_w{W}_s{S}_{L}       rf_b64x64x64_w4_s3_pdl, rf_b64x64x64_w4_s3_one2

Phase 1 (tiles): each [BM, BN] tile of logits is computed from the whole K, stored in the output
dtype, and its rows' max and sum of exp (of the stored, rounded logits) go to [M, T] fp32
partials (T = ceil(N / BN)); consecutive tiles share one N slice (W read from DRAM once).
Phase 2 (fix-up): each (row, column chunk) combines its row's T partials into the row's
log-sum-exp and subtracts it in place: the combine and the subtraction in one pass (the
`triton_fixup` lane runs them as two more launches). L says how the phases are launched:
    two   two kernels, one after the other
    pdl   two kernels, the fix-up under programmatic dependent launch (its CTAs wait at
          gdc_wait while the tiles drain: the second launch's latency hidden; sm90+, Triton 3.4+)
    one1, one2  ONE persistent kernel of P = 1 or 2 CTAs an SM: the tiles, a grid barrier (an
          atomic counter the kernel leaves zero), the fix-ups. The barrier needs every CTA
          resident at once, so P CTAs must fit an SM at any register allocation (the predicate);
          its wait is bounded (a CTA whose wait runs out writes its output chunks NaN: a loud
          wrong result the gate refuses, never a hang).
"""
from __future__ import annotations

import re
from functools import lru_cache

from tunedb.errors import ConfigError
from tunedb.records import ArchProfile, Config

LANE = "triton_rowfix"
PREFIX = "rf_"
MODES = ("two", "pdl", "one1", "one2")
BLOCKS_M, BLOCKS_N, BLOCKS_K = (16, 32, 64, 128, 256), (32, 64, 128, 256), (32, 64, 128)
WARPS, STAGES = (4, 8), range(1, 6)
MAX_M = 1024  # a small-M lane: above it the GEMM dominates and cuBLAS's is faster (linear_rows)
MAX_ACC_PER_THREAD = 128  # fp32 accumulators a thread; beyond, they spill
MAX_N_TILES = 8192
MAX_REGS_PER_THREAD = 255  # the co-residency check assumes the worst allocation
_ID = re.compile(r"^rf_b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)_(?P<mode>[a-z]+\d?)$")


def make(bm: int, bn: int, bk: int, warps: int, stages: int, mode: str) -> Config:
    for name, v, allowed in (("BM", bm, BLOCKS_M), ("BN", bn, BLOCKS_N), ("BK", bk, BLOCKS_K),
                             ("warps", warps, WARPS), ("stages", stages, STAGES), ("launch", mode, MODES)):
        if v not in allowed:
            raise ConfigError(f"{LANE} config: {name}={v!r} not allowed; use one of {tuple(allowed)}")
    cid = f"rf_b{bm}x{bn}x{bk}_w{warps}_s{stages}_{mode}"
    return Config(cid, LANE, (("block", (bm, bn, bk)), ("warps", warps), ("stages", stages), ("launch", mode)))


@lru_cache(maxsize=1024)
def parse(config_id: str) -> Config:
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(f"bad {LANE} config id {config_id!r}: expected rf_b64x64x64_w4_s3_pdl "
                          f"(launch one of {', '.join(MODES)})")
    cfg = make(int(m["bm"]), int(m["bn"]), int(m["bk"]), int(m["w"]), int(m["s"]), m["mode"])
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def per_sm(cfg: Config) -> int:
    """CTAs an SM of a persistent (one-launch) config; 0 for the two-launch ones."""
    mode = cfg.param("launch")
    return int(mode[3:]) if mode.startswith("one") else 0


# (BM, BN, BK, warps, stages, launch): at M <= 64 one 64-row tile and narrow N slices (many CTAs
# stream W: 500 at N=32000, BN=64; each re-reads x from L2, M/BN of W's bytes); BM 128/256 cover
# M=128/256 in one tile; wider BN at larger M (x re-read less); the same tile with and without
# PDL and as one launch, to see each launch's cost
_GRID = ((64, 64, 64, 4, 3, "pdl"), (64, 64, 64, 4, 3, "two"), (64, 32, 128, 4, 3, "pdl"),
         (64, 128, 64, 4, 3, "pdl"), (128, 64, 64, 4, 3, "pdl"), (128, 128, 64, 8, 3, "pdl"),
         (128, 256, 64, 8, 3, "pdl"), (256, 64, 64, 8, 3, "pdl"))
_ONE_LAUNCH = ((64, 64, 64, 4, 3, "one2"), (64, 32, 128, 4, 3, "one2"), (64, 128, 64, 4, 3, "one2"),
               (128, 64, 64, 4, 3, "one2"), (128, 128, 64, 8, 3, "one1"))


def grid() -> tuple[Config, ...]:
    """The lane's build space: the two-launch configs (plain and PDL)."""
    return tuple(make(*t) for t in _GRID)


def one_launch_grid() -> tuple[Config, ...]:
    """The one-launch (grid barrier) configs, measured by bench/glsm_small_m.py and kept out of the
    build space: they lost at every point of session 14 D (0.41-1.06x torch), they are correct
    only when every CTA is resident at once (the predicate estimates it; other work on the GPU
    can break it, and a barrier that runs out writes NaN), and their barrier counters are one
    pair a device, so two streams running one at the same time would share them."""
    return tuple(make(*t) for t in _ONE_LAUNCH)


def smem_bytes(cfg: Config) -> int:
    """Pipelined operand buffers (two bytes an element) or the fp32 tile's layout conversion."""
    bm, bn, bk = cfg.param("block")
    return max(cfg.param("stages") * (bm + bn) * bk * 2, bm * bn * 4)


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def _capability(arch_family: str) -> int:
    m = re.match(r"^sm(\d+)a?$", arch_family or "")
    return int(m.group(1)) if m else 0


def reason(cfg: Config, n: int, k: int, m: int | None, arch: ArchProfile) -> str | None:
    """The lane's rules: M given and at most MAX_M; a tile fits shared memory and keeps its fp32
    accumulator in registers; the statistics workspace stays bounded; BK and BM not beyond K and M
    rounded up to a power of two; `pdl` needs sm90+ and Triton 3.4+; `one{P}` needs P CTAs an SM
    resident at once (shared memory and the worst register allocation)."""
    if m is None:
        return f"{LANE} serves M <= {MAX_M} only, so not every M"
    if m > MAX_M:
        return f"{LANE} serves M <= {MAX_M}, not M={m}"
    bm, bn, bk = cfg.param("block")
    warps = cfg.param("warps")
    need = smem_bytes(cfg)
    if need > arch.smem_per_block:
        return f"needs {need} B of shared memory > {arch.smem_per_block}"
    acc = bm * bn // (32 * warps)
    if acc > MAX_ACC_PER_THREAD:
        return f"{acc} fp32 accumulators per thread > {MAX_ACC_PER_THREAD} (BM={bm}, BN={bn}, warps={warps})"
    if -(-n // bn) > MAX_N_TILES:
        return f"N={n} makes {-(-n // bn)} tiles of BN={bn} > {MAX_N_TILES} (statistics workspace)"
    if bk > max(32, _pow2_at_least(k)):
        return f"BK={bk} exceeds K={k} rounded up to a power of two"
    if bm > max(16, _pow2_at_least(m)):
        return f"BM={bm} exceeds M={m} rounded up to a power of two"
    mode = cfg.param("launch")
    if mode == "pdl":
        from tunedb.families.gemm.configs_decode import pdl_supported

        if _capability(arch.arch_family) < 90:
            return f"programmatic dependent launch (pdl) needs sm90 or newer, not {arch.arch_family}"
        if not pdl_supported():
            return "this Triton has no gdc_wait / launch_pdl (programmatic dependent launch needs 3.4+)"
    p = per_sm(cfg)
    if p:
        if p * need > arch.smem_per_sm:
            return f"one{p}: {p} CTAs of {need} B shared memory do not fit an SM's {arch.smem_per_sm} B"
        if p * warps * 32 * MAX_REGS_PER_THREAD > arch.regs_per_sm:
            return (f"one{p}: {p} CTAs of {warps} warps may need {p * warps * 32 * MAX_REGS_PER_THREAD} "
                    f"registers > an SM's {arch.regs_per_sm} (the grid barrier needs every CTA resident)")
    return None
