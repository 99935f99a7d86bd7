"""GEMM's names and config ids: the family's ops, lanes, activations and sentinels, and the id
of every Triton config (make, parse, from_json). Pure Python; configs.py re-exports every name
here with the config space and the validity predicate.

Config ids (format(parse(id)) == id):
    triton_mma     b{BM}x{BN}x{BK}_w{W}_s{S}_g{G}          b128x128x64_w8_s3_g8
    triton_tma     tma_b{BM}x{BN}x{BK}_w{W}_s{S}_g{G}[_ws]  tma_b128x256x64_w8_s3_g8
    triton_splitk  sk{SPLIT}_b{BM}x{BN}x{BK}_w{W}_s{S}      sk4_b16x64x256_w4_s4
    triton_decode  dk{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_at][_pdl] dk4_n64x256_w4_s4  (configs_decode.py)
                   ds_t{T}_n{BN}x{BK}_w{W}[_fma][_at][_pdl] ds_t1_n32x256_w4  (the stream kernel)
                   gv{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_mma|_lr][_p{PRE}][_pdl] gv1_n16x256_w4_s5_lr  (GEMV, configs_gemv.py)
"""
from __future__ import annotations

import re
from functools import lru_cache

from tunedb.errors import ConfigError
from tunedb.families.gemm import configs_decode as decode
from tunedb.families.gemm import configs_gemv
from tunedb.records import SENTINELS, Config

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
    if config_id.startswith("gv"):
        return configs_gemv.parse_gemv(config_id)
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(
            f"bad GEMM config id {config_id!r}: expected b128x128x64_w8_s3_g8, "
            f"tma_b128x256x64_w8_s3_g8[_ws], sk4_b16x64x256_w4_s4, dk4_n64x256_w4_s4[_at][_pdl], ds_t1_n32x256_w4[_fma][_at][_pdl], gv1_n16x256_w4_s5_lr[_p4][_pdl] or a sentinel ({', '.join(SENTINELS)})"
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
