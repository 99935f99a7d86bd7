"""GEMM configs: stable ids, the config space per lane, THE validity predicate, default, compile set.

Pure Python (no torch, no triton): candidate generation, the cost model, the selector and
`tunedb prebuild` all import this module.

Config ids (format(parse(id)) == id):
    triton_mma     b{BM}x{BN}x{BK}_w{W}_s{S}_g{G}          b128x128x64_w8_s3_g8
    triton_tma     tma_b{BM}x{BN}x{BK}_w{W}_s{S}_g{G}[_ws]  tma_b128x256x64_w8_s3_g8
    triton_splitk  sk{SPLIT}_b{BM}x{BN}x{BK}_w{W}_s{S}      sk4_b16x64x256_w4_s4
    triton_decode  dk{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_at][_pdl] dk4_n64x256_w4_s4  (configs_decode.py)
                   ds_t{T}_n{BN}x{BK}_w{W}[_fma][_at][_pdl] ds_t1_n32x256_w4  (the stream kernel)
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Sequence

from tunedb.errors import ConfigError
from tunedb.families.gemm import configs_decode as decode
from tunedb.records import SENTINELS, ArchProfile, Config, Signature

FAMILY = "gemm"
OPS: tuple[str, ...] = ("gemm", "gemm_act")
TRITON_LANES: tuple[str, ...] = ("triton_mma", "triton_tma", "triton_splitk", decode.LANE)
VENDOR_LANES: tuple[str, ...] = ("torch", "fused")  # the framework's ops (cuBLAS / cuBLASLt)
LANES: tuple[str, ...] = TRITON_LANES + VENDOR_LANES
ACTS: tuple[str, ...] = ("none", "relu", "gelu", "gelu_tanh", "silu")
GEMM_SENTINELS: tuple[str, ...] = ("default", *VENDOR_LANES)
ELEMENT_BYTES = 2  # fp16 / bf16 operands and output
TMA_ALIGN_BYTES = 16

_BLOCKS = (16, 32, 64, 128, 256)
_WARPS = (2, 4, 8)
_ID = re.compile(
    r"^(?:(?P<tma>tma_)|sk(?P<split>\d+)_)?b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)"
    r"_w(?P<w>\d+)_s(?P<s>\d+)(?:_g(?P<g>\d+))?(?P<ws>_ws)?$"
)

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


# ---------------------------------------------------------------- ids

def make(lane: str, bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8,
         split_k: int = 1, ws: bool = False, atomic: bool = False, pdl: bool = False) -> Config:
    """Build a config from explicit parameters; its id follows the format above."""
    if lane not in TRITON_LANES:
        raise ConfigError(f"unknown GEMM lane {lane!r}; Triton lanes are {', '.join(TRITON_LANES)}")
    if lane == decode.LANE:
        if (bm, group_m, ws) != (decode.MAX_M, 1, False):
            raise ConfigError(f"triton_decode configs have BM={decode.MAX_M}, group_m=1 and no _ws, "
                              f"got BM={bm} group_m={group_m} ws={ws}")
        return decode.make(bn, bk, warps, stages, split_k, atomic, pdl)
    if atomic or pdl:
        raise ConfigError(f"{lane} config: atomic and pdl are triton_decode parameters")
    _check_params(lane, bm, bn, bk, warps, stages, group_m, split_k, ws, f"{lane} config")
    if lane == "triton_mma":
        cid = f"b{bm}x{bn}x{bk}_w{warps}_s{stages}_g{group_m}"
    elif lane == "triton_tma":
        cid = f"tma_b{bm}x{bn}x{bk}_w{warps}_s{stages}_g{group_m}" + ("_ws" if ws else "")
    else:
        cid = f"sk{split_k}_b{bm}x{bn}x{bk}_w{warps}_s{stages}"
    params: list[tuple[str, object]] = [("block", (bm, bn, bk)), ("warps", warps), ("stages", stages),
                                        ("group_m", group_m), ("split_k", split_k)]
    if lane == "triton_tma":
        params.append(("ws", ws))
    return Config(cid, lane, tuple(params))


def _check_params(lane, bm, bn, bk, warps, stages, group_m, split_k, ws, what) -> None:
    for name, v in (("BM", bm), ("BN", bn), ("BK", bk)):
        if v not in _BLOCKS:
            raise ConfigError(f"{what}: block {name}={v} not allowed; use one of {_BLOCKS}")
    if warps not in _WARPS:
        raise ConfigError(f"{what}: warps={warps} not allowed; use one of {_WARPS}")
    if not 1 <= stages <= 8:
        raise ConfigError(f"{what}: stages={stages} not allowed; use 1..8")
    if not 1 <= group_m <= 64:
        raise ConfigError(f"{what}: group_m={group_m} not allowed; use 1..64")
    if lane == "triton_splitk":
        if not 2 <= split_k <= 64:
            raise ConfigError(f"{what}: split_k={split_k} not allowed; use 2..64")
        if group_m != 1:
            raise ConfigError(f"{what}: split-K configs use group_m=1, got {group_m}")
    elif split_k != 1:
        raise ConfigError(f"{what}: split_k={split_k} is only allowed on triton_splitk")
    if ws and lane != "triton_tma":
        raise ConfigError(f"{what}: warp specialisation is only allowed on triton_tma")


@lru_cache(maxsize=4096)
def parse(config_id: str) -> Config:
    """A config from its id (sentinels included); ConfigError naming the id when malformed."""
    if not isinstance(config_id, str):
        raise ConfigError(f"config id must be a string, got {config_id!r}")
    if config_id in SENTINELS:
        return Config.sentinel(config_id)
    if config_id.startswith(("dk", "ds")):
        return decode.parse(config_id)
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(
            f"bad GEMM config id {config_id!r}: expected b128x128x64_w8_s3_g8, "
            f"tma_b128x256x64_w8_s3_g8[_ws], sk4_b16x64x256_w4_s4, dk4_n64x256_w4_s4[_at][_pdl], ds_t1_n32x256_w4[_fma][_at][_pdl] or a sentinel ({', '.join(SENTINELS)})"
        )
    if m["tma"]:
        lane = "triton_tma"
    elif m["split"]:
        lane = "triton_splitk"
    else:
        lane = "triton_mma"
    if (lane == "triton_splitk") == (m["g"] is not None):
        raise ConfigError(f"bad GEMM config id {config_id!r}: split-K ids have no _g, other lanes need one")
    try:
        cfg = make(lane, int(m["bm"]), int(m["bn"]), int(m["bk"]), int(m["w"]), int(m["s"]),
                   int(m["g"]) if m["g"] else 1, int(m["split"] or 1), bool(m["ws"]))
    except ConfigError as exc:
        raise ConfigError(f"bad GEMM config id {config_id!r}: {exc}") from None
    if cfg.id != config_id:  # leading zeros etc.
        raise ConfigError(f"GEMM config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def from_json(config_id: str, data: dict) -> Config:
    """Check a DB `configs` entry against its id: the explicit parameters must match the id's."""
    cfg = parse(config_id)
    if not cfg.is_sentinel and dict(cfg.to_json()) != dict(data):
        raise ConfigError(f"config {config_id!r}: parameters {data!r} do not match its id ({cfg.to_json()!r})")
    return cfg


def blocks(cfg: Config) -> tuple[int, int, int]:
    return tuple(cfg.param("block"))  # type: ignore[return-value]


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
    return tuple(_mma_grid() + _tma_grid() + _splitk_grid() + decode.grid())


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
    "dk1_n64x256_w4_s4", "dk4_n32x256_w4_s4",
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
