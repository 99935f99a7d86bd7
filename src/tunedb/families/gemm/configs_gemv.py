"""The GEMM decode lane's bf16/fp16 GEMV configs (`gv`, kernels_gemv.py): ids, a small space and
the rules a `gv` config must meet at a signature and M. Pure Python (no torch, no triton).

    gv{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_mma|_lr][_p{PRE}][_pdl]  gv1_n16x512_w4_s3, gv2_n16x256_w4_s4_mma_pdl,
                                                             gv1_n8x512_w4_s5_lr_p8_pdl

BN rows of W per CTA, BK elements of K per tile (16-byte vectors: 8 two-byte elements), W warps,
S pipeline stages, SPLIT CTAs per slab over contiguous runs of K tiles (reduced in the kernel,
deterministically). Without `_mma` the product is taken on CUDA cores (M <= 4, a bounded
per-thread product tile), summed over K every tile or, `_lr` (late reduction), accumulated as
[BN, BK] products and summed once after the loop; with `_mma` by one tensor-core dot per K tile
(x padded to 16 rows, BN >= 16), any M <= 16. `_p{PRE}` makes the first tile PRE K tiles wide
(PRE in 2, 4, 8): with `_pdl` that much of each CTA's slab is requested before gdc_wait. Bias and every activation of the family run in
the kernel's epilogue (kernels_common.epilogue), so `gemm_act` keys are served too.

The GEMM family's space holds SPACE (session 16 C's winners, a split-4 twin of each path's for
narrow weights, and session 33's one-warp tensor-core slab); configs.invalid_reason calls gemv_reason for every `gv` config.
The bench's wider sweep is gemv_grid(). `rows_padded` and the FMA path's rules (fma_reason) are
also scaled_mm's (its configs_gemv imports them).
"""
from __future__ import annotations

import re

from tunedb.errors import ConfigError
from tunedb.records import Config

LANE = "triton_decode"
MAX_M = 16
GEMV_BN = (4, 8, 16, 32, 64, 128)
GEMV_BK = (64, 128, 256, 512, 1024)
GEMV_WARPS = (1, 2, 4, 8)
MAX_SPLIT = 16
FMA_MAX_M = 4  # past it the CUDA-core product costs more issue slots than the stream leaves
MMA_MIN_BN = 16  # tl.dot's smallest N
# the FMA path's [MP, BN, BK] fp32 product tile per thread, in 32-bit registers: past this it spills
FMA_REGS = 128
# the signature dtypes: the family's 'half' keys are measured in bf16 and served in fp16 or bf16
DTYPES = ("bf16", "fp16", "half")
GV_ID = re.compile(r"^gv(?P<split>[1-9]\d*)_n(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)(?P<mma>_mma)?(?P<lr>_lr)?"
                   r"(?:_p(?P<pre>\d+))?(?P<pdl>_pdl)?$")
PRES = (1, 2, 4, 8)
# the wide first tile's bytes a thread (BN x PRE x BK x 2 over the CTA's threads): 64 registers,
# 128 once converted to fp32; at 512 bytes ptxas spilled (session 34: 255 registers and 200 bytes
# of spill stores for gv1_n8x512_w4_s5_p8_pdl, 1.6x slower than without the wide tile)
PRE_BYTES = 256


def rows_padded(m: int, dot: bool) -> int:
    """The kernel's MP at M = m: 16 for the tensor-core path, else the next power of two >= M."""
    return 16 if dot else 1 << max(0, (m - 1).bit_length())


def slab_reason(bn: int, bk: int, warps: int, stages: int, split_k: int, dot: bool,
                allowed_bn: tuple[int, ...], allowed_bk: tuple[int, ...], mma_min_bn: int) -> str | None:
    """Why a GEMV slab's parameters are not allowed (None when they are): the rules every `gv` id
    family shares (this family's and scaled_mm's, each with its own BN / BK sets and MMA floor)."""
    for name, v, allowed in (("BN", bn, allowed_bn), ("BK", bk, allowed_bk), ("warps", warps, GEMV_WARPS)):
        if v not in allowed:
            return f"{name}={v} not allowed; use one of {allowed}"
    if not 1 <= split_k <= MAX_SPLIT:
        return f"split_k={split_k} not allowed; use 1..{MAX_SPLIT}"
    if not 1 <= stages <= 8:
        return f"stages={stages} not allowed; use 1..8"
    if dot and bn < mma_min_bn:
        return f"_mma needs BN >= {mma_min_bn}, not BN={bn}"
    return None


def make_gemv(bn: int, bk: int, warps: int, stages: int, split_k: int = 1, dot: bool = False,
              pdl: bool = False, late: bool = False, pre: int = 1) -> Config:
    """A `gv` config; ConfigError naming the bad value and what is allowed."""
    why = slab_reason(bn, bk, warps, stages, split_k, dot, GEMV_BN, GEMV_BK, MMA_MIN_BN)
    if why:
        raise ConfigError(f"gemm gemv config: {why}")
    if pre not in PRES:
        raise ConfigError(f"gemm gemv config: PRE={pre} not allowed; use one of {PRES}")
    if pre > 1 and bn * pre * bk * 2 > PRE_BYTES * 32 * warps:  # PRE 1 is the kernel as it always was
        raise ConfigError(f"gemm gemv config: the first tile (BN={bn} x PRE={pre} x BK={bk}, two bytes) needs "
                          f"{bn * pre * bk * 2 // (32 * warps)} bytes a thread on {warps} warps > {PRE_BYTES}")
    if dot and late:
        raise ConfigError("gemm gemv config: _lr (late reduction) is an FMA-path option; _mma has no K sum to defer")
    cid = (f"gv{split_k}_n{bn}x{bk}_w{warps}_s{stages}" + ("_mma" if dot else "") + ("_lr" if late else "")
           + (f"_p{pre}" if pre > 1 else "") + ("_pdl" if pdl else ""))
    params = (("block", (MAX_M, bn, bk)), ("warps", warps), ("stages", stages), ("group_m", 1),
              ("split_k", split_k), ("pdl", bool(pdl)), ("kernel", "gemv"), ("dot", bool(dot)), ("late", bool(late)))
    # PRE = 1 adds no parameter: the configs of tables written before PRE existed stay equal
    return Config(cid, LANE, params + ((("pre", pre),) if pre > 1 else ()))


def is_gemv(cfg: Config) -> bool:
    """Whether `cfg` launches the GEMV kernel (a `gv` config)."""
    return cfg.param("kernel") == "gemv"


def launch_rows(cfg: Config) -> tuple[int, ...]:
    """Every MP (the kernel's padded rows: one binary each) the config launches over the Ms it
    serves: 1, 2, 4 on the FMA path where the register rule admits them, 16 on the tensor-core path."""
    if cfg.param("dot"):
        return (MAX_M,)
    return tuple(mp for mp in (1, 2, 4) if fma_reason(cfg, mp) is None)


def max_m(cfg: Config) -> int:
    """The largest M the config serves, 0 for none (the rules are monotone in M)."""
    return max((m for m in range(1, MAX_M + 1) if fma_reason(cfg, m) is None), default=0)


def parse_gemv(config_id: str) -> Config:
    """The config of a `gv` id; ConfigError when it is not one or not canonical."""
    g = GV_ID.match(config_id)
    if not g:
        raise ConfigError(f"bad gemm gemv config id {config_id!r}: expected gv1_n16x512_w4_s3[_mma|_lr][_p8][_pdl]")
    cfg = make_gemv(int(g["bn"]), int(g["bk"]), int(g["w"]), int(g["s"]), int(g["split"]), bool(g["mma"]),
                    bool(g["pdl"]), bool(g["lr"]), int(g["pre"] or 1))
    if cfg.id != config_id:
        raise ConfigError(f"gemm gemv config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def pdl_twin(cfg: Config) -> Config:
    """The same config with PDL flipped."""
    _, bn, bk = cfg.param("block")
    return make_gemv(bn, bk, cfg.param("warps"), cfg.param("stages"), cfg.param("split_k"),
                     bool(cfg.param("dot")), not cfg.param("pdl"), bool(cfg.param("late")), cfg.param("pre", 1))


def gemv_reason(cfg: Config, n: int, k: int, m: int | None, dt: str = "bf16", pdl_ok: bool = True) -> str | None:
    """Why `cfg` cannot serve (N, K, M, dtype), or None: M <= 16 (<= 4 on the FMA path; None, every
    M, never), the FMA product tile's registers, a K tile for every split, a 2-byte dtype, PDL
    where the Triton has it. No alignment rule: N is wrapped and K's tail masked, and Triton
    specialises the loads on 16-byte alignment (odd N and K run narrower loads, correctly)."""
    if dt not in DTYPES:
        return f"the gemv kernel serves {DTYPES}, not {dt!r}"
    if m is None:
        return f"the gemv kernel serves M <= {MAX_M} only, so not every M"
    if not 1 <= m <= MAX_M:
        return f"the gemv kernel serves 1 <= M <= {MAX_M}, not M={m}"
    if n < 1 or k < 1:
        return f"the gemv kernel needs N, K >= 1, not N={n}, K={k}"
    _, bn, bk = cfg.param("block")
    if cfg.param("split_k") > -(-k // bk):
        return f"split_k={cfg.param('split_k')} > {-(-k // bk)} K tiles of {bk} at K={k}"
    pre = cfg.param("pre", 1)
    if pre > 1 and pre * cfg.param("split_k") > -(-k // bk):
        return (f"_p{pre} needs {pre} K tiles of {bk} in each of {cfg.param('split_k')} split(s); "
                f"K={k} has {-(-k // bk)}")
    if cfg.param("pdl") and not pdl_ok:
        return "_pdl needs Triton 3.4+ (gdc_wait, launch_pdl) on sm90+"
    return fma_reason(cfg, m)


def fma_reason(cfg: Config, m: int) -> str | None:
    """The FMA path's rules at M (None on the tensor-core path): M <= 4 and its [MP, BN, BK]
    product tile within FMA_REGS registers a thread. Shared with scaled_mm's GEMV."""
    if cfg.param("dot"):
        return None
    if m > FMA_MAX_M:
        return f"the gemv FMA path serves M <= {FMA_MAX_M}, not M={m} (its _mma twin serves M <= {MAX_M})"
    _, bn, bk = cfg.param("block")
    per_thread = rows_padded(m, False) * bn * bk // (32 * cfg.param("warps"))
    if per_thread > FMA_REGS:
        return (f"the gemv FMA path's product tile needs {per_thread} registers a thread at M={m} "
                f"(BN={bn}, BK={bk}, {cfg.param('warps')} warps) > {FMA_REGS}")
    return None


def smem_bytes(cfg: Config) -> int:
    """The pipelined W tiles (and x's 16-row tiles on the tensor-core path), all stages counted."""
    _, bn, bk = cfg.param("block")
    return (bn + (MAX_M if cfg.param("dot") else 0)) * bk * 2 * cfg.param("stages")


# The GEMM family's `gv` configs. Session 16 C (bench/decode_gemv_bf16.py --quick, the Llama-3-8B
# decode weights, cold, CUDA graphs) measured 16 slabs; the winners: at M=1 the late-reduction
# FMA slabs 16x256 (3 of 4 weights, 1.06-1.12x cuBLAS) and 8x512 (28672x4096); at M = 4-16 the
# tensor-core slabs 32x256 (the 4096-row weights) and 64x256 (6144 and 28672 rows). Split-2 twins
# lost at every one of those weights (N >= 4096: 128-3584 CTAs unsplit), so only one split twin
# per path is kept, split 4, for the narrow weights (N = 512-2048: 32-128 CTAs unsplit, too few
# to cover HBM latency). Session 34 added s33's one-warp 16-row tensor-core slab (the best gv at
# M = 4-16 on three of four weights; the rebuilt table serves it at 4096x4096, M = 2-14). Its
# PDL twins with 4-8-tile first tiles were measured in the build and never won: the protocol
# times each call after a separator kernel, where a PDL launch has nothing of ours to overlap
# (they win back to back: bench/gv_prefetch.py); the run time launches a served gv config's PDL
# twin where the call follows one of ours in a captured graph (launch_gemv.pdl_switch).
SPACE_IDS: tuple[str, ...] = ("gv1_n16x256_w4_s5_lr", "gv1_n8x512_w4_s5_lr", "gv4_n16x256_w4_s5_lr",
                              "gv1_n32x256_w4_s4_mma", "gv1_n64x256_w4_s3_mma", "gv4_n32x256_w4_s4_mma",
                              "gv1_n16x256_w1_s5_mma")


def space() -> tuple[Config, ...]:
    return tuple(parse_gemv(c) for c in SPACE_IDS)


# The space the bench sweeps: FMA slabs of 4-32 rows x 256-1024 elements of K (2-16 KB a tile;
# the narrow ones fit M=3-4's product tile), tensor-core slabs of 16-64 rows; stages 3 and 5.
FMA_SLABS = ((4, 512, 2), (8, 512, 4), (16, 256, 4), (8, 1024, 4), (16, 512, 4), (16, 512, 8), (32, 512, 8))
MMA_SLABS = ((16, 256, 4), (16, 512, 4), (32, 256, 4), (32, 512, 4), (64, 128, 4), (64, 256, 4), (128, 128, 4))


def gemv_grid() -> tuple[Config, ...]:
    out = []
    for slabs, dot in ((FMA_SLABS, False), (MMA_SLABS, True)):
        for bn, bk, warps in slabs:
            for split in (1, 2, 4, 8):
                for stages in (3, 5):
                    for pdl in (False, True):
                        for late in (False,) if dot else (False, True):
                            out.append(make_gemv(bn, bk, warps, stages, split, dot, pdl, late))
    return tuple(out)
