"""The chunked_rows lane's configs (launch_chunks.py says the design: cuBLAS's GEMM and the
linear_rows row pass chunk by chunk of R rows, the pass reading and rewriting each chunk's
logits in L2): ids, grid, the lane's part of THE validity predicate. Pure Python.

    lc_m{R}_st{S}_r{r}_c{C}_w{W}[_p{P}][_pdl]     lc_m512_st2_r1_c8192_w8, lc_m256_st1_r1_c32768_w16_p1

R rows a chunk; S streams (1: chunk after chunk on the caller's stream; 2: each chunk's row pass
forked onto a side stream, overlapping the next chunk's GEMM); the rest is a linear_rows id's
tail (`lr_r{r}_c{C}_w{W}[_p{P}][_pdl]`: the row pass's own config, under the same rules). `_pdl`
(the row pass a programmatic dependent of its chunk's GEMM) exists on one stream only: on the
side stream the pass depends on its GEMM through an event, not as the next kernel of its stream.
"""
from __future__ import annotations

import re
from functools import lru_cache

from tunedb.errors import ConfigError
from tunedb.records import ArchProfile, Config

LANE = "chunked_rows"
PREFIX = "lc_"
CHUNK_ROWS = (128, 256, 512, 1024, 2048, 4096)
STREAMS = (1, 2)
# a chunk's logits at most this share of L2: the 60 MiB of an H200 give 33 MiB, which admits
# R = 512 at N = 32000 and 1024 at 16000 (31.25 MiB), and leaves room for W (16 MB at N = 16000,
# K = 512: every chunk's GEMM reads all of it) and the chunk's x
L2_SHARE = 0.55
_ID = re.compile(r"^lc_m(?P<m>\d+)_st(?P<s>\d+)_(?P<tail>r\d+_c\d+_w\d+(?:_p\d+)?(?:_pdl)?)$")


def make(chunk_rows: int, streams: int, rows: int, chunk: int, warps: int, pdl: bool = False,
         persist: int | None = None) -> Config:
    """The chunked_rows config: chunks of `chunk_rows` rows on `streams` streams, each chunk's
    row pass the linear_rows config (rows, chunk, warps, pdl, persist)."""
    from tunedb.families.gemm_log_softmax.configs import make_rows

    if chunk_rows not in CHUNK_ROWS:
        raise ConfigError(f"{LANE} config: R={chunk_rows} rows a chunk not allowed; use one of {CHUNK_ROWS}")
    if streams not in STREAMS:
        raise ConfigError(f"{LANE} config: st={streams} streams not allowed; use one of {STREAMS}")
    if pdl and streams != 1:
        raise ConfigError(f"{LANE} config: _pdl needs one stream (st1), not st{streams}: a row pass on the "
                          "side stream waits on its GEMM through an event")
    rc = make_rows(rows, chunk, warps, pdl=pdl, persist=persist)
    cid = f"lc_m{chunk_rows}_st{streams}_{rc.id[len('lr_'):]}"
    return Config(cid, LANE, (("chunk_rows", chunk_rows), ("streams", streams)) + rc.params)


@lru_cache(maxsize=1024)
def parse(config_id: str) -> Config:
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(f"bad {LANE} config id {config_id!r}: expected lc_m{{R}}_st{{S}}_ and a linear_rows "
                          f"tail, e.g. lc_m512_st2_r1_c8192_w8 (R in {CHUNK_ROWS}, S in {STREAMS})")
    from tunedb.families.gemm_log_softmax.configs import parse as parse_any

    rc = parse_any("lr_" + m["tail"])
    cfg = make(int(m["m"]), int(m["s"]), rc.param("rows"), rc.param("chunk"), rc.param("warps"),
               pdl=rc.param("launch") == "pdl", persist=rc.param("persist"))
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def row_pass(cfg: Config) -> Config:
    """The linear_rows config of a chunked config's row pass (its rules are the pass's rules)."""
    from tunedb.families.gemm_log_softmax.configs import make_rows

    return make_rows(cfg.param("rows"), cfg.param("chunk"), cfg.param("warps"), pdl=cfg.param("launch") == "pdl",
                     persist=cfg.param("persist"))


# the row passes the shipped table serves at M >= 256 (N = 5000 and 16000: r1_c8192_w8; 32000:
# r1_c16384_w16 at 256, r1_c32768_w16_p1 above; r1_c16384_w16 is 16000's one-read pass), each
# at R in 256..2048 (the predicate keeps the chunks that fit L2 at each N), one stream, one
# stream with the pass under PDL (each chunk's pass launch otherwise waits for its GEMM's drain:
# tens of chunks at M = 8192), and two streams. Valid at the census: 12 configs at N = 5000, 18
# at 16000, 18 at 32000 (48 per M)
_PASSES = ((1, 8192, 8, None), (1, 16384, 16, None), (1, 32768, 16, 1))
_GRID_ROWS = (256, 512, 1024, 2048)
_VARIANTS = ((1, False), (1, True), (2, False))


def grid() -> tuple[Config, ...]:
    return tuple(make(r, s, rows, chunk, warps, pdl=pdl, persist=p)
                 for rows, chunk, warps, p in _PASSES for r in _GRID_ROWS for s, pdl in _VARIANTS)


def l2_budget(arch: ArchProfile) -> int:
    return int(L2_SHARE * arch.l2_bytes)


def reason(cfg: Config, n: int, elt_bytes: int, arch: ArchProfile) -> str | None:
    """The lane's own rule: a chunk's logits (R x N in the output dtype) within L2_SHARE of L2.
    Not a rule: M > R. At M <= R the launch runs one chunk (the GEMM into the output, the pass in
    place), which is correct and no slower than linear_rows; refusing it would open holes in the
    table's regions (a config measured best at M = 1024 serves every M down to the previous
    measured size, and a call at M <= R there would fall to the next tier). The row pass's own
    rules are linear_rows' (configs.invalid_reason applies them to row_pass(cfg))."""
    need, budget = cfg.param("chunk_rows") * n * elt_bytes, l2_budget(arch)
    if need > budget:
        return (f"a chunk's logits ({cfg.param('chunk_rows')} rows x N={n} x {elt_bytes} B = {need} B) exceed "
                f"{L2_SHARE} of L2 ({budget} B of {arch.l2_bytes})")
    return None


def eager_fallback(n: int, k: int, m: int, cfg: Config, profile: ArchProfile) -> str | None:
    """The family's eager_fallback hook for this lane (runtime/host_bound.py): 'torch' when the
    host time to issue the config's launches outside a CUDA graph (two a chunk, two more event
    calls a chunk on two streams where there are several chunks, at profile.launch_us_eager each) exceeds torch's own eager
    time, taken as the larger of its two launches' host time and a floor of its kernel time (its
    GEMM at the bf16 peak plus three crossings of the logits at DRAM bandwidth: GEMM write,
    log_softmax read and write). The config's kernels beat torch's in the build (else it is not
    served), so such a call is host-bound and the GPU time the chunks save buys nothing. None:
    the config serves eager calls too (one chunk on one stream always does). The build measures
    in graphs, where launches cost the host nothing."""
    if cfg.lane != LANE:
        return None
    chunks = -(-m // cfg.param("chunk_rows"))
    host_us = chunks * (2 if cfg.param("streams") == 1 or chunks == 1 else 4) * profile.launch_us_eager
    torch_gpu_us = 2.0 * m * n * k / (profile.bf16_tflops * 1e6) + 6.0 * m * n / (profile.dram_bw_gbs * 1e3)
    return "torch" if host_us > max(2 * profile.launch_us_eager, torch_gpu_us) else None
