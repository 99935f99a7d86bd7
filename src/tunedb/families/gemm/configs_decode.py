"""The triton_decode lane's configs: id grammar, grid and the lane's half of the validity predicate.

Pure Python (no torch, no triton); `configs.py` owns the family-wide predicate and calls in here.

    dk{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_at][_pdl]      dk4_n64x256_w4_s4, dk8_n32x256_w4_s3_at_pdl

One kernel streams W[N, K] in slabs of BN rows x BK columns (x, M <= 16 rows, padded to a
16-row tile); SPLIT CTAs share an N block, each a contiguous run of K tiles, and the split-K
reduction happens inside the same kernel. Deterministic by default: each split stores its fp32
partial, and the last split to arrive (an atomic counter) sums them in split order, so the same
inputs give the same bits. `_at` configs accumulate with fp32 atomics instead (fewer bytes at
large M, order of additions not fixed). `_pdl` configs launch with programmatic dependent launch
and wait (gdc_wait) only after issuing their first W loads, so W streams while the previous
kernel drains.
"""
from __future__ import annotations

import re
from functools import lru_cache

from tunedb.errors import ConfigError
from tunedb.records import Config

LANE = "triton_decode"
MAX_M = 16  # x rides in one 16-row tensor-core tile
_BN = (16, 32, 64, 128)
_BK = (64, 128, 256, 512)
_WARPS = (2, 4, 8)
_ID = re.compile(r"^dk(?P<split>\d+)_n(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)(?P<at>_at)?(?P<pdl>_pdl)?$")


def matches(config_id: str) -> bool:
    return bool(config_id.startswith("dk") and _ID.match(config_id))


def make(bn: int, bk: int, warps: int, stages: int, split_k: int = 1, atomic: bool = False,
         pdl: bool = False) -> Config:
    """A triton_decode config from explicit parameters (ConfigError naming the bad one)."""
    what = "triton_decode config"
    if bn not in _BN:
        raise ConfigError(f"{what}: BN={bn} not allowed; use one of {_BN}")
    if bk not in _BK:
        raise ConfigError(f"{what}: BK={bk} not allowed; use one of {_BK}")
    if warps not in _WARPS:
        raise ConfigError(f"{what}: warps={warps} not allowed; use one of {_WARPS}")
    if not 1 <= stages <= 8:
        raise ConfigError(f"{what}: stages={stages} not allowed; use 1..8")
    if not 1 <= split_k <= 64:
        raise ConfigError(f"{what}: split_k={split_k} not allowed; use 1..64")
    if atomic and split_k == 1:
        raise ConfigError(f"{what}: _at (atomic reduction) needs split_k >= 2")
    cid = f"dk{split_k}_n{bn}x{bk}_w{warps}_s{stages}" + ("_at" if atomic else "") + ("_pdl" if pdl else "")
    return Config(cid, LANE, (("block", (MAX_M, bn, bk)), ("warps", warps), ("stages", stages),
                              ("group_m", 1), ("split_k", split_k), ("atomic", bool(atomic)), ("pdl", bool(pdl))))


def parse(config_id: str) -> Config:
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(f"bad triton_decode config id {config_id!r}: expected dk4_n64x256_w4_s4[_at][_pdl]")
    try:
        cfg = make(int(m["bn"]), int(m["bk"]), int(m["w"]), int(m["s"]), int(m["split"]),
                   bool(m["at"]), bool(m["pdl"]))
    except ConfigError as exc:
        raise ConfigError(f"bad GEMM config id {config_id!r}: {exc}") from None
    if cfg.id != config_id:
        raise ConfigError(f"GEMM config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def grid() -> list[Config]:
    """The lane's sense-pruned grid (14): 32/64-row x 256 and 32-row x 512 slabs of 4 warps,
    4 stages, split 1..16, deterministic, without PDL. The `_at` and `_pdl` twins parse and pass
    the predicate but stay out of the space until the H200 shows what they buy
    (bench/decode_lane.py): the cost model cannot tell a twin from its original, so a build that
    ranks by it would choose between them by noise."""
    out = []
    for bn, bk in ((32, 256), (64, 256), (32, 512)):
        for split in (1, 2, 4, 8) if bk == 512 else (1, 2, 4, 8, 16):  # K=4096: 8 tiles of 512
            out.append(make(bn, bk, 4, 4, split))
    return out


def smem_bytes(cfg: Config) -> int:
    """The pipelined x and W tiles; the peeled first W tile lives in registers."""
    _, bn, bk = cfg.param("block")
    return (MAX_M * bk + bn * bk) * 2 * cfg.param("stages")


@lru_cache(maxsize=1)
def triton_at_least(major: int, minor: int) -> bool:
    """Whether the installed Triton is at least major.minor, read from its metadata so that this
    pure module never imports triton (False when Triton is not installed)."""
    from importlib import metadata

    try:
        have = tuple(int(x) for x in re.findall(r"\d+", metadata.version("triton"))[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return have >= (major, minor)


def pdl_supported() -> bool:
    """Whether the installed Triton has gdc_wait and the launch_pdl option (3.4+)."""
    return triton_at_least(3, 4)


def arch_reason(cfg: Config, cap: int) -> str | None:
    if cfg.param("pdl"):
        if cap < 90:
            return f"programmatic dependent launch (_pdl) needs sm90 or newer, not sm{cap}"
        if not pdl_supported():
            return "this Triton has no gdc_wait / launch_pdl (programmatic dependent launch needs 3.4+)"
    return None


def shape_reason(cfg: Config, n: int, k: int, m: int | None) -> str | None:
    if m is None:
        return f"triton_decode serves M <= {MAX_M} only, so not every M"
    if m > MAX_M:
        return f"triton_decode serves M <= {MAX_M}, not M={m}"
    _, _, bk = cfg.param("block")
    split, k_tiles = cfg.param("split_k"), -(-k // bk)
    if split > k_tiles:
        return f"split_k={split} exceeds the {k_tiles} K tiles of K={k} with BK={bk}"
    return None
