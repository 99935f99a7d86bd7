"""Quantized-GEMM configs: ids, the config space, THE validity predicate, the heuristic.

Pure Python (no torch, no triton). Both families (`scaled_mm`: int8, `scaled_mm_fp8`: fp8
e4m3) share one config space: a Triton tile computes either operand type, and only the
predicate's arch, scale-mode and alignment rules differ.

Config ids (format(parse(id)) == id, the GEMM family's grammar):
    triton_mma     b{BM}x{BN}x{BK}_w{W}_s{S}_g{G}     b128x128x128_w8_s3_g8
    triton_tma     tma_b{BM}x{BN}x{BK}_w{W}_s{S}_g{G} tma_b128x256x128_w8_s3_g8
    triton_splitk  sk{SPLIT}_b{BM}x{BN}x{BK}_w{W}_s{S}  sk4_b16x64x128_w4_s4
    triton_decode  dk{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_pdl]  dk8_n32x256_w4_s4, dk16_n64x128_w4_s6_pdl
                   gv{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_mma][_pdl]  gv1_n16x512_w4_s3 (configs_gemv.py)
The decode lane (M <= 16: a weight stream) is one kernel with its split-K reduced inside it by
the last-arriving CTA of each N slab, in split order (int32 partials for int8: exact); `_pdl`
launches it with programmatic dependent launch (its first weight tile loads while the previous
kernel drains; sm90+, Triton 3.4+).
Sentinels: `heuristic` (the family's untuned choice: a shape rule, resolved per M: the vendor
op for fp8 per-tensor / row-wise scales, else a data-parallel tile; `default` is accepted as its alias) and `torch` (torch._int_mm + a scale epilogue for int8,
torch._scaled_mm for fp8 per-tensor and row-wise).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Sequence

from tunedb.errors import ConfigError
from tunedb.families.scaled_mm.configs_gemv import gemv_grid, gemv_reason, is_gemv, parse_gemv
from tunedb.records import SENTINELS, ArchProfile, Config, Signature

INT8_FAMILY = "scaled_mm"
FP8_FAMILY = "scaled_mm_fp8"
FAMILIES = (INT8_FAMILY, FP8_FAMILY)
OPS: tuple[str, ...] = ("scaled_mm", "scaled_mm_quant")
TRITON_LANES: tuple[str, ...] = ("triton_mma", "triton_tma", "triton_splitk", "triton_decode")
VENDOR_LANES: tuple[str, ...] = ("torch",)
LANES: tuple[str, ...] = TRITON_LANES + VENDOR_LANES
FAMILY_SENTINELS: tuple[str, ...] = ("heuristic", "torch")
# scale modes: per-tensor, per-row (activation per token x weight per output channel), blocks
# (1x128 activation, 128x128 weight: DeepSeek-V3's recipe)
SCALES: dict[str, tuple[str, ...]] = {INT8_FAMILY: ("row",), FP8_FAMILY: ("tensor", "row", "block")}
SCALE_BLOCK = 128
OUTS: dict[tuple[str, str], tuple[str, ...]] = {
    (INT8_FAMILY, "scaled_mm"): ("bf16", "fp16"),
    (INT8_FAMILY, "scaled_mm_quant"): ("int8",),
    (FP8_FAMILY, "scaled_mm"): ("bf16",),
    (FP8_FAMILY, "scaled_mm_quant"): ("fp8",),
}
MIN_CAPABILITY = {INT8_FAMILY: 80, FP8_FAMILY: 89}
INT_MM_MIN_M = 16  # torch._int_mm refuses M <= 16
INT_MM_ALIGN = 8  # and needs K and N multiples of 8
SCALED_MM_ALIGN = 16  # cuBLASLt fp8: K and N multiples of 16
TMA_ALIGN = 16  # tensor descriptors: 16-byte row strides (K one-byte elements)

_BLOCKS_M = (16, 32, 64, 128)
_BLOCKS_N = (32, 64, 128, 256)
_BLOCKS_K = (32, 64, 128, 256)  # 8-bit MMA consumes K in steps of 32
_WARPS = (2, 4, 8)
_SPLITS = (2, 3, 4, 8, 16)
_ID = re.compile(r"^(?:(?P<tma>tma_)|sk(?P<split>\d+)_)?b(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)(?:_g(?P<g>\d+))?$")
DECODE_MAX_M = 16  # the decode lane's x rides in one 16-row tensor-core tile
_DECODE_BN = (16, 32, 64, 128)
_DECODE_BK = (64, 128, 256, 512)
_DECODE_SPLITS = (1, 2, 4, 8, 16, 32)
_DK_ID = re.compile(r"^dk(?P<split>\d+)_n(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)(?P<pdl>_pdl)?$")
_SMEM_BY_ARCH = {"sm80": 166912, "sm86": 101376, "sm89": 101376, "sm90": 232448, "sm100": 232448,
                 "sm120": 101376}


@lru_cache(maxsize=None)
def capability(arch_family: str) -> int:
    m = re.match(r"^sm(\d+)a?$", arch_family or "")
    if not m:
        raise ConfigError(f"bad arch family {arch_family!r}: expected sm<digits> such as sm90")
    return int(m.group(1))


def make_decode(bn: int, bk: int, warps: int, stages: int, split_k: int = 1, pdl: bool = False) -> Config:
    """A triton_decode config (M <= 16; block (16, BN, BK)); ConfigError naming the bad value."""
    for name, v, allowed in (("BN", bn, _DECODE_BN), ("BK", bk, _DECODE_BK), ("warps", warps, _WARPS)):
        if v not in allowed:
            raise ConfigError(f"triton_decode config: {name}={v} not allowed; use one of {allowed}")
    if not 1 <= split_k <= 32:
        raise ConfigError(f"triton_decode config: split_k={split_k} not allowed; use 1..32")
    if not 1 <= stages <= 8:
        raise ConfigError(f"triton_decode config: stages={stages} not allowed; use 1..8")
    cid = f"dk{split_k}_n{bn}x{bk}_w{warps}_s{stages}" + ("_pdl" if pdl else "")
    return Config(cid, "triton_decode", (("block", (DECODE_MAX_M, bn, bk)), ("warps", warps), ("stages", stages),
                                         ("group_m", 1), ("split_k", split_k), ("pdl", bool(pdl))))


def make(lane: str, bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int = 8,
         split_k: int = 1) -> Config:
    what = f"{lane} config"
    if lane == "triton_decode":
        if bm != DECODE_MAX_M or group_m != 1:
            raise ConfigError(f"{what}: BM must be {DECODE_MAX_M} and group_m 1 (got {bm}, {group_m})")
        return make_decode(bn, bk, warps, stages, split_k)
    if lane not in TRITON_LANES:
        raise ConfigError(f"unknown scaled_mm lane {lane!r}; Triton lanes are {', '.join(TRITON_LANES)}")
    for name, v, allowed in (("BM", bm, _BLOCKS_M), ("BN", bn, _BLOCKS_N), ("BK", bk, _BLOCKS_K),
                             ("warps", warps, _WARPS)):
        if v not in allowed:
            raise ConfigError(f"{what}: {name}={v} not allowed; use one of {allowed}")
    if not 1 <= stages <= 6:
        raise ConfigError(f"{what}: stages={stages} not allowed; use 1..6")
    if lane == "triton_splitk":
        if split_k not in _SPLITS or group_m != 1:
            raise ConfigError(f"{what}: split_k={split_k} (allowed {_SPLITS}) with group_m=1 (got {group_m})")
        cid = f"sk{split_k}_b{bm}x{bn}x{bk}_w{warps}_s{stages}"
    else:
        if split_k != 1 or not 1 <= group_m <= 64:
            raise ConfigError(f"{what}: split_k must be 1 and group_m in 1..64 (got {split_k}, {group_m})")
        cid = ("tma_" if lane == "triton_tma" else "") + f"b{bm}x{bn}x{bk}_w{warps}_s{stages}_g{group_m}"
    return Config(cid, lane, (("block", (bm, bn, bk)), ("warps", warps), ("stages", stages),
                              ("group_m", group_m), ("split_k", split_k)))


@lru_cache(maxsize=4096)
def parse(config_id: str) -> Config:
    """A config from its id (sentinels included); ConfigError naming the id when malformed."""
    if not isinstance(config_id, str):
        raise ConfigError(f"config id must be a string, got {config_id!r}")
    if config_id in SENTINELS:
        if config_id not in FAMILY_SENTINELS + ("default",):
            raise ConfigError(f"the scaled_mm families have no {config_id!r} arm; "
                              f"sentinels: {', '.join(FAMILY_SENTINELS)}")
        return Config.sentinel(config_id)
    g = parse_gemv(config_id)
    if g is not None:
        return g
    d = _DK_ID.match(config_id)
    if d:
        cfg = make_decode(int(d["bn"]), int(d["bk"]), int(d["w"]), int(d["s"]), int(d["split"]), bool(d["pdl"]))
        if cfg.id != config_id:
            raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
        return cfg
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(f"bad scaled_mm config id {config_id!r}: expected b128x128x128_w8_s3_g8, "
                          f"sk4_b16x64x128_w4_s4, dk8_n32x256_w4_s4[_pdl], gv1_n16x512_w4_s3[_mma][_pdl] or a sentinel ({', '.join(FAMILY_SENTINELS)})")
    nums = {k: int(v) for k, v in m.groupdict().items() if v is not None and k != "tma"}
    if "split" in nums:
        if "g" in nums:
            raise ConfigError(f"bad scaled_mm config id {config_id!r}: split-K ids carry no _g")
        cfg = make("triton_splitk", nums["bm"], nums["bn"], nums["bk"], nums["w"], nums["s"], 1, nums["split"])
    else:
        if "g" not in nums:
            raise ConfigError(f"bad scaled_mm config id {config_id!r}: a data-parallel id ends in _g<G>")
        lane = "triton_tma" if m["tma"] else "triton_mma"
        cfg = make(lane, nums["bm"], nums["bn"], nums["bk"], nums["w"], nums["s"], nums["g"])
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def blocks(cfg: Config) -> tuple[int, int, int]:
    return tuple(cfg.param("block"))  # type: ignore[return-value]


def full_grid() -> tuple[Config, ...]:
    """Every Triton config the families know (before any arch or shape rule)."""
    out = []
    for bm in _BLOCKS_M:
        for bn in (64, 128, 256):
            for bk in (64, 128):
                for w in (4, 8):
                    if w == 8 and bm * bn < 64 * 128:
                        continue  # 8 warps on a small tile only idle
                    for s in (3, 4):
                        out.append(make("triton_mma", bm, bn, bk, w, s))
    for bm, bn, bk, w, s in ((128, 128, 128, 8, 3), (128, 128, 128, 8, 4), (128, 256, 128, 8, 3),
                             (128, 256, 64, 8, 4), (64, 128, 128, 4, 4), (128, 128, 64, 4, 4),
                             (64, 256, 128, 8, 3), (64, 64, 128, 4, 4)):
        out.append(make("triton_tma", bm, bn, bk, w, s))
    for split in (2, 4, 8):
        for bm in (16, 32, 64):
            for bn in (64, 128):
                for s in (3, 4):
                    out.append(make("triton_splitk", bm, bn, 128, 4, s, 1, split))
    return tuple(out) + decode_grid()


# The decode lane's slabs (BN x BK bytes of weight per stage): narrow N tiles so that enough CTAs
# stream at once, K blocks of 128 (the only ones block scales allow) to 512; 8 warps on the widest.
_DECODE_SLABS = ((32, 128), (64, 128), (128, 128), (32, 256), (64, 256), (32, 512))


def decode_grid() -> tuple[Config, ...]:
    """The triton_decode space: every `dk` slab x split 1..32 x 4 or 6 stages, each with and without
    PDL, then the `gv` GEMV configs (configs_gemv.gemv_grid); the pruning model ranks them, the
    predicate drops splits beyond K's tiles and FMA configs past their M."""
    out = []
    for bn, bk in _DECODE_SLABS:
        for split in _DECODE_SPLITS:
            for stages in (4, 6):
                for pdl in (False, True):
                    out.append(make_decode(bn, bk, 8 if bn >= 128 else 4, stages, split, pdl))
    return tuple(out) + gemv_grid()


def config_space(arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    wanted = set(lanes or TRITON_LANES)
    bad = wanted - set(LANES)
    if bad:
        raise ConfigError(f"unknown scaled_mm lane(s) {sorted(bad)}; lanes are {', '.join(LANES)}")
    smem = smem_per_block(arch_family)
    return tuple(c for c in full_grid() if c.lane in wanted and smem_bytes(c) <= smem)


def smem_per_block(arch_family: str) -> int:
    capability(arch_family)
    return _SMEM_BY_ARCH.get(arch_family, 101376)


def smem_bytes(cfg: Config) -> int:
    """Pipelined operand buffers (one byte per element) or the epilogue's fp32 layout-conversion
    scratch, whichever is larger: Triton's allocator reuses the pipeline's buffers after the loop."""
    bm, bn, bk = blocks(cfg)
    return max(cfg.param("stages") * (bm + bn) * bk, bm * bn * 4)


def sig_reason(sig: Signature) -> str | None:
    """Why a signature is not one of these families' keys (None when it is)."""
    if sig.family not in FAMILIES:
        return f"family {sig.family!r} is not one of {', '.join(FAMILIES)}"
    if sig.op not in OPS:
        return f"op={sig.op!r} is not one of {', '.join(OPS)}"
    want_dt = "int8" if sig.family == INT8_FAMILY else "fp8"
    if sig.dt != want_dt:
        return f"dt={sig.dt!r}: family {sig.family} takes dt={want_dt}"
    for key in ("N", "K"):
        v = sig.get(key)
        if not isinstance(v, int) or v < 1:
            return f"{key}={v!r} must be a positive int"
    scale = sig.get("scale", "row")
    if scale not in SCALES[sig.family]:
        return f"scale={scale!r} not allowed; {sig.family} takes {', '.join(SCALES[sig.family])}"
    out = sig.get("out")
    allowed = OUTS[(sig.family, sig.op)]
    if out not in allowed:
        return f"out={out!r} not allowed for op={sig.op}; allowed: {', '.join(allowed)}"
    return None


def invalid_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    """THE validity predicate: None when `cfg` may run `sig` at M (any M when m is None)."""
    why = sig_reason(sig)
    if why:
        return why
    cap = capability(arch.arch_family)
    k = sig.get("K")
    scale = sig.get("scale", "row")
    if cap < MIN_CAPABILITY[sig.family]:
        return f"{sig.family} needs sm{MIN_CAPABILITY[sig.family]}+ ({arch.arch_family})"
    if cfg.id in ("heuristic", "default"):
        return None
    if cfg.id == "torch":
        return torch_reason(sig, m)
    if cfg.is_sentinel:
        return f"sentinel {cfg.id!r} is not an arm of {sig.family}"
    bm, bn, bk = blocks(cfg)
    if scale == "block" and SCALE_BLOCK % bk:
        return f"block scales need BLOCK_K dividing {SCALE_BLOCK} (BK={bk})"
    if smem_bytes(cfg) > arch.smem_per_block:
        return f"needs {smem_bytes(cfg)} B of shared memory > {arch.smem_per_block}"
    if cfg.lane == "triton_tma":
        if cap < 90:
            return f"triton_tma needs sm90+ tensor descriptors ({arch.arch_family})"
        if k % TMA_ALIGN:
            return f"triton_tma needs K a multiple of {TMA_ALIGN} (16-byte operand rows), K={k}"
    if cfg.lane == "triton_decode":
        return decode_reason(cfg, k, m, cap)
    if cfg.lane == "triton_splitk":
        split, k_tiles = cfg.param("split_k"), -(-k // bk)
        if split > k_tiles:
            return f"split_k={split} > {k_tiles} K tiles of {bk}"
        if -(-k_tiles // split) * (split - 1) >= k_tiles:
            return f"split_k={split} over {k_tiles} K tiles leaves a split without work"
    return None


def decode_reason(cfg: Config, k: int, m: int | None, cap: int) -> str | None:
    """The decode lane's part of the predicate: M <= 16 only (so not for every M), at least one K
    tile per split, and PDL on sm90+ with a Triton that has it."""
    if m is None:
        return f"triton_decode serves M <= {DECODE_MAX_M} only, so not every M"
    if m > DECODE_MAX_M:
        return f"triton_decode serves M <= {DECODE_MAX_M}, not M={m}"
    _, _, bk = blocks(cfg)
    split, k_tiles = cfg.param("split_k"), -(-k // bk)
    if split > k_tiles:
        return f"split_k={split} > {k_tiles} K tiles of {bk}"
    if cfg.param("pdl"):
        if cap < 90:
            return f"programmatic dependent launch (_pdl) needs sm90+, not sm{cap}"
        from tunedb.families.gemm.configs_decode import pdl_supported

        if not pdl_supported():
            return "this Triton has no gdc_wait / launch_pdl (programmatic dependent launch needs 3.4+)"
    if is_gemv(cfg):
        return gemv_reason(cfg, m)
    return None


def torch_reason(sig: Signature, m: int | None) -> str | None:
    """Where the vendor arm cannot run: torch._int_mm's M > 16 and 8-alignment rules;
    torch._scaled_mm's 16-alignment, and no block scales (not offered by this arm)."""
    n, k = sig.get("N"), sig.get("K")
    if sig.family == INT8_FAMILY:
        if m is not None and m <= INT_MM_MIN_M:
            return f"torch._int_mm refuses M <= {INT_MM_MIN_M} (M={m})"
        if n % INT_MM_ALIGN or k % INT_MM_ALIGN:
            return f"torch._int_mm needs N and K multiples of {INT_MM_ALIGN} (N={n}, K={k})"
        return None
    if sig.get("scale") == "block":
        return "torch._scaled_mm's block-scaled recipe is not an arm here (tensor and row scales only)"
    if n % SCALED_MM_ALIGN or k % SCALED_MM_ALIGN:
        return f"torch._scaled_mm needs N and K multiples of {SCALED_MM_ALIGN} (N={n}, K={k})"
    return None


def sentinels(sig: Signature, approximate: bool = False) -> tuple[str, ...]:
    return FAMILY_SENTINELS if torch_reason(sig, None) is None else ("heuristic",)


# The heuristic's tiles, largest first; BK 128 serves every scale mode (it divides the block).
_HEURISTIC_TILES = ((128, 256, 8, 3), (128, 128, 8, 3), (64, 128, 4, 4), (64, 64, 4, 4),
                    (32, 64, 4, 4), (16, 64, 4, 4))
# The revision of the `heuristic` rule per family: what a table region naming `heuristic` was
# measured as. fp8 rule 1 was the half-wave tile for every scale mode; rule 2 (issue 20, session
# 13) serves torch._scaled_mm for per-tensor and row-wise scales, where the tile ran at 0.34-0.45x
# of the vendor op on widths no table named (Whisper-large at M=2048; 14336x4096 at M=1: 3x).
# The family's impl_hash carries the revision, so an entry measured under another one reads
# stale in `tunedb status` (docs/scaled_mm.md, "The heuristic").
HEURISTIC_RULE = {INT8_FAMILY: 1, FP8_FAMILY: 2}


def vendor_heuristic(sig: Signature, m: int | None = None) -> bool:
    """Whether the `heuristic` rule names the vendor op for `sig`: fp8 per-tensor or row-wise
    scales where torch._scaled_mm runs (N, K multiples of 16). Not block scales (no vendor arm
    here) and not int8: torch._int_mm refuses M <= 16, and with its separate scale epilogue it ran
    at 0.4-0.6x of the Triton tile at M=2048 on the H200 (session 13 A2), so the tile stays. Not
    the `_quant` op either: there the vendor op is followed by a separate row quantizer (several
    eager kernels, rounding through bf16) where the tile fuses it, and that pair was never
    measured against the tile."""
    return (sig.family == FP8_FAMILY and sig.op == "scaled_mm" and sig.get("scale") in ("tensor", "row")
            and torch_reason(sig, m) is None)


def heuristic_config(sig: Signature, m: int, sms: int = 132) -> Config:
    """The family's untuned choice at M, a stated shape rule: for fp8 per-tensor / row-wise
    scales the vendor op (`torch`, torch._scaled_mm) where it runs, so that a shape nobody
    measured is never slower than the vendor; otherwise (int8, block scales, unaligned fp8)
    `heuristic_tile`."""
    if vendor_heuristic(sig, m):
        return Config.sentinel("torch")
    return heuristic_tile(sig, m, sms)


def heuristic_tile(sig: Signature, m: int, sms: int = 132) -> Config:
    """The largest data-parallel tile whose grid still launches at least half a wave of CTAs
    (sms / 2); the smallest tile when none does. BK = 128, group_m = 8."""
    n = sig.get("N")
    for bm, bn, w, s in _HEURISTIC_TILES:
        if -(-m // bm) * -(-n // bn) >= sms // 2:
            return make("triton_mma", bm, bn, 128, w, s)
    bm, bn, w, s = _HEURISTIC_TILES[-1]
    return make("triton_mma", bm, bn, 128, w, s)


def default_config(sig: Signature, arch: ArchProfile | None = None) -> Config:
    """What the default tier serves: the `heuristic` sentinel (its tile is chosen per M)."""
    return Config.sentinel("heuristic")


def compile_set(arch_family: str, referenced: Iterable[str], mode: str | None = None) -> tuple[Config, ...]:
    """Referenced configs + the heuristic's tiles (+ the whole space under TUNEDB_COMPILE_SET=all)."""
    from tunedb import settings

    mode = mode or settings.compile_set()
    smem = smem_per_block(arch_family)
    chosen = {c.id: c for c in (config_space(arch_family) if mode == "all" else ())}
    for bm, bn, w, s in _HEURISTIC_TILES:
        c = make("triton_mma", bm, bn, 128, w, s)
        chosen.setdefault(c.id, c)
    for cid in referenced:
        try:
            c = parse(cid)
        except ConfigError:
            continue
        if not c.is_sentinel and smem_bytes(c) <= smem:
            chosen.setdefault(c.id, c)
    for name in FAMILY_SENTINELS:
        chosen.setdefault(name, Config.sentinel(name))
    return tuple(chosen.values())
