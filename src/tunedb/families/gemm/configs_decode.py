"""The triton_decode lane's configs: id grammar, grid and the lane's half of the validity predicate.

Pure Python (no torch, no triton); `configs.py` owns the family-wide predicate and calls in here.

    dk{SPLIT}_n{BN}x{BK}_w{W}_s{S}[_at][_pf[n][w]{P}][_pdl]  dk4_n64x256_w4_s4, dk8_n32x256_w4_s3_at_pdl,
                                                   dk8_n32x256_w4_s2_pf2_pdl (prefetch twin)
    ds_t{T}_n{BN}x{BK}_w{W}[_fma][_at][_pdl]       ds_t1_n16x512_w8, ds_t4_n8x1024_w4_fma (stream kernel)

One kernel streams W[N, K] in slabs of BN rows x BK columns (x, M <= 16 rows, padded to a
16-row tile); SPLIT CTAs share an N block, each a contiguous run of K tiles, and the split-K
reduction happens inside the same kernel. Deterministic by default: each split stores its fp32
partial, and the last split to arrive (an atomic counter) sums them in split order, so the same
inputs give the same bits. `_at` configs accumulate with fp32 atomics instead (fewer bytes at
large M, order of additions not fixed). `_pdl` configs launch with programmatic dependent launch
and wait (gdc_wait) only after issuing their first W loads, so W streams while the previous
kernel drains.

`_pf{P}` configs launch the prefetch twin (kernels_decode_pf.py): each CTA first issues L2
prefetches of the first P K tiles of its slab, then (under `_pdl`) calls gdc_launch_dependents at
its start and gdc_wait before any load, so a chain of them streams the next weight into L2 while
the previous kernel drains. `_pf` prefetches with L2::evict_last priority, `_pfn{P}` with the
normal one (lines kept evict_last can crowd out other data, a KV cache say, until evicted);
`w` (`_pfw{P}_pdl`) calls gdc_launch_dependents right after the wait instead of first, so at most
one successor prefetches ahead (a kernel whose CTAs all fit beside its predecessor's otherwise
lets a whole cascade of successors launch and prefetch, past what L2 holds).
Not in grid() until the H200 shows what they buy (bench/decode_pf.py).

`ds` configs launch the stream kernel (kernels_decode_stream.py): each CTA loads a whole BN x BK
slab of W in one go (no shared-memory ring; the next slab is loaded before the current one is
multiplied), many small CTAs instead of few fat ones, multiplied on the tensor cores or, `_fma`,
on the CUDA cores. T is the K tiles a CTA owns (compiled in), so the split follows from K:
cdiv(cdiv(K, BK), T) CTAs per BN-row block (one: no reduction). Same reductions (deterministic
by default), same `_at` and `_pdl` meanings.
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
_ID = re.compile(r"^dk(?P<split>\d+)_n(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)_s(?P<s>\d+)(?P<at>_at)?(?:_pf(?P<pfn>n)?(?P<pfw>w)?(?P<pf>\d+))?(?P<pdl>_pdl)?$")
_PF = (1, 2, 4, 8, 16, 32)  # K tiles of a CTA's run prefetched into L2 before it reads


_DS_ID = re.compile(r"^ds_t(?P<tiles>\d+)_n(?P<bn>\d+)x(?P<bk>\d+)_w(?P<w>\d+)(?P<fma>_fma)?(?P<at>_at)?(?P<pdl>_pdl)?$")
_DS_BN_DOT = (16, 32, 64)  # tl.dot needs 16 columns
_DS_BN_FMA = (1, 2, 4, 8, 16, 32)
_DS_BK = (256, 512, 1024, 2048, 4096)
_DS_TILES = (1, 2, 4, 8, 16, 32, 64)  # unrolled: compile time grows with T
_DS_MAX_BYTES_PER_THREAD = 128  # a slab's registers: 8 x 16-byte loads per thread, as the best pure read


def matches(config_id: str) -> bool:
    return bool((config_id.startswith("dk") and _ID.match(config_id))
                or (config_id.startswith("ds") and _DS_ID.match(config_id)))


def is_stream(cfg: Config) -> bool:
    """Whether `cfg` launches the stream kernel (a `ds` config)."""
    return cfg.param("kernel") == "stream"


def _one_of(what: str, name: str, value: int, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{what}: {name}={value} not allowed; use one of {allowed}")


def make_stream(bn: int, bk: int, warps: int, tiles: int = 1, fma: bool = False, atomic: bool = False,
                pdl: bool = False) -> Config:
    """A `ds` (stream kernel) config from explicit parameters (ConfigError naming the bad one)."""
    what = "triton_decode stream config"
    allowed = _DS_BN_FMA if fma else _DS_BN_DOT
    if bn not in allowed:
        raise ConfigError(f"{what}: BN={bn} not allowed{' with tl.dot' if not fma else ''}; use one of {allowed}")
    _one_of(what, "BK", bk, _DS_BK)
    _one_of(what, "warps", warps, _WARPS)
    per_thread = bn * bk * 2 // (32 * warps)
    if not 16 <= per_thread <= _DS_MAX_BYTES_PER_THREAD:
        raise ConfigError(f"{what}: a {bn} x {bk} slab over {warps} warps is {per_thread} bytes per thread; "
                          f"allowed 16..{_DS_MAX_BYTES_PER_THREAD} (one 16-byte vector up to 8)")
    if tiles not in _DS_TILES:
        raise ConfigError(f"{what}: T={tiles} K tiles per CTA not allowed; use one of {_DS_TILES}")
    cid = (f"ds_t{tiles}_n{bn}x{bk}_w{warps}" + ("_fma" if fma else "") + ("_at" if atomic else "")
           + ("_pdl" if pdl else ""))
    # split_k 1 and stages 2 for the cost model's tile (its split depends on K; two slabs in flight)
    return Config(cid, LANE, (("block", (MAX_M, bn, bk)), ("warps", warps), ("stages", 2), ("group_m", 1),
                              ("split_k", 1), ("atomic", bool(atomic)), ("pdl", bool(pdl)),
                              ("kernel", "stream"), ("tiles", tiles), ("fma", bool(fma))))


def _parse_stream(config_id: str) -> Config:
    m = _DS_ID.match(config_id)
    if not m:
        raise ConfigError(f"bad triton_decode config id {config_id!r}: expected ds_t1_n16x512_w8[_fma][_at][_pdl]")
    return _canonical(config_id, lambda: make_stream(int(m["bn"]), int(m["bk"]), int(m["w"]), int(m["tiles"]),
                                                     bool(m["fma"]), bool(m["at"]), bool(m["pdl"])))


def _canonical(config_id: str, build) -> Config:
    """The config `build` makes from an id's fields, which must spell that id exactly."""
    try:
        cfg = build()
    except ConfigError as exc:
        raise ConfigError(f"bad GEMM config id {config_id!r}: {exc}") from None
    if cfg.id != config_id:
        raise ConfigError(f"GEMM config id {config_id!r} is not canonical; expected {cfg.id!r}")
    return cfg


def make(bn: int, bk: int, warps: int, stages: int, split_k: int = 1, atomic: bool = False,
         pdl: bool = False, pf: int = 0, pf_normal: bool = False, pf_late: bool = False) -> Config:
    """A triton_decode config from explicit parameters (ConfigError naming the bad one)."""
    what = "triton_decode config"
    _one_of(what, "BN", bn, _BN)
    _one_of(what, "BK", bk, _BK)
    _one_of(what, "warps", warps, _WARPS)
    if not 1 <= stages <= 8:
        raise ConfigError(f"{what}: stages={stages} not allowed; use 1..8")
    if not 1 <= split_k <= 64:
        raise ConfigError(f"{what}: split_k={split_k} not allowed; use 1..64")
    if atomic and split_k == 1:
        raise ConfigError(f"{what}: _at (atomic reduction) needs split_k >= 2")
    if pf:
        _one_of(what, "prefetch tiles P (_pf)", pf, _PF)
    elif pf_normal or pf_late:
        raise ConfigError(f"{what}: _pfn / _pfw (prefetch options) need P >= 1 prefetched tiles")
    if pf_late and not pdl:
        raise ConfigError(f"{what}: _pfw (launch dependents after the wait) needs _pdl")
    pf_id = f"_pf{'n' if pf_normal else ''}{'w' if pf_late else ''}{pf}" if pf else ""
    cid = (f"dk{split_k}_n{bn}x{bk}_w{warps}_s{stages}" + ("_at" if atomic else "") + pf_id
           + ("_pdl" if pdl else ""))
    params = (("block", (MAX_M, bn, bk)), ("warps", warps), ("stages", stages),
              ("group_m", 1), ("split_k", split_k), ("atomic", bool(atomic)), ("pdl", bool(pdl)))
    params += (("pf", pf),) if pf else ()
    params += (("pf_normal", True),) if pf_normal else ()
    return Config(cid, LANE, params + ((("pf_late", True),) if pf_late else ()))


def parse(config_id: str) -> Config:
    if config_id.startswith("ds"):
        return _parse_stream(config_id)
    m = _ID.match(config_id)
    if not m:
        raise ConfigError(f"bad triton_decode config id {config_id!r}: expected dk4_n64x256_w4_s4[_at][_pf2][_pdl]")
    return _canonical(config_id, lambda: make(int(m["bn"]), int(m["bk"]), int(m["w"]), int(m["s"]),
                                              int(m["split"]), bool(m["at"]), bool(m["pdl"]), int(m["pf"] or 0),
                                              bool(m["pfn"]), bool(m["pfw"])))


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
    """dk: the pipelined x and W tiles (the peeled first W tile lives in registers). ds: the
    tl.dot operands' layout conversion (x's 16 rows and the slab) or, _fma, none beyond the
    reduction scratch."""
    _, bn, bk = cfg.param("block")
    if is_stream(cfg):
        return 0 if cfg.param("fma") else (MAX_M + bn) * bk * 2
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
    if cfg.param("pf") and cap < 80:
        return f"L2 prefetch with an eviction priority (_pf: prefetch.global.L2::evict_last) needs sm80 or newer, not sm{cap}"
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
    if is_stream(cfg):
        tiles = cfg.param("tiles")
        if tiles > 1 and tiles >= 2 * k_tiles:
            return (f"T={tiles} K tiles per CTA is at least twice the {k_tiles} K tiles of K={k} with BK={bk}: "
                    f"T={tiles // 2} is the same split with half the unrolled loads")
        return None
    if split > k_tiles:
        return f"split_k={split} exceeds the {k_tiles} K tiles of K={k} with BK={bk}"
    return None


def stream_grid() -> list[Config]:
    """The `ds` configs bench/decode_lane_s14.py measures side by side (15): tensor-core slabs of
    8-32 KB at 4-8 x 16-byte loads per thread (63-128 registers on sm90 with Triton 3.6, no spills:
    several CTAs per SM), 1, 2, 4 or 8 K tiles per CTA (fewer splits, a shorter reduction), the
    FMA path at 4-8 rows, atomic twins of the one- and two-tile shapes. Not in grid() (the build space) until the H200 shows which of them pay: the cost model
    cannot rank a kernel it has never seen measured."""
    dot = [make_stream(32, 256, 4, t) for t in (1, 2)] + [make_stream(64, 256, 8, t) for t in (1, 2, 4, 8)]
    dot.append(make_stream(16, 256, 4, 1))
    fma = [make_stream(4, 1024, 4, t, fma=True) for t in (1, 2, 4)] + [make_stream(8, 2048, 8, 1, fma=True)]
    atomic = [make_stream(32, 256, 4, 1, atomic=True), make_stream(64, 256, 8, 1, atomic=True),
              make_stream(64, 256, 8, 2, atomic=True), make_stream(4, 1024, 4, 1, fma=True, atomic=True)]
    return dot + fma + atomic


def pdl_twin(cfg: Config) -> Config:
    """`cfg` launched with programmatic dependent launch (itself when it already is)."""
    if cfg.param("pdl"):
        return cfg
    return parse(cfg.id + "_pdl")


def pf_grid() -> list[Config]:
    """The `_pf` configs bench/decode_pf.py measures (8, each also as its `_pdl` twin), 256-column
    tiles, 2-stage rings (24 KB of shared memory at 32 rows, 40 KB at 64, as Triton 3.6 compiles
    them for sm90: several CTAs per SM, so a PDL successor finds slots), except one 8-warp 3-stage
    twin (80 KB: two CTAs per SM) for contrast.
    At 4096 x 4096 (16 K tiles per row) they span: many small CTAs prefetching their whole run
    (split 16/8/4 with P = 1/2/4: 16-64 KB per CTA, 512-2048 CTAs, several waves); one partial
    wave of fat CTAs (split 2, 64 rows: 128 CTAs, one per SM, P = 8 the whole run, 256 KB each, or
    P = 2, 64 KB) and half a wave (split 1: 64 CTAs, P = 8 half the run), which leave the next
    kernel's CTAs room to become resident and prefetch early; the atomic reduction. P caps a CTA's
    early footprint where the weight is larger than L2 (a wave of 128-264 CTAs x 16-256 KB).
    Not in grid() (the build space): the cost model cannot tell a prefetch twin from its original."""
    out = [make(32, 256, 4, 2, split, pf=pf) for split, pf in ((16, 1), (8, 2), (4, 4))]
    out += [make(64, 256, 4, 2, 2, pf=8), make(64, 256, 4, 2, 2, pf=2), make(64, 256, 4, 2, 1, pf=8)]
    out += [make(32, 256, 4, 2, 8, atomic=True, pf=2), make(64, 256, 8, 3, 4, pf=4)]
    return out
