"""The split_rows lane's configs: ids, grid, the lane's part of THE validity predicate
(configs.invalid_reason asks it) and its eager rule. Pure Python.

    ls_c{C}_w{W}[_pdl]       ls_c2048_w4, ls_c4096_w8_pdl

cuBLAS writes the logits into the output (addmm with out=, as linear_rows does), then two Triton
passes split every row into chunks of C columns, one (row, chunk) a program: the first stores each
chunk's max and sum of exp into [M, T] fp32 partials (T = ceil(N / C)), the second (the rowfix
lane's fix-up kernel) combines a row's T partials into its log-sum-exp and subtracts it from its
chunk in place. Why a third launch pays: linear_rows runs one program a row, so at M <= 256 the
pass is M programs each walking a 10-64 KB row through four dependent memory round trips (at
M = 256, N = 16000 it ran at 2.1x its DRAM floor, session 19); here M x T programs each hold one
chunk, and the logits cuBLAS just wrote (M x N x 2 bytes: 8 MB at 256 x 16000) are read twice
from L2. W warps run each program; `_pdl` launches both passes as programmatic dependents (the
statistics pass waits for cuBLAS, the fix-up for the statistics).
"""
from __future__ import annotations

import re
from functools import lru_cache

from tunedb.errors import ConfigError
from tunedb.records import ArchProfile, Config

LANE = "split_rows"
PREFIX = "ls_"
CHUNKS, WARPS = (1024, 2048, 4096, 8192), (4, 8)
MAX_VALUES_PER_THREAD = 64  # fp32 values of a chunk a thread holds (C / (32 W)); beyond, they spill
MAX_CHUNKS = 1024  # T partials a row: the fix-up reads them in steps of up to 1024
_ID = re.compile(r"^ls_c(?P<c>\d+)_w(?P<w>\d+)(?P<pdl>_pdl)?$")


def make(chunk: int, warps: int, pdl: bool = False) -> Config:
    for name, v, allowed in (("C", chunk, CHUNKS), ("warps", warps, WARPS)):
        if v not in allowed:
            raise ConfigError(f"{LANE} config: {name}={v!r} not allowed; use one of {allowed}")
    params = (("chunk", chunk), ("warps", warps)) + ((("launch", "pdl"),) if pdl else ())
    return Config(f"ls_c{chunk}_w{warps}{'_pdl' if pdl else ''}", LANE, params)


@lru_cache(maxsize=256)
def parse(config_id: str) -> Config:
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(f"bad {LANE} config id {config_id!r}: expected ls_c2048_w4 or ls_c4096_w8_pdl "
                          f"(C one of {CHUNKS}, warps one of {WARPS})")
    cfg = make(int(m["c"]), int(m["w"]), bool(m["pdl"]))
    if cfg.id != config_id:
        raise ConfigError(f"config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def grid() -> tuple[Config, ...]:
    """Every chunk and warp count, plain and `_pdl` (the predicate drops what a shape refuses)."""
    return tuple(make(c, w, pdl) for c in CHUNKS for w in WARPS for pdl in (False, True)
                 if c // (32 * w) <= MAX_VALUES_PER_THREAD)


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def reason(cfg: Config, n: int, arch: ArchProfile, pdl_reason) -> str | None:
    """The lane's rules: a chunk not more than the row rounded up to a power of two (it would
    load mostly padding: a smaller chunk covers that N), at most MAX_VALUES_PER_THREAD values a
    thread, at most MAX_CHUNKS chunks a row; `_pdl` as the family's pdl rule (pdl_reason)."""
    c, w = cfg.param("chunk"), cfg.param("warps")
    if c // (32 * w) > MAX_VALUES_PER_THREAD:
        return f"{c // (32 * w)} fp32 values per thread > {MAX_VALUES_PER_THREAD} (C={c}, warps={w})"
    if c > max(1024, _pow2_at_least(n)):
        return f"C={c} exceeds N={n} rounded up to a power of two"
    if -(-n // c) > MAX_CHUNKS:
        return f"N={n} makes {-(-n // c)} chunks of C={c} > {MAX_CHUNKS}"
    return pdl_reason(cfg, arch)


def eager_fallback(cfg: Config, torch_gpu_us: float, launch_us: float) -> str | None:
    """'torch' where an eager call would be host-bound: three launches (cuBLAS and the two passes)
    at launch_us each against torch's two or its kernel time, whichever is larger. The passes
    beat torch's log_softmax in a graph (else the config is not served), where launches cost the
    host nothing; outside one, the extra launch costs more than that at these sizes."""
    if cfg.lane != LANE:
        return None
    return "torch" if 3 * launch_us > max(2 * launch_us, torch_gpu_us) else None
