"""Grouped-GEMM (MoE expert GEMM) configs: ids, the config space, THE validity predicate, the
untuned default, the compile set. Pure Python (no torch, no triton).

Config ids (format(parse(id)) == id):
    triton_grouped  b{BM}x{BN}x{BK}_w{W}_s{S}_g{G}   b64x128x64_w4_s3_g8
    triton_slots    sl_b1x{BN}x{BK}_w{W}_s{S}       sl_b1x32x256_w4_s3   (S 1: register streaming,
                                                     2+: S - 1 chunks in flight via cp.async)
triton_grouped: BM is also the routing block: the token slots of each expert are padded to a
multiple of BM, so one M tile never mixes experts. triton_slots: the routing-free small-M lane,
one program per (slot, BN block) reading its expert id from topk_ids (no sort, no padding);
valid only while M * top_k <= SLOTS_MAX (the predicate). Sentinels: `default` (the untuned Triton tile below) and `torch`
(torch._grouped_mm where this torch and device run it, else a loop of cuBLAS GEMMs over experts).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Sequence

from tunedb.errors import ConfigError
from tunedb.families.key_rules import head_reason
from tunedb.families.tile_ids import TileIds, blocks
from tunedb.records import ArchProfile, Config, Signature

FAMILY = "group_gemm"
OPS: tuple[str, ...] = ("group_gemm",)
SLOTS_LANE = "triton_slots"
LANES: tuple[str, ...] = ("triton_grouped", SLOTS_LANE, "torch")
FAMILY_SENTINELS: tuple[str, ...] = ("default", "torch")
DTYPES: tuple[str, ...] = ("bf16", "fp16")

_BLOCKS_M = (16, 32, 64, 128)
_WARPS = (4, 8)
TILE_IDS = TileIds(FAMILY, (("triton_grouped", ""),), FAMILY_SENTINELS, "b64x128x64_w4_s3_g8",
                   blocks_m=_BLOCKS_M, blocks_n=(32, 64, 128, 256), blocks_k=(32, 64, 128), warps=_WARPS,
                   stages=(2, 3, 4, 5), groups=(1, 8, 16), label=FAMILY)
# Per-slot weight streaming re-reads an expert's weight once per slot routed to it (L2 absorbs
# the repeats while the slots of one BN block run together); past a few hundred slots the
# sorted lane's shared tiles win, and the sort is cheap next to the GEMM.
SLOTS_MAX = 512
SLOT_IDS = TileIds(FAMILY, ((SLOTS_LANE, "sl"),), FAMILY_SENTINELS, "sl_b1x32x256_w4_s3",
                   blocks_m=(1,), blocks_n=(16, 32, 64, 128), blocks_k=(64, 128, 256, 512), warps=(2, 4, 8),
                   stages=(1, 2, 3, 4), label=SLOTS_LANE)
_SMEM_BY_ARCH = {"sm80": 166912, "sm86": 101376, "sm89": 101376, "sm90": 232448, "sm100": 232448,
                 "sm120": 101376}
MAX_ACC_PER_THREAD = 128  # fp32 accumulator registers per thread beyond which a tile spills


def make(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int) -> Config:
    return TILE_IDS.make(bm, bn, bk, warps, stages, group_m)


def make_slots(bn: int, bk: int, warps: int, stages: int) -> Config:
    """A triton_slots config (one slot per program, BN outputs, BK-deep weight chunks)."""
    return SLOT_IDS.make(1, bn, bk, warps, stages)


@lru_cache(maxsize=4096)
def parse(config_id: str) -> Config:
    if isinstance(config_id, str) and config_id.startswith("sl_"):
        return SLOT_IDS.parse(config_id)
    return TILE_IDS.parse(config_id)


# (BN, BK, warps) of the slot lane: narrow BN gives a few slots' weight streams many programs
_SLOT_SHAPES = ((16, 256, 2), (32, 256, 4), (32, 512, 4), (64, 128, 4), (64, 256, 4), (128, 128, 8))
# winners of the exhaustive grid outside the shapes above (session 13 E, bench/moe_exhaustive.py:
# Mixtral up M=1, Qwen3 up M=16, Qwen3 down M=16), pipelined only
_SLOT_EXTRA = ((32, 128, 4), (16, 256, 4), (64, 128, 2))


def slot_space() -> tuple[Config, ...]:
    return tuple(make_slots(bn, bk, w, s) for bn, bk, w in _SLOT_SHAPES for s in (1, 3)) + tuple(
        make_slots(bn, bk, w, 3) for bn, bk, w in _SLOT_EXTRA)


def full_grid() -> tuple[Config, ...]:
    """The exhaustive space (352 tiles before the validity predicate)."""
    out = []
    for bm in _BLOCKS_M:
        for bn in (32, 64, 128, 256) if bm <= 32 else (64, 128, 256):
            for bk in (64, 128):
                for w in _WARPS:
                    if w == 8 and bm * bn < 64 * 128:
                        continue  # 8 warps on a small tile only idle
                    for s in (2, 3, 4, 5):
                        for g in (1, 8):
                            out.append(make(bm, bn, bk, w, s, g))
    for bn in (16, 32, 64, 128):
        for bk in (128, 256, 512):
            for w in (2, 4, 8):
                for s in (1, 2, 3):
                    if slot_regs(bn, bk, w) <= MAX_ACC_PER_THREAD:
                        out.append(make_slots(bn, bk, w, s))
    return tuple(out)


def slot_regs(bn: int, bk: int, warps: int) -> int:
    """fp32 values per thread of a triton_slots weight chunk (converted for the products)."""
    return bn * bk // (32 * warps)


def smem_per_block(arch_family: str) -> int:
    if not re.match(r"^sm\d+a?$", arch_family or ""):
        raise ConfigError(f"bad arch family {arch_family!r}: expected sm<digits> such as sm90")
    return _SMEM_BY_ARCH.get(arch_family, 101376)


def smem_bytes(cfg: Config) -> int:
    """Pipelined operand buffers (two-byte elements), or the epilogue's conversion scratch."""
    bm, bn, bk = blocks(cfg)
    if cfg.lane == SLOTS_LANE:
        return max(cfg.param("stages") - 1, 1) * (bn + 1) * bk * 2
    return max(cfg.param("stages") * (bm + bn) * bk * 2, bm * bn * 4)


def config_space(arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    """The build's space (48 grouped tiles: per tile height BM, four to six (BN, BK, warps)
    shapes and two stage counts, plus five grid winners; 15 slot-lane tiles, valid at small M
    only). full_grid() is the exhaustive space the bench's sweep checks it against."""
    wanted = set(lanes or LANES)
    bad = wanted - set(LANES)
    if bad:
        raise ConfigError(f"unknown group_gemm lane(s) {sorted(bad)}; lanes are {', '.join(LANES)}")
    smem = smem_per_block(arch_family)
    tiles = []
    for bm in _BLOCKS_M if "triton_grouped" in wanted else ():
        shapes = ((64, 128, 4), (128, 64, 4), (128, 128, 4), (256, 64, 8), (64, 64, 4))
        if bm <= 32:  # decode: narrow tiles put more CTAs on a few experts' weight streams
            shapes += ((32, 128, 4),)
        tiles += [make(bm, bn, bk, w, s, 8) for bn, bk, w in shapes for s in (3, 4)]
        # winners of the exhaustive grid outside those shapes, (BN, BK, warps, stages, group_m):
        # session 13 E (Qwen3 up/down M=128, Qwen3 down M=1024): two-stage BK=128 tiles at BM=16,
        # an 8-warp BM=64 tile; session 14 C (Mixtral, E=8 top-2, at 16-128 tokens: one M block an
        # expert): BM=64 BK=128 tiles walking N without the grouped order (g1), 2.9-5.6% over g8
        extra = {16: ((256, 128, 4, 2, 8), (128, 128, 4, 2, 8)),
                 64: ((128, 64, 8, 3, 8), (128, 128, 4, 4, 1), (128, 128, 8, 4, 1))}.get(bm, ())
        tiles += [make(bm, bn, bk, w, s, g) for bn, bk, w, s, g in extra]
    out = [c for c in tiles if smem_bytes(c) <= smem and _acc_per_thread(c) <= MAX_ACC_PER_THREAD]
    if SLOTS_LANE in wanted:
        out += [c for c in slot_space() if smem_bytes(c) <= smem]
    return tuple(out)


def _acc_per_thread(cfg: Config) -> int:
    """fp32 accumulator registers a grouped tile needs per thread."""
    bm, bn, _ = blocks(cfg)
    return bm * bn // (32 * cfg.param("warps"))


def sig_reason(sig: Signature) -> str | None:
    """Why a signature is not a group_gemm key (None when it is)."""
    why = head_reason(sig, FAMILY, OPS, DTYPES, ("E", "N", "K", "top_k"))
    if why:
        return why
    if sig.get("top_k") > sig.get("E"):
        return f"top_k={sig.get('top_k')} exceeds E={sig.get('E')}"
    if sig.get("x") not in ("token", "slot"):
        return f"x={sig.get('x')!r}; allowed: token, slot"
    return None


def invalid_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    """THE validity predicate: None when `cfg` may run `sig` at M tokens (any M when m is None)."""
    why = sig_reason(sig)
    if why:
        return why
    if cfg.id == "default":
        return None
    if cfg.id == "torch":
        return None  # the loop runs anything; torch._grouped_mm is chosen inside where it runs
    if cfg.lane == SLOTS_LANE:
        return _slots_reason(cfg, sig, m, arch)
    if cfg.lane != "triton_grouped":
        return f"lane {cfg.lane!r} is not a group_gemm lane"
    bm, bn, bk = blocks(cfg)
    if smem_bytes(cfg) > smem_per_block(arch.arch_family):
        return f"needs {smem_bytes(cfg)} B of shared memory; {arch.arch_family} has {smem_per_block(arch.arch_family)}"
    if _acc_per_thread(cfg) > MAX_ACC_PER_THREAD:
        return f"{bm}x{bn} accumulator over {cfg.param('warps')} warps spills (> {MAX_ACC_PER_THREAD} fp32 per thread)"
    k = sig.get("K")
    if bk > 16 and k < bk // 2:
        return f"BK={bk} is more than twice K={k}: the K loop would be mostly masked"
    if sig.get("N") < bn // 4:
        return f"BN={bn} is more than 4x N={sig.get('N')}"
    return None


def _slots_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    if m is None:
        return f"{SLOTS_LANE} serves M * top_k <= {SLOTS_MAX} slots only, so not every M"
    slots = m * sig.get("top_k")
    if slots > SLOTS_MAX:
        return f"{SLOTS_LANE} serves M * top_k <= {SLOTS_MAX} slots, not {m} x {sig.get('top_k')} = {slots}"
    _, bn, bk = blocks(cfg)
    if smem_bytes(cfg) > smem_per_block(arch.arch_family):
        return f"needs {smem_bytes(cfg)} B of shared memory; {arch.arch_family} has {smem_per_block(arch.arch_family)}"
    if slot_regs(bn, bk, cfg.param("warps")) > MAX_ACC_PER_THREAD:
        return f"a {bn}x{bk} weight chunk over {cfg.param('warps')} warps spills (> {MAX_ACC_PER_THREAD} fp32 per thread)"
    if sig.get("K") < bk // 2:
        return f"BK={bk} is more than twice K={sig.get('K')}: the K loop would be mostly masked"
    if sig.get("N") < bn // 4:
        return f"BN={bn} is more than 4x N={sig.get('N')}"
    return None


def sentinels(sig: Signature, approximate: bool = False) -> tuple[str, ...]:
    return FAMILY_SENTINELS


def default_config(sig: Signature | None = None, arch: ArchProfile | None = None) -> Config:
    """The untuned tile: one mid-sized Triton grouped tile for every key and M (what a user gets
    from a fused-MoE kernel without a tuned table)."""
    return make(64, 64, 64, 4, 3, 8)


def sweep_space(arch_family: str = "sm90") -> tuple[Config, ...]:
    """A cut of the space for in-run sweeps with a compile budget: the tiles that win somewhere
    in the full grid's families (small BM for decode, large for prefill), 2 stage counts, and
    the slot lane's tiles (small M)."""
    out = list(slot_space())
    for bm, bn, bk, w in ((16, 32, 128, 4), (16, 64, 128, 4), (16, 128, 128, 4), (16, 256, 64, 4), (32, 64, 128, 4),
                          (32, 128, 64, 4), (32, 128, 128, 4), (64, 64, 64, 4), (64, 128, 64, 4),
                          (64, 128, 64, 8), (64, 256, 64, 8), (128, 128, 64, 8), (128, 256, 64, 8)):
        for s in (3, 4):
            c = make(bm, bn, bk, w, s, 8)
            if smem_bytes(c) <= smem_per_block(arch_family):
                out.append(c)
    return tuple(out)


def compile_set(arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
    """Referenced configs + the default + the sweep basis (a tile for each regime)."""
    seen: dict[str, Config] = {}
    for cid in referenced:
        c = parse(cid)
        if not c.is_sentinel:
            seen[c.id] = c
    d = default_config()
    seen[d.id] = d
    for c in sweep_space(arch_family):
        seen.setdefault(c.id, c)
    return tuple(seen.values())


def simplicity(config_id: str) -> int:
    """Lower is simpler: the torch arm, the untuned default, then tuned tiles."""
    return {"torch": 0, "default": 1}.get(config_id, 2)
