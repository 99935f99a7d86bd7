"""gemm_log_softmax configs: ids, the config space, THE validity predicate, the compile set.

Pure Python (no torch, no triton). Two fused Triton lanes share one tile grammar; a third lane
keeps cuBLAS's GEMM and replaces only torch's log_softmax:
    triton_recompute  rc_b{BM}x{BN}x{BK}_w{W}_s{S}   rc_b64x128x64_w4_s3  (stats pass + recompute pass)
    triton_fixup      fx_b{BM}x{BN}x{BK}_w{W}_s{S}   fx_b128x128x64_w8_s3 (logits written once, fixed in place)
    linear_rows       lr_r{R}_c{C}_w{W}[_p{P}][_pdl]  lr_r1_c32768_w16     (F.linear, then a Triton row
                      log-softmax: R rows a program, C columns a chunk; one read of a row when C >= N;
                      _p{P}: persistent, P programs an SM walking the rows with the next block
                      prefetched (whole rows only); _pdl: the row pass launched under programmatic
                      dependent launch after the GEMM)
    triton_rowfix     rf_b{BM}x{BN}x{BK}_w{W}_s{S}_{L} rf_b64x64x64_w4_s3_pdl (M <= 1024: tiles write
                      logits + statistics, one fix-up pass combines them and subtracts; L = two
                      (two launches), pdl (the fix-up under programmatic dependent launch) or one{P}
                      (one persistent launch, P CTAs an SM, a grid barrier between the phases);
                      configs_rowfix.py)
    chunked_rows      lc_m{R}_st{S}_r{r}_c{C}_w{W}[_p{P}][_pdl] lc_m512_st2_r1_c8192_w8 (cuBLAS and the
                      linear_rows pass chunk by chunk of R rows, the pass in L2; S streams;
                      configs_chunks.py)
Sentinels: `torch` (F.linear then torch.log_softmax: the fallback) and `default` (the untuned
choice: the torch arm too, no guessed tile is served unmeasured).
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Sequence

from tunedb.arch import planning_smem_per_block as smem_per_block
from tunedb.errors import ConfigError
from tunedb.families.gemm_log_softmax import configs_chunks as chunks
from tunedb.families.gemm_log_softmax import configs_rowfix as rowfix
from tunedb.families.key_rules import head_reason
from tunedb.families.tile_ids import TileIds, blocks
from tunedb.records import ArchProfile, Config, Signature

FAMILY = "gemm_log_softmax"
OPS: tuple[str, ...] = ("gemm_log_softmax",)
DTYPES: tuple[str, ...] = ("bf16", "fp16")
TRITON_LANES: tuple[str, ...] = ("triton_recompute", "triton_fixup", "linear_rows", "triton_rowfix", "chunked_rows")
TILE_LANES: tuple[str, ...] = ("triton_recompute", "triton_fixup")
LANES: tuple[str, ...] = TRITON_LANES + ("torch",)
FAMILY_SENTINELS: tuple[str, ...] = ("default", "torch")
TILE_IDS = TileIds(FAMILY, (("triton_recompute", "rc"), ("triton_fixup", "fx")), FAMILY_SENTINELS,
                   "rc_b64x128x64_w4_s3, fx_b128x128x64_w8_s3", blocks_m=(16, 32, 64, 128),
                   blocks_n=(64, 128, 256), blocks_k=(32, 64, 128), warps=(4, 8), stages=range(1, 6))
MAX_ACC_PER_THREAD = 128  # fp32 accumulator registers per thread beyond which a tile spills
MAX_N_TILES = 8192  # the partial-statistics workspace is [M, T] fp32 twice


def make(lane: str, bm: int, bn: int, bk: int, warps: int, stages: int) -> Config:
    return TILE_IDS.make(bm, bn, bk, warps, stages, lane=lane)


_ROWS_ID = re.compile(r"^lr_r(?P<r>\d+)_c(?P<c>\d+)_w(?P<w>\d+)(?:_p(?P<p>\d+))?(?P<pdl>_pdl)?$")
ROWS_R, ROWS_C, ROWS_W, ROWS_P = (1, 2, 4), (1024, 2048, 4096, 8192, 16384, 32768), (4, 8, 16), (1, 2, 4)
MAX_STREAM_VALUES_PER_THREAD = 64  # the persistent pass holds a prefetched block beside the fp32 one
MAX_ROW_VALUES_PER_THREAD = 128  # fp32 values of a chunk each thread holds; beyond, they spill


def make_rows(rows: int, chunk: int, warps: int, pdl: bool = False, persist: int | None = None) -> Config:
    """The linear_rows config: R rows a program, C columns a chunk, W warps; `persist` P: the
    persistent prefetching pass with P programs an SM; `pdl` launches the row pass as a
    programmatic dependent of F.linear's GEMM (its launch overlaps the GEMM's tail; it waits for
    the GEMM's completion before reading). Plain ids keep their params."""
    for name, v, allowed in (("R", rows, ROWS_R), ("C", chunk, ROWS_C), ("warps", warps, ROWS_W)):
        if v not in allowed:
            raise ConfigError(f"linear_rows config: {name}={v} not allowed; use one of {allowed}")
    if persist is not None and persist not in ROWS_P:
        raise ConfigError(f"linear_rows config: P={persist} programs an SM not allowed; use one of {ROWS_P}")
    params = ((("rows", rows), ("chunk", chunk), ("warps", warps))
              + ((("persist", persist),) if persist else ()) + ((("launch", "pdl"),) if pdl else ()))
    cid = f"lr_r{rows}_c{chunk}_w{warps}{f'_p{persist}' if persist else ''}{'_pdl' if pdl else ''}"
    return Config(cid, "linear_rows", params)


@lru_cache(maxsize=4096)
def parse(config_id: str) -> Config:
    """A config from its id: a tile (rc_/fx_), a linear_rows id (lr_), a rowfix id (rf_), a
    chunked_rows id (lc_) or a sentinel."""
    if isinstance(config_id, str) and config_id.startswith(rowfix.PREFIX):
        return rowfix.parse(config_id)
    if isinstance(config_id, str) and config_id.startswith(chunks.PREFIX):
        return chunks.parse(config_id)
    m = _ROWS_ID.match(config_id) if isinstance(config_id, str) else None
    if m is None:
        return TILE_IDS.parse(config_id)
    cfg = make_rows(int(m["r"]), int(m["c"]), int(m["w"]), pdl=bool(m["pdl"]),
                    persist=int(m["p"]) if m["p"] else None)
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


# the tiles both lanes offer: (BM, BN, BK, warps, stages); small BM for decode-like M, wide BN
# for the long vocabulary axis
_TILES = ((16, 128, 64, 4, 3), (16, 256, 64, 4, 3), (32, 128, 64, 4, 3), (64, 128, 64, 4, 3),
          (64, 128, 64, 8, 4), (64, 256, 64, 8, 3), (64, 128, 128, 4, 3), (128, 128, 64, 8, 3),
          (128, 128, 64, 8, 4), (128, 256, 64, 8, 3))


# (R, C, W): one row a program over chunks from 2k to the whole of a 32k vocabulary, and 2-4 rows
# a program for short rows (a 5k row is 10 KB: one row a program leaves the SM short of bytes;
# r4_c8192_w16 holds four whole 5k rows, 40 KB in flight a program, with two reductions)
_ROWS = ((1, 2048, 4), (1, 2048, 8), (1, 4096, 4), (1, 4096, 8), (1, 8192, 4), (1, 8192, 8), (1, 8192, 16),
         (1, 16384, 8), (1, 16384, 16), (1, 32768, 8), (1, 32768, 16), (2, 4096, 4), (2, 8192, 8),
         (4, 2048, 4), (4, 4096, 8), (4, 8192, 16))
# PDL twins of the configs the shipped table serves (session 14): at M = 64-256 the row pass's
# launch gap after the GEMM is a large part of its 2-6 us
_ROWS_PDL = ((1, 2048, 8), (1, 8192, 8), (1, 8192, 16), (1, 16384, 8), (1, 16384, 16))
# (R, C, W, P) persistent prefetching passes, whole rows of the census vocabularies (5k: C=8192,
# 16k: 16384, 32k: 32768), P from what the registers let be resident (about 100-128 a thread
# at 64 values, 60-70 at 32)
_ROWS_STREAM = ((1, 8192, 8, 4), (4, 8192, 16, 2), (1, 16384, 8, 2), (1, 16384, 16, 1), (1, 32768, 16, 1))


def full_grid() -> tuple[Config, ...]:
    tiles = tuple(make(lane, *t) for lane in TILE_LANES for t in _TILES)
    return (tiles + tuple(make_rows(*r) for r in _ROWS) + tuple(make_rows(*r, pdl=True) for r in _ROWS_PDL)
            + tuple(make_rows(r, c, w, persist=p) for r, c, w, p in _ROWS_STREAM)
            + rowfix.grid() + chunks.grid())


def config_space(arch_family: str, lanes: Sequence[str] | None = None) -> tuple[Config, ...]:
    wanted = set(lanes or TRITON_LANES)
    bad = wanted - set(LANES)
    if bad:
        raise ConfigError(f"unknown gemm_log_softmax lane(s) {sorted(bad)}; lanes are {', '.join(LANES)}")
    smem = smem_per_block(arch_family)
    return tuple(c for c in full_grid() if c.lane in wanted and smem_bytes(c) <= smem)


def smem_bytes(cfg: Config) -> int:
    """Pipelined operand buffers (two bytes per element) or the fp32 tile's layout conversion;
    a linear_rows program reduces in registers (its cross-warp reductions need a few bytes), and
    a chunked_rows config runs cuBLAS and that row pass."""
    if cfg.lane in ("linear_rows", "chunked_rows"):
        return 0
    if cfg.lane == "triton_rowfix":
        return rowfix.smem_bytes(cfg)
    bm, bn, bk = blocks(cfg)
    return max(cfg.param("stages") * (bm + bn) * bk * 2, bm * bn * 4)


def sig_reason(sig: Signature) -> str | None:
    why = head_reason(sig, FAMILY, OPS, DTYPES, ("N", "K"))
    if why:
        return why
    if sig.get("bias") not in (0, 1):
        return f"bias={sig.get('bias')!r} must be 0 or 1"
    return None


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def invalid_reason(cfg: Config, sig: Signature, m: int | None, arch: ArchProfile) -> str | None:
    """THE validity predicate: None when `cfg` may run `sig` at M (any M when m is None).

    Rules: the signature is this family's; sentinels always run; a tile fits shared memory and
    keeps its fp32 accumulator in registers; the N tiles' statistics workspace stays bounded;
    a tile is not more than twice the problem along K or (given M) along M (it would compute
    mostly padding: a smaller tile of the space covers that shape). linear_rows: _rows_reason and
    the pdl rule; triton_rowfix: configs_rowfix.reason; chunked_rows: the row pass's rules at
    min(M, R) rows, the pdl rule, and configs_chunks.reason (a chunk's logits within L2's share)."""
    why = sig_reason(sig)
    if why:
        return why
    if cfg.is_sentinel:
        return None if cfg.id in FAMILY_SENTINELS else f"sentinel {cfg.id!r} is not an arm of {FAMILY}"
    if cfg.lane not in TRITON_LANES:
        return f"lane {cfg.lane!r} is not a {FAMILY} lane"
    if cfg.lane == "linear_rows":
        return _rows_reason(cfg, sig.get("N"), m) or _rows_pdl_reason(cfg, arch)
    if cfg.lane == "triton_rowfix":
        return rowfix.reason(cfg, sig.get("N"), sig.get("K"), m, arch)
    if cfg.lane == "chunked_rows":  # the row pass's rules at the chunk's rows, then the chunk's own
        rp = chunks.row_pass(cfg)
        return (_rows_reason(rp, sig.get("N"), None if m is None else min(m, cfg.param("chunk_rows")))
                or _rows_pdl_reason(rp, arch) or chunks.reason(cfg, sig.get("N"), 2, arch))
    bm, bn, bk = blocks(cfg)
    need = smem_bytes(cfg)
    if need > arch.smem_per_block:
        return f"needs {need} B of shared memory > {arch.smem_per_block}"
    per_thread = bm * bn // (32 * cfg.param("warps"))
    if per_thread > MAX_ACC_PER_THREAD:
        return f"{per_thread} fp32 accumulators per thread > {MAX_ACC_PER_THREAD} (BM={bm}, BN={bn}, warps={cfg.param('warps')})"
    n, k = sig.get("N"), sig.get("K")
    if -(-n // bn) > MAX_N_TILES:
        return f"N={n} makes {-(-n // bn)} tiles of BN={bn} > {MAX_N_TILES} (statistics workspace)"
    if bk > max(32, _pow2_at_least(k)):
        return f"BK={bk} exceeds K={k} rounded up to a power of two"
    if m is not None and bm > max(16, _pow2_at_least(m)):
        return f"BM={bm} exceeds M={m} rounded up to a power of two"
    return None


def one_pass(chunk: int, n: int) -> bool:
    """A linear_rows chunk holds the whole row (N rounded up to a power of two): one read of it."""
    return chunk >= _pow2_at_least(n)


def _rows_reason(cfg: Config, n: int, m: int | None) -> str | None:
    """linear_rows: a chunk holds at most MAX_ROW_VALUES_PER_THREAD fp32 values a thread and is
    not more than twice the row (it would load mostly padding: a smaller chunk covers that N);
    R rows a program need M >= R (given M), or the program computes padding rows. A persistent
    pass (P) holds whole rows (C >= N rounded up) and at most MAX_STREAM_VALUES_PER_THREAD a thread
    (the prefetched block sits beside the fp32 one)."""
    r, c, w = cfg.param("rows"), cfg.param("chunk"), cfg.param("warps")
    per_thread = r * c // (32 * w)
    if per_thread > MAX_ROW_VALUES_PER_THREAD:
        return f"{per_thread} fp32 values per thread > {MAX_ROW_VALUES_PER_THREAD} (R={r}, C={c}, warps={w})"
    if c > max(1024, _pow2_at_least(n)):
        return f"C={c} exceeds N={n} rounded up to a power of two"
    if m is not None and r > max(1, m):
        return f"R={r} rows a program exceeds M={m}"
    if cfg.param("persist"):
        if not one_pass(c, n):
            return f"a persistent row pass holds whole rows: C={c} < N={n} rounded up to a power of two"
        if per_thread > MAX_STREAM_VALUES_PER_THREAD:
            return (f"{per_thread} values per thread > {MAX_STREAM_VALUES_PER_THREAD} for a persistent pass "
                    f"(it holds the prefetched block too; R={r}, C={c}, warps={w})")
    return None


def _rows_pdl_reason(cfg: Config, arch: ArchProfile) -> str | None:
    """A `_pdl` row pass: as the rowfix lane's pdl rule (sm90+, a Triton with gdc_wait)."""
    if cfg.param("launch", "plain") != "pdl":
        return None
    if rowfix._capability(arch.arch_family) < 90:
        return f"programmatic dependent launch (pdl) needs sm90 or newer, not {arch.arch_family}"
    from tunedb.families.gemm.configs_decode import pdl_supported

    if not pdl_supported():
        return "this Triton has no gdc_wait / launch_pdl (programmatic dependent launch needs 3.4+)"
    return None


def sentinels(sig: Signature, approximate: bool = False) -> tuple[str, ...]:
    return FAMILY_SENTINELS


def default_config(sig: Signature, arch: ArchProfile | None = None) -> Config:
    """No tile is served unmeasured: the untuned choice is the torch arm."""
    return Config.sentinel("torch")


def compile_set(arch_family: str, referenced: Iterable[str]) -> tuple[Config, ...]:
    """Referenced configs (two small kernels each, compiled on first launch) + the sentinels."""
    smem = smem_per_block(arch_family)
    chosen: dict[str, Config] = {}
    for cid in referenced:
        try:
            c = parse(cid)
        except ConfigError:
            continue
        if c.is_sentinel or smem_bytes(c) <= smem:  # linear_rows: 0
            chosen.setdefault(c.id, c)
    for name in FAMILY_SENTINELS:
        chosen.setdefault(name, Config.sentinel(name))
    return tuple(chosen.values())


def simplicity(config_id: str) -> int:
    """Lower is simpler: the torch arm; cuBLAS's GEMM with a Triton row pass; the one-GEMM
    fixups (three launches, then the rowfix's two or one) and the chunked row passes (two
    launches a chunk); the two-GEMM recompute."""
    if config_id in FAMILY_SENTINELS:
        return 0
    return {"lr_": 1, "fx_": 2, "rf_": 2, "lc_": 2}.get(config_id[:3], 3)
