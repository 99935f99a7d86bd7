"""The triton_decode lane's GEMV configs (`gv`, kernels_gemv.py): ids, their space and their part
of the family's ONE validity predicate (configs.invalid_reason calls gemv_reason). Pure Python.

    gv{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_mma][_pdl]      gv1_n16x512_w4_s3, gv2_n16x256_w4_s4_mma_pdl

Without `_mma` the product is taken on CUDA cores (fp8/int8 converted in registers): M <= 4 and
a bounded per-thread product tile; with `_mma` by one tensor-core dot per K tile, the weight slab
on the MMA's M side (w [BN, BK] @ x^T [BK, 16], x's rows past M zero-filled, not read; BN >= 16:
the 8-bit MMA's smallest tile; BN >= 64 with 4 warps a warpgroup MMA), any M <= 16. Splits are
reduced in the kernel.
"""
from __future__ import annotations

import re

from tunedb.errors import ConfigError
from tunedb.families.gemm.configs_gemv import FMA_MAX_M, FMA_REGS, fma_reason, rows_padded  # noqa: F401 - re-exported
from tunedb.families.gemm.configs_gemv import GEMV_WARPS, MAX_SPLIT, slab_reason  # noqa: F401 - re-exported
from tunedb.records import Config

GEMV_BN = (4, 8, 16, 32, 64, 128)
GEMV_BK = (128, 256, 512, 1024)
# the FMA path's rules (M <= FMA_MAX_M, its [MP, BN, BK] product tile within FMA_REGS registers a
# thread) and the kernel's padded rows are the bf16 GEMV's: one definition (gemm/configs_gemv.py)
MMA_MIN_BN = 16
GV_ID = re.compile(r"^gv(?P<split>\d+)_n(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)(?P<mma>_mma)?(?P<pdl>_pdl)?$")


def make_gemv(bn: int, bk: int, warps: int, stages: int, split_k: int = 1, dot: bool = False,
              pdl: bool = False) -> Config:
    """A `gv` config of the triton_decode lane; ConfigError naming the bad value."""
    why = slab_reason(bn, bk, warps, stages, split_k, dot, GEMV_BN, GEMV_BK, MMA_MIN_BN)
    if why:
        raise ConfigError(f"triton_decode gemv config: {why}")
    cid = f"gv{split_k}_n{bn}x{bk}_w{warps}_s{stages}" + ("_mma" if dot else "") + ("_pdl" if pdl else "")
    return Config(cid, "triton_decode", (("block", (16, bn, bk)), ("warps", warps), ("stages", stages),
                                         ("group_m", 1), ("split_k", split_k), ("pdl", bool(pdl)),
                                         ("kernel", "gemv"), ("dot", bool(dot))))


def parse_gemv(config_id: str) -> Config | None:
    """The config of a `gv` id (None when the id is not one); ConfigError when malformed."""
    g = GV_ID.match(config_id)
    if not g:
        return None
    cfg = make_gemv(int(g["bn"]), int(g["bk"]), int(g["w"]), int(g["s"]), int(g["split"]), bool(g["mma"]),
                    bool(g["pdl"]))
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def is_gemv(cfg: Config) -> bool:
    return cfg.param("kernel") == "gemv"


def gemv_reason(cfg: Config, m: int) -> str | None:
    """The gemv part of the predicate at M (the caller has checked M <= 16, the splits against
    K's tiles and PDL's arch): the FMA path's M and register bounds (gemm's fma_reason)."""
    return fma_reason(cfg, m)


# The space: FMA slabs of 4-32 rows x 256-1024 bytes of K (2-16 KB a tile; the narrow ones fit
# M=3-4's product tile); tensor-core slabs of 16-128 rows, one warp per 16 rows up to a warpgroup
# (64+ rows on 4 warps: wgmma m64n16k32, the weight read from shared memory by the tensor cores, no
# per-byte instructions), 4-16 KB a tile; stages 3 and 5 (bytes in flight per CTA; 4 too for the
# tensor-core slabs: 4 x 20 KB of a 64 x 256 slab keeps two CTAs on an SM, 5 one), splits 1-8,
# each with PDL.
_FMA_SLABS = ((4, 512, 2), (4, 1024, 2), (8, 256, 2), (8, 512, 2), (16, 256, 4), (8, 1024, 4), (16, 512, 4), (16, 1024, 8), (32, 512, 8))
_MMA_SLABS = ((16, 256, 1), (16, 512, 1), (32, 256, 2), (32, 256, 4), (32, 512, 2), (64, 128, 4), (64, 256, 4),
              (128, 128, 4))


def gemv_grid() -> tuple[Config, ...]:
    out = []
    for slabs, dot in ((_FMA_SLABS, False), (_MMA_SLABS, True)):
        for bn, bk, warps in slabs:
            for split in (1, 2, 4, 8):
                for stages in (3, 5) if not dot else (3, 4, 5):
                    for pdl in (False, True):
                        out.append(make_gemv(bn, bk, warps, stages, split, dot, pdl))
    return tuple(out)
