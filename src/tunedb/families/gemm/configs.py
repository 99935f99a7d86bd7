"""GEMM configs: the config space per lane, THE validity predicate, default, compile set.

Pure Python (no torch, no triton): candidate generation, the cost model, the selector and
`tunedb prebuild` all import this module. The family's names (ops, lanes, acts) and the config
ids (make, parse, from_json, blocks; the id formats) are in config_ids.py, re-exported here.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Sequence

from tunedb.errors import ConfigError
from tunedb.families.gemm import configs_decode as decode
from tunedb.families.gemm import configs_gemv as gemv
from tunedb.families.gemm.config_ids import (  # noqa: F401 - re-exported
    ACTS, ELEMENT_BYTES, FAMILY, GEMM_SENTINELS, LANES, OPS, TMA_ALIGN_BYTES, TRITON_LANES, VENDOR_LANES,
    blocks, from_json, make, parse)
from tunedb.records import ArchProfile, Config, Signature

# Opt-in shared memory per block (bytes) for arch families without a shipped profile.
_SMEM_BY_ARCH = {"sm80": 166912, "sm86": 101376, "sm87": 166912, "sm89": 101376,
                 "sm90": 232448, "sm100": 232448, "sm103": 232448, "sm120": 101376}


def known_arches() -> tuple[str, ...]:
    """The arch families this family knows how to compile for (what `tunedb prebuild` accepts)."""
    return tuple(_SMEM_BY_ARCH)


@lru_cache(maxsize=None)  # on every validity check: parse each arch name once
def capability(arch_family: str) -> int:
    """sm90 -> 90; ConfigError for names that are not sm<digits>."""
    m = re.match(r"^sm(\d+)a?$", arch_family or "")
    if not m:
        raise ConfigError(f"bad arch family {arch_family!r}: expected sm<digits> such as sm80 or sm90")
    return int(m.group(1))


def smem_per_block(arch_family: str) -> int:
    from tunedb import arch as _arch  # shipped profiles are package data (read lazily)

    if arch_family in _arch.SHIPPED_ARCHES:
        return _arch.shipped_profile(arch_family).smem_per_block
    capability(arch_family)
    return _SMEM_BY_ARCH.get(arch_family, 101376)


# ---------------------------------------------------------------- the grid and the space

def _mma_grid() -> list[Config]:
    out = []
    for bm in (16, 32, 64, 128):
        for bn in (32, 64, 128, 256):
            for bk in (32, 64, 128):
                if bm * bn > 128 * 256 or (bm == 16 and bn == 256):
                    continue  # too wide for a 16-row tile; 256x256 needs more registers than exist
                if bk == 128 and bm * bn >= 128 * 128:
                    continue  # deep K on a big tile only eats stages
                warps_opts = (4,) if bm * bn <= 64 * 64 else (8,) if bm * bn >= 128 * 256 else (4, 8)
                if bm == 16:
                    warps_opts = (4,)  # 8 warps on 16 rows leave warps idle
                for w in warps_opts:
                    for s in ((3, 4) if bk < 128 else (3,)):
                        out.append(make("triton_mma", bm, bn, bk, w, s, 8))
    for bn in (64, 128):  # decode tiles: few rows, deep K
        out.append(make("triton_mma", 16, bn, 256, 4, 3, 8))
        out.append(make("triton_mma", 32, bn, 256, 4, 3, 8))
    return out


def _tma_grid() -> list[Config]:
    out = []
    tiles = [(64, 64, 64, 4), (64, 128, 64, 4), (64, 256, 64, 4), (128, 64, 64, 4), (128, 128, 64, 4),
             (128, 128, 64, 8), (128, 256, 64, 8), (256, 128, 64, 8), (64, 128, 128, 4),
             (128, 128, 128, 8), (64, 64, 128, 4)]
    for bm, bn, bk, w in tiles:
        for s in (2, 3, 4, 5):
            out.append(make("triton_tma", bm, bn, bk, w, s, 8))
    for bm, bn, bk, w in ((128, 128, 64, 8), (128, 256, 64, 8), (128, 128, 64, 4), (64, 128, 64, 4)):
        for s in (3, 4):
            out.append(make("triton_tma", bm, bn, bk, w, s, 8, ws=True))
    return out


def _splitk_grid() -> list[Config]:
    out = []
    for bm in (16, 32, 64):
        for bn in (32, 64, 128):
            for bk in (64, 128, 256):
                if bk == 64 and bm < 64:
                    continue  # a small tile wants a deep K step
                s = 3 if bk == 256 else 4
                for split in (2, 4, 8, 16):
                    if split == 16 and bm == 64:
                        continue
                    out.append(make("triton_splitk", bm, bn, bk, 4, s, 1, split_k=split))
    return out


@lru_cache(maxsize=1)
def full_grid() -> tuple[Config, ...]:
    """Every config of every Triton lane before any arch filter (sense-pruned, not feasibility-pruned)."""
    return tuple(_mma_grid() + _tma_grid() + _splitk_grid() + decode.grid() + list(gemv.space()))


def lanes_of(lanes: Sequence[str] | None) -> tuple[str, ...]:
    if lanes is None:
        return TRITON_LANES
    for lane in lanes:
        if lane not in LANES:
            raise ConfigError(f"unknown GEMM lane {lane!r}; lanes are {', '.join(LANES)}")
    return tuple(lanes)


@lru_cache(maxsize=64)
def _space(arch_family: str, lanes: tuple[str, ...]) -> tuple[Config, ...]:
    return tuple(c for c in full_grid() if c.lane in lanes and arch_reason(c, arch_family) is None)


def config_space(arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    """Every grid config of `lanes` that can run on `arch_family` for some signature."""
    return _space(arch_family, lanes_of(lanes))


# ---------------------------------------------------------------- validity

def ws_supported() -> bool:
    """Whether the installed Triton has tl.range(warp_specialize=...) (3.4+)."""
    return decode.triton_at_least(3, 4)


def smem_bytes(cfg: Config) -> int:
    """Shared memory a config needs: the operand ring (+ the TMA epilogue buffer, + barriers)."""
    if gemv.is_gemv(cfg):
        return gemv.smem_bytes(cfg)
    if cfg.lane == decode.LANE:
        return decode.smem_bytes(cfg)
    bm, bn, bk = blocks(cfg)
    stages = cfg.param("stages")
    ring = (bm * bk + bn * bk) * ELEMENT_BYTES * stages
    if cfg.lane == "triton_tma":
        epi_bn = bn // 2 if bn >= 128 else bn  # the epilogue is stored in two column halves
        return ring + bm * epi_bn * ELEMENT_BYTES + 1024
    return ring


def arch_reason(cfg: Config, arch_family: str, smem: int | None = None) -> str | None:
    """The signature-independent half of the predicate: can `cfg` run on this arch at all?"""
    if cfg.is_sentinel:
        return None
    if cfg.lane not in TRITON_LANES:
        return f"lane {cfg.lane!r} is not a GEMM lane ({', '.join(LANES)})"
    cap = capability(arch_family)
    if cfg.lane == "triton_tma" and cap < 90:
        return f"triton_tma needs sm90 or newer, not {arch_family}"
    if cap < 80:
        return f"GEMM Triton lanes need sm80 or newer, not {arch_family}"
    if cfg.param("ws") and not ws_supported():
        return "this Triton has no tl.range(warp_specialize=...)"
    if cfg.lane == decode.LANE and (why := decode.arch_reason(cfg, cap)):
        return why
    limit = smem_per_block(arch_family) if smem is None else smem
    need = smem_bytes(cfg)
    if need > limit:
        return f"needs {need} bytes of shared memory; {arch_family} allows {limit} per block"
    return None


def sig_reason(sig: Signature) -> str | None:
    """Why `sig` is not a GEMM signature this family serves (None when it is)."""
    if sig.family != FAMILY:
        return f"signature family {sig.family!r} is not {FAMILY!r}"
    if sig.op not in OPS:
        return f"op {sig.op!r} is not one of {', '.join(OPS)}"
    if sig.dt not in ("half", "fp16", "bf16"):
        return f"dtype {sig.dt!r} is not served; GEMM serves fp16, bf16 (and 'half')"
    n, k = sig.get("N"), sig.get("K")
    if not isinstance(n, int) or not isinstance(k, int) or n < 1 or k < 1:
        return f"signature needs positive integer N and K, got N={n!r} K={k!r}"
    if sig.op == "gemm_act":
        if sig.get("act") not in ACTS:
            return f"act={sig.get('act')!r} is not one of {', '.join(ACTS)}"
        if sig.get("bias") not in (0, 1):
            return f"bias={sig.get('bias')!r} must be 0 or 1"
    return None


def invalid_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    """THE validity predicate: None when `cfg` may run `sig` at M (every M when None) on `arch`."""
    why = sig_reason(sig)
    if why:
        return why
    if m is not None and (not isinstance(m, int) or m < 1):
        return f"M={m!r} must be a positive int"
    if cfg.is_sentinel:
        return _sentinel_reason(cfg.id, sig)
    why = arch_reason(cfg, arch.arch_family, arch.smem_per_block)
    if why:
        return why
    n, k = sig.get("N"), sig.get("K")
    if gemv.is_gemv(cfg):  # PDL's arch and Triton: arch_reason above
        return gemv.gemv_reason(cfg, n, k, m, sig.dt)
    if cfg.lane == decode.LANE:
        return decode.shape_reason(cfg, n, k, m)
    bm, bn, bk = blocks(cfg)
    if cfg.lane == "triton_tma":
        if (k * ELEMENT_BYTES) % TMA_ALIGN_BYTES:
            return f"TMA needs K*2 bytes to be a multiple of 16 (K={k})"
        if (n * ELEMENT_BYTES) % TMA_ALIGN_BYTES:
            return f"TMA needs N*2 bytes to be a multiple of 16 (N={n})"
    if cfg.lane == "triton_splitk":
        split, k_tiles = cfg.param("split_k"), -(-k // bk)
        if split > k_tiles:
            return f"split_k={split} exceeds the {k_tiles} K tiles of K={k} with BK={bk}"
    return None


def _sentinel_reason(name: str, sig: Signature) -> str | None:
    if name in ("default", "torch"):
        return None
    if name == "fused":
        return fused_reason(sig, approximate=None)
    return f"the GEMM family has no {name!r} arm; its sentinels are {', '.join(GEMM_SENTINELS)}"


def fused_reason(sig: Signature, approximate: bool | None) -> str | None:
    """Whether torch._addmm_activation serves `sig` (approximate None: read TUNEDB_APPROXIMATE)."""
    if sig.op != "gemm_act" or sig.get("bias") != 1:
        return "fused (torch._addmm_activation) needs op=gemm_act with bias=1"
    act = sig.get("act")
    if act in ("relu", "gelu_tanh"):
        return None
    if act == "gelu":
        if approximate is None:
            from tunedb import settings

            approximate = settings.approximate_allowed()
        return None if approximate else "fused computes tanh-GELU: serves exact GELU only with TUNEDB_APPROXIMATE=1"
    return f"fused has no {act!r} epilogue (only relu, gelu_tanh, and gelu approximated)"


def sentinels(sig: Signature, approximate: bool = False) -> tuple[str, ...]:
    out = ["default", "torch"]
    if fused_reason(sig, approximate) is None:
        out.append("fused")
    return tuple(out)


def candidates(sig: Signature, m: int | None, arch: ArchProfile,
               lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    """The configs of the space that may run `sig` at M on `arch` (what a build considers)."""
    return tuple(c for c in config_space(arch.arch_family, lanes) if invalid_reason(c, sig, m, arch) is None)


# ---------------------------------------------------------------- default and compile set

DEFAULT_LARGE = "b128x128x64_w8_s3_g8"
DEFAULT_SMALL = "b64x64x64_w4_s3_g8"
DEFAULT_SAFE = "b64x64x32_w4_s3_g8"  # fits every sm80+ arch (48 KiB of shared memory)


def default_config(sig: Signature, arch: ArchProfile | None = None) -> Config:
    """The untuned Triton choice: a 128x128x64 tile when N and K are both >= 1024, else 64x64x64.

    The rule only looks at the signature (M is unknown): wide, deep layers fill the GPU with large
    tiles; narrow ones need more CTAs. When the arch lacks the shared memory, 64x64x32 serves.
    """
    n, k = sig.get("N", 0), sig.get("K", 0)
    cfg = parse(DEFAULT_LARGE if (n >= 1024 and k >= 1024) else DEFAULT_SMALL)
    if arch is not None and arch_reason(cfg, arch.arch_family, arch.smem_per_block) is not None:
        cfg = parse(DEFAULT_SAFE)
    return cfg


# Small M (decode) through split-K and 16/32-row tiles, medium tiles, and large TMA tiles.
COVERAGE_BASIS: tuple[str, ...] = (
    "sk4_b16x64x256_w4_s3", "sk8_b16x64x256_w4_s3", "sk2_b32x128x128_w4_s4", "sk16_b16x32x256_w4_s3",
    "b16x64x256_w4_s3_g8", "b32x64x128_w4_s3_g8", "b64x128x64_w4_s3_g8", "b128x64x64_w4_s4_g8",
    "b128x256x64_w8_s3_g8", "tma_b128x256x64_w8_s3_g8", "tma_b128x128x64_w8_s4_g8",
    "tma_b64x128x64_w4_s4_g8", "tma_b128x256x64_w8_s3_g8_ws",
    "dk1_n64x256_w4_s4", "dk4_n32x256_w4_s4", "gv1_n16x256_w4_s5_lr", "gv1_n32x256_w4_s4_mma",
)


def compile_set(arch_family: str, referenced: Iterable[str], mode: str | None = None) -> tuple[Config, ...]:
    """Configs to compile for `arch_family`: referenced + defaults + coverage basis, or the whole
    space when mode (default: TUNEDB_COMPILE_SET) is 'all'. Malformed or infeasible ids are dropped."""
    if mode is None:
        from tunedb import settings

        mode = settings.compile_set()
    if mode == "all":
        return config_space(arch_family)
    ids = [*referenced, DEFAULT_LARGE, DEFAULT_SMALL, DEFAULT_SAFE, *COVERAGE_BASIS]
    out: dict[str, Config] = {}
    for cid in ids:
        try:
            cfg = parse(cid)
        except ConfigError:
            continue
        if cfg.is_sentinel or cfg.id in out or arch_reason(cfg, arch_family) is not None:
            continue
        out[cfg.id] = cfg
    return tuple(out.values())
