"""autotune(): measure, at run time, the shapes no cached result covers; publish the winners.

    with tunedb.autotune(cache="tune.json"):
        y = model(x)          # the first call of a shape with no result measures it

While the context is active, a tuned op's resolution asks the autotune cache first (a hit at
or above M in M's bucket, see autotune_cache.py); on a miss it measures every candidate (the
family's compile set that is valid for the shape, plus its sentinels) under the measurement
protocol, records the winner at the M it was measured at, and serves it. With enabled=False, or
inside a CUDA-graph capture, a miss takes the fallback (the selector's chain). At exit the cache
file is written atomically; with publish=True the new winners are merged into the user tier
(locked merge-on-write) at their measured M, no catch-all, and a new epoch starts, so the
production path serves them after the context exits. measurer= and publisher= are injectable:
the whole flow runs on a CPU against fake measurements.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from tunedb.errors import AutotuneWarning, CaptureActiveError, DatabaseError
from tunedb.families.contract import hook
from tunedb.records import SENTINELS, Config, Entry, Measurement, Region, Signature
from tunedb.runtime import launch_table, report
from tunedb.runtime.autotune_cache import AutotuneCache, CacheRefused, Result, check_writable
from tunedb.runtime.nogpu import warn_no_gpu
from tunedb.runtime.tuner_defaults import Measurer, Publisher, environment, protocol_measurer, user_tier_publisher
from tunedb.runtime.tuner_args import check_arch, check_args, check_keywords
from tunedb.runtime.launch_table import _capturing as capturing  # the runtime's one capture check
from tunedb.runtime.selector import shipped_profile as selector_shipped

TIER = "autotune"


class Autotuner(contextlib.ContextDecorator):  # `with autotune():`, or `@autotune()` on a function
    """The state of one autotune() context; also what prewarm() measures with."""

    def __init__(self, cache: str | Path | None = "tune.json", publish: bool = True,
                 enabled: bool = True, *, measurer: Measurer | None = None,
                 publisher: Publisher | None = None, arch_family: str | None = None,
                 approximate: bool | None = None, top_k: int | None = 16,
                 working_set_bytes: int | None = None, timer: Any = None) -> None:
        check_args(cache, publish, enabled, top_k, working_set_bytes, approximate, measurer, publisher)
        check_arch(arch_family)
        self.path = Path(cache) if cache is not None else None
        self.publish = publish
        self.enabled = enabled
        self._on_gpu_only = measurer is None and timer is None  # the protocol's CUDA-graph timer
        self.measurer = measurer or functools.partial(
            protocol_measurer, working_set_bytes=working_set_bytes, timer=timer)
        self.publisher = publisher or user_tier_publisher
        self._arch_family = arch_family
        self._approximate = approximate
        self._entry = threading.RLock()  # one context however many threads enter it (the depth count)
        # held while a shape is measured, and by enter / exit before _entry (one order, no deadlock):
        # serving threads missing the same shape measured it once each, at once (timings that
        # overlap on one GPU disturb each other), and an exit flushed while one was measuring,
        # whose result then landed where nothing published or saved it
        self._measuring = threading.RLock()
        self.top_k = top_k
        self.cache: AutotuneCache | None = None
        self.save_path: Path | None = self.path
        self.measured: list[tuple[str, Result, tuple[Measurement, ...]]] = []
        self._failed: set[tuple[Signature, int]] = set()
        self._warned: set[tuple[Signature, str]] = set()
        self._ctx: Any = None
        self._left_ctx: Any = None  # measuring_guessed's context while active
        self._left_touched: list[Any] = []
        self._compiles: dict[str, Any] = {}  # family name -> compile_pool.CompilePool (or None)
        self._published = False  # the last flush published winners

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def arch_family(self) -> str:
        if self._arch_family is None:
            from tunedb.runtime import selector
            self._arch_family = selector.current_arch_family()
        return self._arch_family

    def open(self) -> "Autotuner":
        """Load the cache file (refusing one from another arch); idempotent."""
        if self.cache is not None:
            return self
        self.cache = AutotuneCache(environment(self.arch_family))
        if self.path is not None and os.path.lexists(self.path):
            try:
                self.cache.load_into(self.path)
            except CacheRefused as exc:
                self.save_path = self._beside(exc)
        return self

    def _beside(self, exc: CacheRefused) -> Path:
        """Where this run's results go when the cache file is unusable (left as it is): the
        first of <stem>.<arch><suffix>, <stem>.<arch>.2<suffix>, ... that is absent or loads
        (an earlier run's results there: built on). An unusable file is never overwritten."""
        path = self.path
        assert path is not None
        refused = [f"{path}: {exc}"]
        for n in range(1, 100):
            tag = self.arch_family if n == 1 else f"{self.arch_family}.{n}"
            side = path.with_name(f"{path.stem}.{tag}{path.suffix}")
            if not os.path.lexists(side):
                break
            try:
                self.cache.load_into(side)
                break
            except CacheRefused as again:
                refused.append(f"{side}: {again}")
        goes = (f"this run's results go to {side}" if self.cannot_measure() is None
                else "nothing is measured on this machine, so nothing is written")
        warnings.warn(f"autotune cache not loaded ({'; '.join(refused)}); left as it is, and {goes}",
                      AutotuneWarning, stacklevel=4)
        return side

    def __enter__(self) -> "Autotuner":
        with self._measuring, self._entry:  # threads entering one tuner at once each opened it and drove the depth below 0
            return self._enter()

    def _enter(self) -> "Autotuner":
        depth = self.__dict__.get("_depth", 0)
        if depth:  # re-entered while active (a helper opening the caller's tuner again): one context, the outermost's
            self._depth = depth + 1
            return self
        if self.enabled and self._on_gpu_only:
            warn_no_gpu("autotune", "every shape no tier covers takes the fallback and "
                        + (f"the cache {self.path} is not written" if self.path else "no result is kept"))
        self.open()
        if self.save_path is not None and (self.cache.dirty or (self.enabled and not self.cannot_measure())):
            check_writable(self.save_path)  # the exit's write, checked before anything is measured
        self._depth = 1  # only once the checks held: a refused enter leaves it as it was
        self._ctx = launch_table.overriding(self.resolve)
        self._ctx.__enter__()
        # Linears optimize() left as written because no table measured them: their calls do not
        # reach the tuned op, so hooks measure them (their output stays torch's in the context)
        measuring = self.enabled and not self.cannot_measure()
        self._left_ctx = report.measuring_guessed(self._measure_left) if measuring else None
        self._left_touched = self._left_ctx.__enter__() if self._left_ctx is not None else []
        return self

    def _measure_left(self, sig: Signature, m: int) -> None:
        from tunedb import families

        if capturing():
            return
        self.resolve(families.get(sig.family), sig, m)

    def __exit__(self, *exc: Any) -> None:
        with self._measuring, self._entry:  # after a measurement in flight: its result is flushed too
            self._exit(*exc)

    def _exit(self, *exc: Any) -> None:
        depth = self.__dict__.get("_depth", 0)
        if depth <= 0:
            raise RuntimeError("autotune() exited more times than it was entered")
        self._depth = depth - 1
        if self._depth > 0:  # an inner exit of a re-entered tuner: the outer block keeps measuring
            return
        ctx, self._ctx = self._ctx, None
        left_ctx, self._left_ctx = self._left_ctx, None
        try:
            if left_ctx is not None:
                left_ctx.__exit__(*exc)
            if ctx is not None:
                ctx.__exit__(*exc)
        finally:
            try:
                self.flush()
            finally:
                if self._published:  # a left Linear whose winner is a config is swapped in (optimize() again)
                    from tunedb.runtime import patching

                    for model in self._left_touched:
                        patching.swap_left(model)

    def flush(self) -> bool:
        """Publish new winners and write the cache file (a locked, atomic merge); safe to call
        twice. True when winners were published (a new epoch serves them). The publish comes
        first: a cache file that cannot be written (DatabaseError, naming it) loses nothing else."""
        if self.cache is None:
            return False
        published = self._published = bool(self.publish and self.measured and self._publish())
        if published:
            from tunedb.runtime import selector
            selector.reload()  # the production path serves the new winners from here on
        self.measured = []
        for pool in self._compiles.values():
            if pool is not None:
                pool.close()
        self._compiles = {}
        # nothing can be measured (no GPU): an older file's upgrade is not written either (the
        # warning said the cache is not written; it was rewritten with this machine's versions)
        idle = self._on_gpu_only and self.cannot_measure() is not None
        if self.save_path is not None and self.cache.dirty and not idle:
            try:
                self.cache.save(self.save_path)
            except (CacheRefused, OSError) as exc:
                kept = "published to the user tier" if published else "not published (publish=False or none new)"
                raise DatabaseError(f"autotune cache {self.save_path} not written: {exc}; this run's results "
                                    f"were {kept}") from None
        return published

    def cannot_measure(self) -> str | None:
        """Why this tuner measures nothing on this machine (the protocol's CUDA-graph timer and
        no CUDA GPU), or None. Then nothing is compiled either: a compile pool would only start
        processes (and, from a script on stdin, fail to: a spawned child re-runs __main__)."""
        if not self._on_gpu_only:
            return None
        import torch

        if torch.cuda.is_available():
            return None
        return ("no CUDA GPU here: tunedb measures on the GPU it serves (torch runs every call "
                "on this machine); pass measurer= or timer= to measure otherwise")

    def compile_ahead(self, work: Any) -> None:
        """Queue (family, sig, m) points' candidates in the family's compile pool, in order, so
        their compiles run in parallel ahead of tune() (prewarm hands its whole list). Only when
        measuring on the GPU, or when TUNEDB_COMPILE_JOBS asks for a pool."""
        from tunedb.build import compile_pool

        if not (self._on_gpu_only or compile_pool.configured()) or self.cannot_measure():
            return
        for family, sig, m in work:
            if family.name not in self._compiles:
                self._compiles[family.name] = compile_pool.for_family(family, self.arch_family)
            pool = self._compiles[family.name]
            if pool is not None:
                # what `tunedb prebuild` compiled loads from the cache: no process need start for it
                done = hook(family, "prebuilt_configs")(self.arch_family)
                ids = tuple(c for c in self.candidates(family, sig, m) if c not in done)
                if ids:
                    pool.add([(sig, ids)])

    # --- resolution -----------------------------------------------------------------------

    def lookup(self, sig: Signature, m: int) -> Result | None:
        self.open()
        assert self.cache is not None
        return self.cache.lookup(sig, m)

    def resolve(self, family: Any, sig: Signature, m: int) -> tuple[Config, str] | None:
        """The launch table's override: a cached or freshly measured winner, else None."""
        hit = self.lookup(sig, m)
        # A miss, or a cached winner this process cannot run (another lane, an approximate arm
        # without the opt-in), is measured here: once, the fresh winner replacing it.
        config = self._usable(family, sig, m, hit.config_id) if hit is not None else None
        if config is None and self.enabled and not capturing():
            with self._measuring:
                if self.__dict__.get("_depth", 1) <= 0:  # the context closed while this call waited
                    return None
                hit = self.lookup(sig, m)  # another thread may have measured it while this one waited
                config = self._usable(family, sig, m, hit.config_id) if hit is not None else None
                if config is None:
                    hit = self.tune(family, sig, m)
                    config = self._usable(family, sig, m, hit.config_id) if hit is not None else None
        return (config, TIER) if config is not None else None

    def tune(self, family: Any, sig: Signature, m: int, *,
             incumbent: str | None = None) -> Result | None:
        """Measure every candidate at (sig, m) now and record the winner; None when nothing
        could be measured (then the fallback serves). Never inside a CUDA-graph capture."""
        self.open()
        assert self.cache is not None
        if (sig, m) in self._failed:
            return None
        if capturing():
            raise CaptureActiveError(f"refusing to measure {sig} at M={m} inside a CUDA-graph capture; "
                                     f"measure before capturing (tunedb.prewarm)")
        ids = self.candidates(family, sig, m)
        if incumbent is None:
            incumbent = self._incumbent(family, sig, m)
        if incumbent is not None and incumbent not in ids:
            ids += (incumbent,)
        self.compile_ahead([(family, sig, m)])  # queued already by prewarm; else compiled in parallel now
        pool = self._compiles.get(family.name)
        if pool is not None:  # compiling is never timed
            pool.wait(sig, ids)
        try:
            results = tuple(self.measurer(family, sig, m, ids, incumbent))
        except Exception as exc:  # a failed measurement costs this shape its tuning, not the op
            self._failed.add((sig, m))
            warnings.warn(f"autotune could not measure {sig} at M={m} ({type(exc).__name__}: {exc}); "
                          f"the fallback serves it", AutotuneWarning, stacklevel=2)
            return None
        # the times the family's pick rule takes (a time of zero is a timer that could not
        # resolve the arm, session 41 on an H100: never a winner)
        times = {r.config_id: t for r in results if r.status.ok and r.config_id in ids
                 and (t := r.objective(0.0)) is not None and t > 0}
        if not times:
            self._failed.add((sig, m))
            why = "; ".join(f"{r.config_id}: {r.status.value}"
                            + (f" at {r.median_ms} ms" if r.status.ok else "") for r in results[:5]) or "no arm measured"
            warnings.warn(f"autotune found no usable arm for {sig} at M={m} ({why}); the fallback "
                          f"serves it", AutotuneWarning, stacklevel=2)
            return None
        # as the build's partition applies it: the fallback keeps the shape unless an arm beats
        # it by the gate; inside the tie band the simpler arm wins
        winner = hook(family, "pick_rule")().pick(times).winner
        best = next(r for r in results if r.config_id == winner and r.status.ok)
        result = self.cache.record(sig, m, best.config_id, best.median_ms)
        self.measured.append((family.name, result, results))
        return result

    def candidates(self, family: Any, sig: Signature, m: int) -> tuple[str, ...]:
        """The family's compile set valid at (sig, m) (pruned to the cost model's top_k when it
        is larger, e.g. under TUNEDB_COMPILE_SET=all), then its sentinels."""
        profile = selector_shipped(self.arch_family)
        configs = [c for c in family.compile_set(self.arch_family, ())
                   if profile is None or family.invalid_reason(c, sig, m, profile) is None]
        if self.top_k and len(configs) > self.top_k and profile is not None:
            configs = _top_k(family, sig, m, configs, profile, self.top_k)
        ids = [c.id for c in configs]
        approximate = self._approximate_now()
        ids += [s for s in family.sentinels(sig, approximate) if s not in ids]
        return tuple(ids)

    def _approximate_now(self) -> bool:
        """This context's approximate opt-in, else TUNEDB_APPROXIMATE."""
        from tunedb import settings

        return settings.approximate_allowed() if self._approximate is None else self._approximate

    def _incumbent(self, family: Any, sig: Signature, m: int) -> str | None:
        from tunedb.runtime import selector
        try:
            return selector.peek(family.name, sig, m).config.id
        except Exception:  # no incumbent is fine: the protocol still keeps the default
            return None

    def _usable(self, family: Any, sig: Signature, m: int, config_id: str) -> Config | None:
        """The cached winner as a Config, or None (warned once) when this process cannot run
        it for sig at M: an unknown id, an infeasible config (a lane such as triton_decode serves
        only some sizes), or a sentinel that does not apply."""
        profile = selector_shipped(self.arch_family)
        try:
            if config_id == "default":
                return family.default_config(sig, profile)
            config = family.parse_config(config_id)
            if config.is_sentinel:
                approximate = self._approximate_now()
                why = None if config_id in family.sentinels(sig, approximate) else "it does not apply"
            else:
                why = family.invalid_reason(config, sig, m, profile) if profile is not None else None
        except Exception as exc:  # a malformed id in someone's cache file must not break the op
            why = f"{type(exc).__name__}: {exc}"
        if why is None:
            return config
        if (sig, config_id) not in self._warned:
            self._warned.add((sig, config_id))
            warnings.warn(f"autotune cache names config {config_id!r} for {sig}, which cannot serve "
                          f"here ({why}); the fallback serves it", AutotuneWarning, stacklevel=3)
        return None

    # --- publishing -----------------------------------------------------------------------

    def entries(self) -> dict[str, tuple[tuple[Entry, ...], dict[str, Config]]]:
        """Per kernel family: the entries this run measured (regions at measured M, no
        catch-all) and the configs they name."""
        from tunedb import families

        by_family: dict[str, dict[Signature, list[tuple[Result, tuple[Measurement, ...]]]]] = {}
        for fam_name, result, arms in self.measured:
            by_family.setdefault(fam_name, {}).setdefault(result.signature, []).append((result, arms))
        out = {}
        for fam_name, per_sig in by_family.items():
            fam = families.get(fam_name)
            entries, configs = [], {}
            for sig, measured in sorted(per_sig.items()):
                # a shape measured twice keeps its last result
                rows = sorted({r.m: (r, arms) for r, arms in measured}.values(),
                              key=lambda row: row[0].m or 0)
                regions = tuple(Region(r.m, r.config_id) for r, _ in rows)
                evidence = {f"M={r.m}": _evidence(arms) for r, arms in rows}
                notes = tuple(f"M={r.m}*: {r.config_id} (autotune)" for r, _ in rows)
                entries.append(Entry(sig, regions, evidence, "autotune", {}, notes))
                for r, _ in rows:
                    if r.config_id not in configs and r.config_id not in SENTINELS:
                        configs[r.config_id] = fam.parse_config(r.config_id)
            out[fam_name] = (tuple(entries), configs)
        return out

    def _publish(self) -> bool:
        published = False
        for fam_name, (entries, configs) in self.entries().items():
            try:
                self.publisher(fam_name, self.arch_family, entries, configs)
                published = True
            except Exception as exc:  # the cache file still holds the results: warn, not raise
                warnings.warn(f"autotune did not publish {len(entries)} {fam_name} entr"
                              f"{'y' if len(entries) == 1 else 'ies'} to the user tier: "
                              f"{type(exc).__name__}: {exc}", AutotuneWarning, stacklevel=3)
        return published


def _evidence(arms: tuple[Measurement, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in arms:
        if r.status.ok:
            out[r.config_id] = [r.median_ms, r.sigma_ms, r.n]
        else:
            out[r.config_id] = r.status.value
    if arms:
        out["_l2"] = arms[0].l2
    return out


def _top_k(family: Any, sig: Signature, m: int, configs: list[Config], profile: Any,
           k: int) -> list[Config]:
    """The family cost model's k predicted-fastest configs; all of them without a model."""
    model = hook(family, "cost_model")(profile, None)
    if model is None:
        return configs
    try:
        ranked = set(model.rank(sig, m, configs, k))
    except Exception:  # a model that cannot rank this shape: measure everything
        return configs
    return [c for c in configs if c.id in ranked] or configs


def autotune(cache: str | Path | None | bool = "tune.json", publish: bool = True,
             enabled: bool = True, **kwargs: Any) -> Autotuner:
    """The autotune() context manager, also a decorator (see the module docstring). cache=None keeps results in
    memory only; autotune(True) / autotune(False) read as enabled= with the default cache.
    Keyword-only extras: measurer=, publisher=, arch_family=, approximate=, top_k= (prune a compile set
    larger than this with the cost model; None measures all), working_set_bytes= (weights timed cold
    past L2), timer= (the protocol's; None: CUDA graphs; measure.timers.FakeTimer runs without a GPU)."""
    if isinstance(cache, bool):
        cache, enabled = "tune.json", cache
    check_keywords("autotune", kwargs, TUNER_KEYWORDS)
    return Autotuner(cache, publish, enabled, **kwargs)


# autotune()'s and prewarm()'s keywords past the positional ones: the Autotuner's keyword-only parameters
TUNER_KEYWORDS = tuple(p.name for p in inspect.signature(Autotuner.__init__).parameters.values()
                       if p.kind is inspect.Parameter.KEYWORD_ONLY)
