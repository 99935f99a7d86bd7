"""The triton_overlap lane's configs: ids, grid, the lane's part of THE validity predicate
(configs.invalid_reason asks it), shared memory. Pure Python. kernels_overlap.py holds the
kernel, docs/glsm_gap.md why this design.

    ov_b{BM}x{BN}x{BK}_w{W}_s{S}       ov_b128x256x64_w8_s3

ONE persistent launch (one CTA an SM) walks the [BM, BN] logit tiles row block by row block; each
tile writes its rounded logits and its rows' partial statistics; the tile completing a row block
writes the block's log-sum-exps; each CTA, after its tile t, subtracts them in place from tile
t - LAG (LAG = grid + tiles a row block: written recently enough to be in L2). The GEMM tiles'
compute and the fix-ups' memory traffic overlap; the logits cross HBM about once.
"""
from __future__ import annotations

import re
from functools import lru_cache

from tunedb.errors import ConfigError
from tunedb.records import ArchProfile, Config

LANE = "triton_overlap"
PREFIX = "ov_"
BLOCKS_M, BLOCKS_N, BLOCKS_K = (16, 32, 64, 128, 256), (32, 64, 128, 256), (16, 32, 64, 128)
WARPS, STAGES = (4, 8), range(1, 6)
MIN_M = 256  # below it a row block is the whole M: the fix-ups wait on every tile (a grid barrier)
MAX_ACC_PER_THREAD = 128  # fp32 accumulators a thread; beyond, they spill
MAX_N_TILES = 8192  # the statistics workspace is [M, T] fp32 twice
MAX_REGS_PER_THREAD = 255  # the residency check assumes the worst allocation
_ID = re.compile(r"^ov_b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)$")


def make(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    for name, v, allowed in (("BM", bm, BLOCKS_M), ("BN", bn, BLOCKS_N), ("BK", bk, BLOCKS_K),
                             ("warps", warps, WARPS), ("stages", stages, STAGES)):
        if v not in allowed:
            raise ConfigError(f"{LANE} config: {name}={v!r} not allowed; use one of {tuple(allowed)}")
    cid = f"ov_b{bm}x{bn}x{bk}_w{warps}_s{stages}"
    return Config(cid, LANE, (("block", (bm, bn, bk)), ("warps", warps), ("stages", stages)))


@lru_cache(maxsize=1024)
def parse(config_id: str) -> Config:
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(f"bad {LANE} config id {config_id!r}: expected e.g. ov_b128x256x64_w8_s3")
    cfg = make(int(m["bm"]), int(m["bn"]), int(m["bk"]), int(m["w"]), int(m["s"]))
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


# (BM, BN, BK, warps, stages): the wgmma-friendly tiles of a bf16 GEMM at K = 256-512 (eight
# warps for 128 x 256, whose accumulator is 128 fp32 a thread), a narrower N tile (more tiles in
# flight, a smaller fix-up), and 64-row blocks (a row block's tiles finish sooner: shorter waits).
# Left out after the sm90 compile (ptxas, Triton 3.6): 128 x 128 on four warps and 256 x 128 on
# eight spill 1.1-1.2 KB a thread; the kept ones spill 20-544 B, in each tile's prologue.
_GRID = ((128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (64, 256, 64, 4, 4),
         (64, 128, 64, 4, 4), (64, 128, 64, 4, 3))


def grid() -> tuple[Config, ...]:
    return tuple(make(*t) for t in _GRID)


def smem_bytes(cfg: Config) -> int:
    """Pipelined operand buffers (two bytes an element) or the fp32 tile's layout conversion."""
    bm, bn, bk = cfg.param("block")
    return max(cfg.param("stages") * (bm + bn) * bk * 2, bm * bn * 4)


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def reason(cfg: Config, n: int, k: int, m: int | None, arch: ArchProfile) -> str | None:
    """The lane's rules: M given and at least MIN_M (and BM not beyond M rounded up to a power of
    two); a tile fits shared memory and keeps its fp32 accumulator in registers; the statistics
    workspace stays bounded; BK not beyond K rounded up; one CTA fits an SM at the worst register
    allocation (the waits need the whole grid resident)."""
    if m is None:
        return f"{LANE} serves M >= {MIN_M} only, so not every M"
    if m < MIN_M:
        return f"{LANE} serves M >= {MIN_M}, not M={m} (one row block: its fix-ups wait on every tile)"
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
    if bk > max(16, _pow2_at_least(k)):
        return f"BK={bk} exceeds K={k} rounded up to a power of two"
    if bm > _pow2_at_least(m):
        return f"BM={bm} exceeds M={m} rounded up to a power of two"
    if warps * 32 * MAX_REGS_PER_THREAD > arch.regs_per_sm:
        return (f"{warps} warps may need {warps * 32 * MAX_REGS_PER_THREAD} registers > an SM's "
                f"{arch.regs_per_sm} (the persistent grid needs one CTA an SM resident)")
    return None
