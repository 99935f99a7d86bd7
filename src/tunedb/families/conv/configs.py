"""Convolution configs: ids, the config space, THE validity predicate, the sentinels.

Pure Python (no torch, no triton). Arms (lanes):
    torch          `torch` sentinel: F.conv1d / F.conv2d, cuDNN flags as the process set them
                   (the fallback; benchmark off unless the process turned it on)
    cudnn          cudnn_bench      cuDNN with its own autotuner (cudnn.benchmark=True)
                   cudnn_cl         channels-last input (conv1d as [B, C, 1, T]), benchmark=False
                   cudnn_cl_bench   channels-last with the autotuner
    triton_dw      dw_t{BT}_c{BC}_w{W}             direct depthwise conv1d  dw_t64_c64_w4
    triton_igemm   ig_b{BM}x{BN}x{BK}_w{W}_s{S}    implicit GEMM            ig_b128x64x32_w4_s3
`default` (the untuned choice) runs `torch`.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Sequence

from tunedb.arch import planning_smem_per_block as smem_per_block
from tunedb.errors import ConfigError
from tunedb.families.conv import keys
from tunedb.families.tile_ids import TileIds, canonical
from tunedb.records import ArchProfile, Config, Signature

CUDNN_ARMS: tuple[str, ...] = ("cudnn_bench", "cudnn_cl", "cudnn_cl_bench")
TRITON_LANES: tuple[str, ...] = ("triton_dw", "triton_igemm")
LANES: tuple[str, ...] = ("torch", "cudnn") + TRITON_LANES
FAMILY_SENTINELS: tuple[str, ...] = ("default", "torch")
FALLBACK_PEERS: tuple[str, ...] = ("cudnn_bench",)  # as safe as `torch` (cuDNN itself): the pick rule's peers
INDEX_LIMIT = 2**31 - 1  # the Triton kernels index x and y with int32 offsets

_DW_T = (32, 64, 128, 256)
_DW_C = (8, 16, 32, 64, 128)
_WARPS = (1, 2, 4, 8)
_DW_ID = re.compile(r"^dw_t(?P<t>\d+)_c(?P<c>\d+)_w(?P<w>\d+)$")
_IG = TileIds("conv", (("triton_igemm", "ig"),), FAMILY_SENTINELS, "ig_b128x64x32_w4_s3", blocks_m=(32, 64, 128),
              blocks_n=(32, 64, 128), blocks_k=(16, 32, 64), warps=_WARPS, stages=range(1, 6),
              owner="the conv family")


def make_dw(bt: int, bc: int, warps: int) -> Config:
    for name, v, allowed in (("BT", bt, _DW_T), ("BC", bc, _DW_C), ("warps", warps, _WARPS)):
        if v not in allowed:
            raise ConfigError(f"triton_dw config: {name}={v} not allowed; use one of {allowed}")
    return Config(f"dw_t{bt}_c{bc}_w{warps}", "triton_dw", (("block", (bt, bc)), ("warps", warps)))


def make_ig(bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    return _IG.make(bm, bn, bk, warps, stages)


@lru_cache(maxsize=1024)
def parse(config_id: str) -> Config:
    """A config from its id (sentinels and cuDNN arms included); ConfigError naming it otherwise."""
    cfg = _IG.sentinel(config_id)
    if cfg is not None:
        return cfg
    if config_id in CUDNN_ARMS:
        return Config(config_id, "cudnn", (("benchmark", int(config_id.endswith("bench"))),
                                           ("channels_last", int("_cl" in config_id))))
    m = _DW_ID.match(config_id)
    if m:
        return canonical(config_id, make_dw(int(m["t"]), int(m["c"]), int(m["w"])))
    cfg = _IG.match(config_id)
    if cfg is None:
        raise ConfigError(f"bad conv config id {config_id!r}: expected dw_t64_c64_w4, ig_b128x64x32_w4_s3, "
                          f"one of {', '.join(CUDNN_ARMS)} or a sentinel ({', '.join(FAMILY_SENTINELS)})")
    return cfg


# The tuned space, kept small because a build without a cost model measures every valid config
# at every point: the direct kernel's tiles from 1K to 8K outputs per CTA, and implicit-GEMM
# tiles for a short reduction (BK 16: the first subsampling conv's Cin * 9 = 9) and long ones.
_DW_GRID = ((32, 32, 4), (32, 64, 4), (32, 128, 4), (64, 16, 4), (64, 32, 4), (64, 64, 4), (64, 128, 8),
            (128, 16, 4), (128, 32, 4), (128, 64, 8), (256, 16, 4), (256, 32, 8))
_IG_GRID = ((32, 32, 16, 4, 2), (64, 64, 16, 4, 2), (128, 64, 16, 4, 2), (128, 128, 16, 8, 2),
            (64, 64, 32, 4, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 128, 32, 8, 3),
            (128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 3))


def full_grid() -> tuple[Config, ...]:
    """Every config of the tuned space (parse() accepts any id the grammar allows)."""
    return (tuple(parse(c) for c in CUDNN_ARMS) + tuple(make_dw(*t) for t in _DW_GRID)
            + tuple(make_ig(*t) for t in _IG_GRID))


def smem_bytes(cfg: Config) -> int:
    """Pipelined operand tiles of the implicit GEMM (2-byte elements); the direct kernel keeps
    nothing in shared memory but its layout conversion (one fp32 tile)."""
    if cfg.lane == "triton_igemm":
        bm, bn, bk = cfg.param("block")
        return max(cfg.param("stages") * (bm + bn) * bk * keys.ELEM_BYTES, bm * bn * 4)
    if cfg.lane == "triton_dw":
        bt, bc = cfg.param("block")
        return bt * bc * 4
    return 0


def config_space(arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    wanted = set(lanes or LANES)
    bad = wanted - set(LANES)
    if bad:
        raise ConfigError(f"unknown conv lane(s) {sorted(bad)}; lanes are {', '.join(LANES)}")
    smem = smem_per_block(arch_family)
    return tuple(c for c in full_grid() if c.lane in wanted and smem_bytes(c) <= smem)


def is_depthwise(sig: Signature) -> bool:
    return sig.op == "conv1d" and sig.get("g") == sig.get("Cin") == sig.get("Cout")


def invalid_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    """THE validity predicate: None when `cfg` may run `sig` at size m (every size when None)."""
    why = keys.sig_reason(sig) or lane_reason(cfg, sig)
    if why or cfg.lane not in TRITON_LANES:
        return why
    if smem_bytes(cfg) > arch.smem_per_block:
        return f"needs {smem_bytes(cfg)} B of shared memory > {arch.smem_per_block}"
    if m is not None:
        b, length = keys.shape_for(sig, m)
        return size_reason(b * sig.get("Cin") * length * (sig.get("W") or 1), m * sig.get("Cout"))
    return None


def size_reason(x_elems: int, y_elems: int) -> str | None:
    """The Triton kernels' int32 offsets (also asked at run time with a call's real sizes)."""
    if max(x_elems, y_elems) > INDEX_LIMIT:
        return f"{max(x_elems, y_elems)} elements overflow the Triton kernels' int32 offsets (limit {INDEX_LIMIT})"
    return None


def lane_reason(cfg: Config, sig: Signature) -> str | None:
    """The part of the predicate that holds at every size and on every arch: which arms can
    compute this key at all."""
    if cfg.id in FAMILY_SENTINELS or cfg.lane == "cudnn":
        return None
    if cfg.is_sentinel:
        return f"sentinel {cfg.id!r} is not an arm of the conv family"
    if cfg.lane == "triton_dw":
        return None if is_depthwise(sig) else "triton_dw runs depthwise conv1d only (g == Cin == Cout)"
    if cfg.lane == "triton_igemm":
        if sig.get("g") != 1:
            return f"triton_igemm runs dense convolutions only (g=1), g={sig.get('g')}"
        bk = cfg.param("block")[2]
        k_total = sig.get("Cin") * taps(sig)
        if bk > 16 and k_total <= bk // 2:
            return f"BK={bk} for a reduction of {k_total}: more than half of every K tile is padding"
        return None
    return f"unknown conv lane {cfg.lane!r}"


def taps(sig: Signature) -> int:
    n = 1
    for v in keys.geometry(sig)["k"]:
        n *= v
    return n


def sentinels(sig: Signature, approximate: bool = False) -> tuple[str, ...]:
    return FAMILY_SENTINELS


def default_config(sig: Signature, arch: ArchProfile | None = None) -> Config:
    """The untuned choice: torch's own convolution (cuDNN, the process's flags)."""
    return Config.sentinel("torch")


# A small coverage basis compiled even when nothing references it (the direct kernel's middle
# tile, one implicit-GEMM tile per operand size).
_BASIS = ("dw_t64_c64_w4", "ig_b64x64x32_w4_s3", "ig_b128x128x32_w8_s3")


def compile_set(arch_family: str, referenced: Iterable[str], mode: str | None = None) -> tuple[Config, ...]:
    from tunedb import settings

    mode = mode or settings.compile_set()
    smem = smem_per_block(arch_family)
    chosen = {c.id: c for c in (config_space(arch_family) if mode == "all" else ())}
    for cid in tuple(_BASIS) + tuple(referenced):
        try:
            c = parse(cid)
        except ConfigError:
            continue
        if smem_bytes(c) <= smem:
            chosen.setdefault(c.id, c)
    for name in FAMILY_SENTINELS:
        chosen.setdefault(name, Config.sentinel(name))
    return tuple(chosen.values())


def simplicity(config_id: str) -> int:
    """Lower is simpler: torch, then the cuDNN variants, then Triton kernels."""
    if config_id in FAMILY_SENTINELS:
        return 0
    if config_id in CUDNN_ARMS:
        return 1
    return 2
