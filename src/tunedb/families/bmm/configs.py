"""Batched-product configs: ids, the config space, THE validity predicate, the untuned tile.

Pure Python (no torch, no triton). One lane, `triton_bmm`: a tile kernel whose grid is (tiles of
one product, batch), with every operand stride passed in (transposed and expanded operands run
in place, never copied). Config ids use the GEMM grammar:

    b{BM}x{BN}x{BK}_w{W}_s{S}_g{G}      b64x128x32_w4_s3_g8

Sentinels: `torch` (torch.bmm: cuBLAS, the pick rule's fallback) and `default`, which for this
family IS torch (an unmeasured key never runs an unmeasured Triton tile). `UNTUNED` is the tile a
user of a plain Triton batched kernel would write (the bench's "untuned Triton" column).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Sequence

from tunedb.arch import planning_smem_per_block as smem_per_block
from tunedb.errors import ConfigError
from tunedb.families.key_rules import head_reason
from tunedb.families.tile_ids import TileIds, blocks
from tunedb.records import ArchProfile, Config, Signature

FAMILY = "bmm"
OPS: tuple[str, ...] = ("bmm",)
TRITON_LANES: tuple[str, ...] = ("triton_bmm",)
LANES: tuple[str, ...] = TRITON_LANES + ("torch",)
FAMILY_SENTINELS: tuple[str, ...] = ("default", "torch")
DTYPES: tuple[str, ...] = ("half", "fp16", "bf16", "fp32")
# a: "n" = [B, M, K] with K contiguous, "t" = M contiguous; b: "n" = [B, K, N] with N
# contiguous, "t" = K contiguous (q @ k^T of attention: b is a transposed view of k)
LAYOUTS: tuple[str, ...] = ("nn", "nt", "tn", "tt")
MAX_BATCH = 65535  # the grid's second dimension
MAX_ACC_REGS = 128  # fp32 accumulator registers per thread a tile may take

TILE_IDS = TileIds(FAMILY, (("triton_bmm", ""),), FAMILY_SENTINELS, "b64x128x32_w4_s3_g8",
                   blocks_m=(16, 32, 64, 128), blocks_n=(32, 64, 128), blocks_k=(16, 32, 64),
                   warps=(2, 4, 8), stages=range(1, 7), groups=(1, 8), owner="the bmm family", label="bmm")


def elem_bytes(dt: str) -> int:
    return 4 if dt == "fp32" else 2


def make(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8) -> Config:
    return TILE_IDS.make(bm, bn, bk, warps, stages, group_m)


parse = lru_cache(maxsize=4096)(TILE_IDS.parse)

UNTUNED = make(64, 64, 32, 4, 3, 8)


def full_grid() -> tuple[Config, ...]:
    """Every Triton config the family knows, before any arch or shape rule (52 tiles): the tile
    shapes attention's products need (short M at decode, N and K of one head, 64..128), each at
    two K depths and two pipeline depths, and both tile orders for the tiles that span N."""
    out = []
    for bm, bn, warps in ((16, 32, 2), (16, 64, 4), (32, 32, 2), (32, 64, 4), (64, 32, 4), (64, 64, 4),
                          (64, 128, 4), (128, 64, 4), (128, 128, 8), (64, 128, 8), (128, 64, 8),
                          (128, 32, 4), (32, 128, 4)):
        for bk in (32, 64):
            for stages in (3, 4):
                out.append(make(bm, bn, bk, warps, stages, 8))
    return tuple(out)


_QUICK = ("b16x32x32_w2_s3_g8", "b16x64x64_w4_s3_g8", "b32x64x32_w4_s3_g8", "b32x64x64_w4_s3_g8",
          "b64x32x64_w4_s3_g8", "b64x64x32_w4_s3_g8", "b64x64x64_w4_s3_g8", "b64x128x32_w4_s3_g8",
          "b64x128x64_w4_s4_g8", "b128x64x32_w4_s3_g8", "b128x64x64_w8_s4_g8", "b128x128x32_w8_s3_g8",
          "b128x128x64_w8_s4_g8", "b32x128x64_w4_s3_g8")


def quick_grid() -> tuple[Config, ...]:
    """The pruned space the bench sweeps exhaustively in --quick mode: 14 tiles of the full grid,
    one or two per tile shape (the compile count bounds the bench's time)."""
    return tuple(parse(cid) for cid in _QUICK)


def config_space(arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    wanted = set(lanes or TRITON_LANES)
    bad = wanted - set(LANES)
    if bad:
        raise ConfigError(f"unknown bmm lane(s) {sorted(bad)}; lanes are {', '.join(LANES)}")
    smem = smem_per_block(arch_family)
    # the space is arch-level: a tile that fits with 2-byte operands at this arch
    return tuple(c for c in full_grid() if c.lane in wanted and smem_bytes(c, "half") <= smem)


def smem_bytes(cfg: Config, dt: str) -> int:
    """Pipelined operand buffers, or the epilogue's fp32 layout-conversion scratch if larger."""
    bm, bn, bk = blocks(cfg)
    return max(cfg.param("stages") * (bm + bn) * bk * elem_bytes(dt), bm * bn * 4)


def sig_reason(sig: Signature) -> str | None:
    """Why a signature is not one of this family's keys (None when it is)."""
    why = head_reason(sig, FAMILY, OPS, DTYPES, ("B", "N", "K"))
    if why:
        return why
    if sig.get("lay", "nn") not in LAYOUTS:
        return f"lay={sig.get('lay')!r} not allowed; use one of {', '.join(LAYOUTS)}"
    return None


def invalid_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    """THE validity predicate: None when `cfg` may run `sig` at M (any M when m is None). The
    config space, the bench's sweep, the build's candidates and the run time's selector all ask
    this one function."""
    why = sig_reason(sig)
    if why:
        return why
    if m is not None and m < 1:
        return f"M={m} must be >= 1"
    if cfg.id in FAMILY_SENTINELS:
        return None
    if cfg.is_sentinel:
        return f"sentinel {cfg.id!r} is not an arm of the bmm family"
    if cfg.lane not in TRITON_LANES:
        return f"lane {cfg.lane!r} is not a bmm lane"
    bm, bn, bk = blocks(cfg)
    if sig.get("B") > MAX_BATCH:
        return f"B={sig.get('B')} > {MAX_BATCH}: the batch is the grid's second dimension"
    need = smem_bytes(cfg, sig.dt)
    if need > arch.smem_per_block:
        return f"needs {need} B of shared memory > {arch.smem_per_block} ({sig.dt} operands)"
    regs = bm * bn // (32 * cfg.param("warps"))
    if regs > MAX_ACC_REGS:
        return f"a {bm}x{bn} fp32 accumulator over {cfg.param('warps')} warps takes {regs} registers a thread (> {MAX_ACC_REGS})"
    return None


def candidates(sig: Signature, m: int | None, arch: ArchProfile, grid: Iterable[Config] | None = None) -> tuple[Config, ...]:
    space = config_space(arch.arch_family) if grid is None else tuple(grid)
    return tuple(c for c in space if invalid_reason(c, sig, m, arch) is None)


def sentinels(sig: Signature, approximate: bool = False) -> tuple[str, ...]:
    return FAMILY_SENTINELS


def default_config(sig: Signature, arch: ArchProfile | None = None) -> Config:
    """What an unmeasured key runs: torch.bmm."""
    return Config.sentinel("torch")


def compile_set(arch_family: str, referenced: Iterable[str], mode: str | None = None) -> tuple[Config, ...]:
    """Referenced configs + the untuned tile (+ the whole space under TUNEDB_COMPILE_SET=all)."""
    from tunedb import settings

    mode = mode or settings.compile_set()
    smem = smem_per_block(arch_family)
    chosen = {c.id: c for c in (config_space(arch_family) if mode == "all" else ())}
    chosen.setdefault(UNTUNED.id, UNTUNED)
    for cid in referenced:
        try:
            c = parse(cid)
        except ConfigError:
            continue
        if not c.is_sentinel and smem_bytes(c, "half") <= smem:
            chosen.setdefault(c.id, c)
    for name in FAMILY_SENTINELS:
        chosen.setdefault(name, Config.sentinel(name))
    return tuple(chosen.values())


def simplicity(config_id: str) -> int:
    """Lower is simpler: torch (and default, which is torch), then the Triton tiles."""
    return 0 if config_id in FAMILY_SENTINELS else 1
