"""The linalg config space as the family sees it: the kernels' configs, their shape, and the rules.

The Triton arms (their ids, config space and validity) belong to the kernel modules, imported
lazily: `kernels_space.py` (pure: ``config_space()``, ``invalid_reason(op, packing, P, warps,
n, dtype)``) and `launch.py` (``launch(op, config, *tensors, out=, inplace=)``). Their ids name the packing, the problems per program and the warps:
`thread_p64_w4` (many problems per program, each carried by one thread), `warp_p8_w4` (one
problem per warp, several per program), `block_w4` (one problem per program across its warps),
`lane_p2_w1` (potrf/posv up to n = 32: one matrix column per lane, rows in its registers),
`reg_p32_w1` (potrf/posv at small n: one problem per thread, its lower triangle in registers),
`rows_p2_w1` (potrf/posv up to n = 32: a few threads per problem, whole rows each),
`shfl_p1_w1` (potrf/posv/trsv up to n = 32: the lane layout, pivots broadcast by warp shuffles),
`panel_w2` (potrf/posv/trsv from n = 16: one problem per program, left-looking in panels of 8
columns through L and barriers), `pdot_w2` / `pdottf_w2` (potrf/posv from n = 33: the panel
packing with its update on tl.dot, fp32 FMA or fp64 DMMA / fp32 tf32x3).
Without the kernel module the family has the library arm only: nothing is pretended. The
optional dependency tier (`kernels_nvmath.py`, `nvmath_b1`: potrf/posv through cuSOLVERDx) and the
CUDA C++ tier (`kernels_cuda.py`, `cuda_p<P>_w<W>` / `cudas_p<P>_w<W>`: potrf/posv to n = 64 and
trsv to n = 32; `cudat_t<TS>`, kernels_cuda_tile.py: all three from n = 33 to 128; compiled by NVRTC) join the space only where `dependency_tier_available(tier)`.

Sentinels: `torch` (the library arm: bmm / matmul, cholesky_ex, solve_triangular; capturable),
`default` (what an unmeasured cell runs with no guess allowed: `torch`) and `heuristic` (the
shape rule below). `torch_checked` (torch.linalg.cholesky, cholesky_solve: MAGMA's potrs) cannot
be captured in a CUDA graph: it is measured eagerly and reported, never served.
"""
from __future__ import annotations

import importlib
import re
from functools import lru_cache
from typing import Any, Sequence

from tunedb.errors import ConfigError
from tunedb.records import SENTINELS, ArchProfile, Config, Signature

KERNEL_MODULE = "tunedb.families.linalg.launch"
SPACE_MODULE = "tunedb.families.linalg.kernels_space"
PACKINGS: tuple[str, ...] = ("thread", "warp", "block", "lane", "reg", "rows", "shfl", "panel", "pdot", "pdottf")
LANES: tuple[str, ...] = (*PACKINGS, "nvmath", "cuda", "torch")
LIBRARY = "torch"
# The library arm as a user who calls the obvious API pays (torch.linalg.cholesky, which checks
# info on the host, and cholesky_solve): cannot be captured; measured eagerly, never served.
EAGER_ONLY = "torch_checked"
# An arm whose id starts with one of these needs an optional dependency (spec 003's tier):
# `nvmath_b{B}` (kernels_nvmath.py: cuSOLVERDx through nvmath-python's device API), in the
# space only where nvmath-python and numba-cuda are installed; `cuda_p{P}_w{W}`, `cudas_p{P}_w{W}`
# and `cudat_t{TS}` (kernels_cuda.py, kernels_cuda_tile.py: CUDA C++ compiled at run time), only
# where torch sees a GPU and can compile with NVRTC. Both
# take a cell only past the pick rule's dependency margin, and each entry keeps the native
# (Triton) winners for a machine without them.
DEPENDENCIES: dict[str, str] = {"nvmath": "nvmath-python", "cuda": "NVRTC (torch.cuda's run-time compiler)"}
_ID = re.compile(r"^(thread|warp|block|lane|reg|rows|shfl|panel|pdot|pdottf)(?:_p([0-9]+))?_w([0-9]+)$")
WARP_THREADS = 32
_ONE_PROBLEM = ("block", "panel", "pdot", "pdottf")  # ids without _p<P>


def _optional(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise  # the module exists and something it imports is missing: say so
        return None


def kernels() -> Any | None:
    """The launch module, or None when it is not there (the library arm serves alone)."""
    return _optional(KERNEL_MODULE)


def space() -> Any | None:
    """The kernels' config-space module (pure Python), or None."""
    return _optional(SPACE_MODULE)


@lru_cache(maxsize=8)
def config_space(arch_family: str) -> tuple[Config, ...]:
    """The kernels' configs (none without them), in a fixed order. The same space on every
    arch today: validity is by op, n and dtype (register budget), not by SM count."""
    mod = space()
    if mod is None:
        return ()
    from tunedb.families.linalg import kernels_cuda, kernels_nvmath

    deps: tuple[str, ...] = ()
    if dependency_tier_available("nvmath"):
        deps = tuple(kernels_nvmath.config_id(b) for b in kernels_nvmath.BATCHES_PER_BLOCK)
    if dependency_tier_available("cuda"):  # every (P, W) the tier has at some n; validity is per cell
        deps += kernels_cuda.all_ids()
    ids = (*(c.id for c in mod.config_space()), *deps)
    return tuple(sorted((parse(cid) for cid in ids), key=lambda c: c.id))


def parse(config_id: str) -> Config:
    """A config from its id: a sentinel, or packing[_pP]_wW; ConfigError otherwise."""
    if not isinstance(config_id, str):
        raise ConfigError(f"config id must be a string, got {config_id!r}")
    if config_id in SENTINELS:
        return Config.sentinel(config_id)
    if config_id.startswith("nvmath"):
        from tunedb.families.linalg import kernels_nvmath

        bpb = kernels_nvmath.parse_bpb(config_id)
        if bpb is None or bpb < 1 or config_id != kernels_nvmath.config_id(bpb):
            raise ConfigError(f"bad linalg config id {config_id!r}: the dependency tier's ids are nvmath_b<B>, "
                              "B >= 1 without leading zeros")
        return Config(config_id, "nvmath", (("packing", "nvmath"), ("per_program", bpb), ("warps", 0)))
    if config_id.startswith("cuda"):
        from tunedb.families.linalg import kernels_cuda

        ts = kernels_cuda.tile.parse(config_id)
        if ts is not None and config_id == kernels_cuda.tile.config_id(ts):
            return Config(config_id, "cuda", (("packing", "cuda"), ("per_program", 1), ("warps", 0), ("tile", ts)))
        bb = kernels_cuda.blocked.parse(config_id)
        if bb is not None:  # parse admits the canonical id only
            return Config(config_id, "cuda", (("packing", "cuda"), ("per_program", 1), ("warps", bb[1]), ("panel", bb[0])))
        ww = kernels_cuda.wide.parse(config_id)
        if ww is not None:  # parse admits the canonical id only
            return Config(config_id, "cuda", (("packing", "cuda"), ("per_program", ww[0]), ("warps", ww[1]), ("wide", 1)))
        shape = kernels_cuda.parse(config_id)
        if shape is None or config_id != kernels_cuda.config_id(*shape):
            raise ConfigError(f"bad linalg config id {config_id!r}: the CUDA tier's ids are cuda_p<P>_w<W> "
                              "(pipelined pivots), cudas_p<P>_w<W> (serial), cudaw_p<P>_w<W> (two rows a "
                              "lane), cudat_t<TS> (tiles) and cudab_b<NB>_w<W> (panels), without leading zeros")
        return Config(config_id, "cuda", (("packing", "cuda"), ("per_program", shape[0]), ("warps", shape[1])))
    match = _ID.match(config_id)
    if match is None:
        raise ConfigError(f"bad linalg config id {config_id!r}: expected a sentinel "
                          f"({', '.join(SENTINELS)}) or thread_p<P>_w<W>, warp_p<P>_w<W>, block_w<W>, "
                          "lane_p<P>_w<W>, reg_p<P>_w<W>, rows_p<P>_w<W>, shfl_p<P>_w1, panel_w<W>, pdot_w<W>, pdottf_w<W>")
    packing, per, warps = match.group(1), match.group(2), int(match.group(3))
    if packing in _ONE_PROBLEM and per is not None:
        raise ConfigError(f"bad linalg config id {config_id!r}: a {packing} config runs one problem per program")
    if packing not in _ONE_PROBLEM and per is None:
        raise ConfigError(f"bad linalg config id {config_id!r}: {packing} configs name their problems "
                          f"per program (_p<P>)")
    return Config(config_id, packing, (("packing", packing), ("per_program", int(per or 1)),
                                       ("warps", warps)))


def shape_of(config: Config) -> tuple[str, int, int]:
    """(packing, problems per program, warps) of a Triton config."""
    packing = config.param("packing") or config.lane
    per = config.param("per_program") or config.param("problems_per_program")
    warps = config.param("warps") or config.param("num_warps")
    if packing not in PACKINGS or per is None or warps is None:
        got = parse(config.id)
        return got.param("packing"), got.param("per_program"), got.param("warps")
    return str(packing), int(per), int(warps)


GRID_X_MAX = 2 ** 31 - 1  # CUDA's limit on a launch grid's x dimension: the Triton arms' programs


def grid(config: Config, batch: int) -> int:
    """Programs launched for `batch` problems."""
    _packing, per, _warps = shape_of(config)
    return max(1, -(-int(batch) // per))  # integer ceil: exact at any batch (a float loses it past 2**53)


def invalid_reason(config: Config, sig: Signature, batch: int | None, arch: ArchProfile | None) -> str | None:
    """THE validity predicate: None when `config` may run `sig` (at `batch`; None: any batch)."""
    if config.id in ("torch", "default"):
        return None
    if config.id == "heuristic":
        return None  # resolves to a valid config or the library arm at each call
    if config.is_sentinel:
        return f"sentinel {config.id!r} does not apply to linalg"
    dep = dependency(config.id)
    # the batch first: a reason of its own, not a missing dependency's (recommend(deps="all") names an
    # arm whose only reason is a missing NVRTC); the CUDA kernels take it as a 32-bit int, and the
    # nvmath tier launches a block a problem (a grid's x dimension stops at 2**31 - 1)
    if dep is not None and batch is not None and batch >= 2 ** 31:
        return f"{config.id} takes batch < 2**31, got {batch}"
    if dep == "cuda":
        from tunedb.families.linalg import kernels_cuda

        why = kernels_cuda.arm_invalid(sig.op, config.id, sig.get("n"), sig.dt)  # unknown ids too
        if why is None and arch is not None:
            need = kernels_cuda.arm_smem(sig.op, config.id, sig.get("n"), sig.dt)
            if need > arch.smem_per_block:
                why = (f"{config.id} at n={sig.get('n')} {sig.dt} needs {need} B of shared memory a block; "
                       f"{arch.arch_family} gives at most {arch.smem_per_block}")
        return why
    if dep is not None:
        from tunedb.families.linalg import kernels_nvmath

        bpb = kernels_nvmath.parse_bpb(config.id)
        if bpb is None:
            return f"{config.id} is not an arm of the {DEPENDENCIES[dep]} tier (ids: nvmath_b<B>)"
        need = kernels_nvmath.smem_bytes(sig.get("n"), sig.dt, bpb)
        if arch is not None and need > arch.smem_per_block:  # the kernel module plans for sm90's
            return (f"{config.id} at n={sig.get('n')} {sig.dt} needs {need} B of shared memory a block; "
                    f"{arch.arch_family} gives at most {arch.smem_per_block}")
        return kernels_nvmath.invalid_reason(sig.op, bpb, sig.get("n"), sig.dt)
    mod = space()
    if mod is None:
        return f"{config.id}: the linalg kernel modules ({SPACE_MODULE}) are not available"
    packing, per, warps = shape_of(config)
    why = mod.invalid_reason(sig.op, packing, per, warps, sig.get("n"), sig.dt)
    if why is None and batch is not None and grid(config, batch) > GRID_X_MAX:
        why = f"{config.id} would launch {grid(config, batch)} programs at batch {batch}; CUDA allows {GRID_X_MAX}"
    return why


def simplicity(config_id: str) -> int:
    """Lower is simpler: the library arm (the fallback keeps a tie), then thread (sequential)
    before warp (shuffles) before block (barriers) before lane (fully unrolled) before reg (unrolled,
    one problem per thread) before rows (unrolled, a few threads per problem) before shfl
    (unrolled, gathers across lanes) before panel (panel loops through memory and barriers)
    before pdot / pdottf (the same with tl.dot products) before the CUDA tier (run-time compiled);
    within a packing fewer warps, then fewer
    problems per program (a total order, so which of two tied configs of one packing takes a
    cell never depends on noise); anything else last."""
    if config_id in (LIBRARY, "default"):
        return 0
    if config_id.startswith("cuda"):  # after every Triton packing; serial pivots, then fewer warps first
        from tunedb.families.linalg import kernels_cuda

        shape = kernels_cuda.parse(config_id)
        if shape is not None:
            return (len(PACKINGS) + 1) * _RANK + shape[2] * 500_000 + min(shape[1], 499) * 1000 + min(shape[0], 999)
        ww = kernels_cuda.wide.parse(config_id)
        if ww is not None:  # after the warp/block kernels, before the tiles; fewer warps first
            return (len(PACKINGS) + 1) * _RANK + 800_000 + min(ww[1], 99) * 1000 + min(ww[0], 999)
        ts = kernels_cuda.tile.parse(config_id)
        if ts is not None:  # after the warp/block kernels; smaller tiles (more threads) last
            return (len(PACKINGS) + 1) * _RANK + 900_000 + (99 - min(ts, 99))
        bb = kernels_cuda.blocked.parse(config_id)
        if bb is not None:  # after the tiles; fewer warps, then narrower panels first
            return (len(PACKINGS) + 1) * _RANK + 950_000 + min(bb[1], 99) * 100 + min(bb[0], 99)
    match = _ID.match(config_id)
    if match is None:
        return (len(PACKINGS) + 2) * _RANK
    packing, per, warps = match.group(1), int(match.group(2) or 1), int(match.group(3))
    return (PACKINGS.index(packing) + 1) * _RANK + min(warps, 999) * 1000 + min(per, 999)


_RANK = 1_000_000  # one packing's span in simplicity()


_DEVICE_API: dict[str, bool] = {}  # whether nvmath.device imported in this process (asked once)


def dependency_tier_available(tier: str = "nvmath") -> bool:
    """Whether an optional tier can run here. "cuda" (kernels_cuda): a CUDA device and NVRTC
    through torch (kernels_cuda.available, asked once a process). "nvmath" (kernels_nvmath): its
    packages are found (kernels_nvmath.available) and, once per process, its device API imports
    (nvmath.device loads libmathdx and reads its version: plain nvmath-python without the device
    extra, or a machine without a CUDA driver, stops there). Any exception counts as absent: the
    probe finds `numba.cuda`, which executes numba's own __init__, and a broken numba (an OSError
    from llvmlite, an AttributeError from a numpy it predates) must not take the native space
    (every linalg selection) down with it."""
    if tier == "cuda":
        from tunedb.families.linalg import kernels_cuda

        return kernels_cuda.available()
    if tier != "nvmath":
        raise ValueError(f"unknown linalg tier {tier!r}; tiers: {', '.join(DEPENDENCIES)}")
    from tunedb.families.linalg import kernels_nvmath

    try:
        if not kernels_nvmath.available():
            return False
    except Exception:
        return False
    got = _DEVICE_API.get("nvmath")
    if got is None:
        try:
            kernels_nvmath._numba_cuda()  # numba.cuda after the row_stack alias
            importlib.import_module("nvmath.device")
            got = True
        except Exception:
            got = False
        _DEVICE_API["nvmath"] = got
    return got


def dependency(config_id: str) -> str | None:
    """The optional dependency an arm needs (spec 003's tier), or None for a native arm."""
    for prefix in DEPENDENCIES:
        if config_id.startswith(prefix):
            return prefix
    return None


# --- the heuristic --------------------------------------------------------------------------
# The stated rule for a cell nobody measured. Packing by n: the H200 feasibility run (ANCHORS,
# "Small batched linear algebra") found the best packing of a register-resident Cholesky moving
# from 64 problems per program at n=4 to one per program at n=32; GLASS's measured defaults put
# dot on warps at every n and factor/solve on warps. So: thread up to n=8 (dot: up to n=4), warp
# up to n=32, block above. Then the first packing, from that one towards the wider ones (then the
# narrower), with a config that still launches two programs per SM (a full wave with room to hide
# latency), at its most problems per program; when none can, that packing's fewest. (A thread
# program carries at least 32 problems per warp, so at a small batch the warps take the cell.)
THREAD_MAX_N = 8
WARP_MAX_N = 32
PROGRAMS_PER_SM = 2


def heuristic_packing(sig: Signature) -> str:
    n = sig.get("n")
    if n <= (4 if sig.op == "dot" else THREAD_MAX_N):
        return "thread"
    return "warp" if n <= WARP_MAX_N else "block"


def heuristic(sig: Signature, batch: int, candidates: Sequence[Config], sms: int) -> Config | None:
    """The heuristic's pick among `candidates` (valid Triton configs), or None (no candidate of
    any packing: the library arm serves)."""
    triton = [c for c in candidates if not c.is_sentinel and dependency(c.id) is None]
    if not triton:
        return None
    want = heuristic_packing(sig)
    order = PACKINGS[PACKINGS.index(want):] + PACKINGS[:PACKINGS.index(want)][::-1]
    by_packing = {p: [c for c in triton if shape_of(c)[0] == p] for p in order}
    target = PROGRAMS_PER_SM * max(1, sms)
    for packing in order:  # the first packing that can fill the GPU: its most problems per program
        filling = [c for c in by_packing[packing] if grid(c, batch) >= target]
        if filling:
            return min(filling, key=lambda c: (-shape_of(c)[1], abs(shape_of(c)[2] - 4), c.id))
    same = next(by_packing[p] for p in order if by_packing[p])  # none fills: the fewest per program
    return min(same, key=lambda c: (shape_of(c)[1], abs(shape_of(c)[2] - 4), c.id))
