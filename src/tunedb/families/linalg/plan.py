"""`tunedb.recommend(op, dtype, n, batch, deps=...)`: the execution plan for one cell, no GPU.

The plan comes from the shipped table (the system tier's `db/<arch>/linalg.json`, written by
`tunedb linalg tune` on that GPU) when a measured entry covers the cell, else from the stated
heuristic (configs.heuristic). A cell's entry is its own signature's, or failing that the one of
n rounded up to a power of two (the kernels pad n to the next power of two, so that entry ran the
same register tile). Regions round the batch up: the first region whose batch bound is at or
above the call's. A kernel serves a batch only where the table's evidence supports it (the
selector's rule, runtime/serving.unsupported): within a factor 2 of a batch it won, between
two measured batches where the evidence says it beats the library arm, or past the grid's edge
where it beat the library arm by 1.5x at the edge (the family's `extrapolates` hook: batch 1 or
10**6 from a grid of 256..65536); elsewhere the library arm serves, and the plan says why
(docs/linalg.md, "recommend").
`deps="native"` reads the winners without optional dependencies (`regions_native`; absent means
the same as `regions`), `deps="all"` the full ones.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

from tunedb.errors import SignatureError
from tunedb.families.linalg import configs, signatures
from tunedb.records import Config, Entry, Signature
from tunedb.runtime import serving

DEPS: tuple[str, ...] = ("native", "all")


@dataclass(frozen=True)
class ExecutionPlan:
    """How to run one cell: the arm, its packing and launch shape, and where the choice came from."""

    op: str
    dtype: str
    n: int
    batch: int
    deps: str
    arm: str  # a config id or "torch"
    packing: str  # "thread" | "warp" | "block" | "lane" | "reg" | "rows" | "shfl" | "panel" | "pdot" | "pdottf"
    # | "nvmath" | "cuda" (the dependency tiers) | "library"
    problems_per_program: int | None  # None for the library arm
    warps: int | None
    grid: int | None  # programs launched
    cell: str  # "linalg|op=..|dt=..|n=.. batch<=H" (the measured region) or the heuristic's cell
    source: str  # "measured" | "heuristic" | "fallback" (the heuristic turned off by a setting, or an n
    # outside the family's range: torch's forms)
    reason: str

    def describe(self) -> str:
        launch = ("the library arm (torch)" if self.packing == "library" else
                  f"{self.packing} packing, {self.problems_per_program} problem(s) per program, "
                  f"{self.warps} warp(s), grid {self.grid}")
        return (f"{self.op} {self.dtype} n={self.n} batch={self.batch} (deps={self.deps}): {self.arm} "
                f"-- {launch}; {self.source} ({self.cell}); {self.reason}")


def _integer(value: Any) -> Any:
    """An integer-valued argument as an int (numpy's and torch's integer scalars, which a caller
    reading shapes or arrays passes, included); anything else as given, for the checks to name."""
    if isinstance(value, bool) or not isinstance(value, int) and _bool_or_array(value):
        return value  # True is not a batch, nor a tensor holding one or several values
    try:
        return operator.index(value)
    except (TypeError, RuntimeError):  # RuntimeError: a meta (or fake) tensor holds no value to read
        return value


def _bool_or_array(value: Any) -> bool:
    """A bool scalar of numpy or torch, or an array of any dimension (operator.index takes a
    one-element tensor, and a bool tensor, as the int it holds)."""
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    return shape is not None and (len(shape) > 0 or "bool" in str(dtype))


def _check_args(op: Any, dtype: Any, n: Any, batch: Any, deps: Any) -> None:
    """SignatureError (a ValueError) for a bad argument: they all key the cell, and op, dtype
    and n already raise it from signatures.check."""
    signatures.check(op, dtype, n)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise SignatureError(f"batch={batch!r} must be a positive int (the number of problems)")
    if deps not in DEPS:
        raise SignatureError(f"deps={deps!r} must be one of {', '.join(DEPS)} "
                             f"(native: no optional dependency; all: any measured arm)")


def serving_keys(sig: Signature) -> tuple[Signature, ...]:
    """Entries that may serve `sig`, most specific first: its own, then n's next power of two."""
    n = sig.get("n")
    up = 1 << (n - 1).bit_length()
    if up == n or up > signatures.N_MAX:
        return (sig,)
    return (sig, signatures.make_signature(sig.op, sig.dt, up))


def lookup(entry: Entry, batch: int, deps: str) -> tuple[str | None, int | None]:
    """(config id, the region's batch bound: None for the catch-all) of `batch` in `entry`."""
    regions = entry.regions
    native = getattr(entry, "regions_native", None)
    if deps == "native" and native:
        regions = native
    for region in regions:
        if region.m_hi is None or region.m_hi >= batch:
            return region.config_id, region.m_hi
    return None, None


def _table(arch_family: str) -> Any | None:
    from tunedb.database import tiers

    res = tiers.get("system", arch_family, signatures.FAMILY)
    return res.db if res is not None and res.usable else None


def _plan(op: str, dtype: str, n: int, batch: int, deps: str, config: Config, cell: str, source: str,
          reason: str) -> ExecutionPlan:
    if config.id in ("torch", "default"):
        return ExecutionPlan(op, dtype, n, batch, deps, "torch", "library", None, None, None, cell, source, reason)
    packing, per, warps = configs.shape_of(config)
    return ExecutionPlan(op, dtype, n, batch, deps, config.id, packing, per, warps,
                         configs.grid(config, batch), cell, source, reason)


def recommend(op: str, dtype: str, n: int, batch: int, deps: str = "native",
              arch: str = "sm90") -> ExecutionPlan:
    """The execution plan for (op, dtype, n, batch) on `arch`, from the shipped table or the
    heuristic (the serving path's: TUNEDB_MODEL_FALLBACK=0 turns it off, and the library arm
    serves). No GPU needed. Bad arguments raise errors naming the value and what is allowed."""
    n, batch = _integer(n), _integer(batch)
    dtype = signatures.dtype_key(dtype)  # torch.float32 or "float32" as well as fp32
    from tunedb import arch as arch_mod

    if arch not in arch_mod.SHIPPED_ARCHES:  # named for every n, also those torch's forms serve
        raise SignatureError(f"arch={arch!r} has no shipped profile; shipped: {', '.join(arch_mod.SHIPPED_ARCHES)}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise SignatureError(f"linalg n={n!r} must be an int >= 0 (the family's kernels cover "
                             f"{signatures.N_MIN}..{signatures.N_MAX}; other sizes run torch's forms)")
    if not signatures.N_MIN <= n <= signatures.N_MAX:
        _check_args(op, dtype, signatures.N_MIN, batch, deps)  # op, dtype, batch and deps still named
        return _plan(op, dtype, n, batch, deps, Config.sentinel("torch"),
                     f"linalg|op={op}|dt={dtype}|n={n} (outside n={signatures.N_MIN}..{signatures.N_MAX})", "fallback",
                     f"n={n} is outside the family's {signatures.N_MIN}..{signatures.N_MAX}: the entry points run "
                     f"torch's forms (cholesky_ex, solve_triangular, matmul); no kernel here is built for it")
    _check_args(op, dtype, n, batch, deps)
    from tunedb.families.linalg import FAMILY

    profile = arch_mod.shipped_profile(arch)
    sig = signatures.make_signature(op, dtype, n)
    from tunedb import settings

    # the selector's first rule (runtime/selector._choose): TUNEDB_HEURISTIC=0 bypasses every tier
    db = _table(arch) if settings.heuristic_enabled() else None
    skipped = []
    for key in serving_keys(sig) if db is not None else ():
        entry = db.entries.get(key)
        if entry is None:
            continue
        cid, hi = lookup(entry, batch, deps)
        if cid is None:
            continue
        beyond = serving.unsupported(FAMILY, entry, batch, cid, native=deps == "native")
        if beyond is not None:  # the selector's rule (runtime/serving.py): the library arm serves
            return _plan(op, dtype, n, batch, deps, Config.sentinel("torch"), f"{key} batch={batch}", "measured",
                         f"beyond the {arch} table's measured batches: {beyond}")
        config = Config.sentinel(cid) if cid in ("torch", "default") else configs.parse(cid)
        why = FAMILY.invalid_reason(config, sig, batch, profile)
        bound = "any batch" if hi is None else f"batch<={hi}"
        if why and not FAMILY.dependency_available(cid) and why == FAMILY.invalid_reason(config, sig, 1, profile):
            # (True for every native arm; at one problem the same reason: the dependency's alone)
            # deps="all" asks for the measured winner with every optional dependency: name it,
            # and say what serves on a machine without the dependency (the native regions)
            return _plan(op, dtype, n, batch, deps, config, f"{key} {bound}", "measured",
                         f"the {arch} table's winner with optional dependencies; {why}: without it "
                         f"the serving path runs the native winner (deps='native')")
        if why:
            skipped.append(f"{key} names {cid}, invalid here ({why})")
            continue
        note = "" if key == sig else f" (n={n} served by the n={key.get('n')} entry: same padded tile)"
        return _plan(op, dtype, n, batch, deps, config, f"{key} {bound}", "measured",
                     f"the {arch} table's winner{note}" + (f"; {'; '.join(skipped)}" if skipped else ""))
    from tunedb.runtime import untuned

    # the selector's default tier (runtime/untuned.answer): TUNEDB_MODEL_FALLBACK=0 turns the
    # heuristic off there, so the plan must say the library arm then, as the serving path runs it
    config = untuned.answer(FAMILY, sig, profile, batch, concrete=True)  # the arm run at this batch
    why = ("no table for " + arch) if db is None else (
        f"no measured entry for {sig} usable at batch={batch}" if skipped else f"no measured entry for {sig}")
    wanted, chosen = configs.heuristic_packing(sig), (configs.shape_of(config)[0] if not config.is_sentinel else None)
    rule = (f"heuristic: {chosen or wanted} packing for n={n}"
            + (f" ({wanted} has no valid config here)" if chosen and chosen != wanted else "")
            + f", problems per program filling {configs.PROGRAMS_PER_SM} programs per SM ({profile.sms} SMs)")
    if not settings.heuristic_enabled():
        why, rule = "TUNEDB_HEURISTIC=0 bypasses the tiers", "the family default serves"
    elif not settings.model_fallback_enabled():
        rule = "TUNEDB_MODEL_FALLBACK=0 turns the heuristic off: the library arm serves"
    elif config.id == "torch":
        rule = "heuristic: no kernel config applies, the library arm serves"
    guessed = settings.heuristic_enabled() and settings.model_fallback_enabled()
    return _plan(op, dtype, n, batch, deps, config, f"{sig} batch={batch} (unmeasured)",
                 "heuristic" if guessed else "fallback",
                 f"{why}; {rule}" + (f"; {'; '.join(skipped)}" if skipped else ""))
