"""Run-time config selection: user tier, then system tier, then the cost model, then the default.

`resolve(family, sig, m)` answers from a memo keyed per (epoch, shape): a repeated call is one
dict lookup plus one counter increment. The first call of a shape in an epoch walks the chain:
an entry's region (M rounded up) names a config, which must be in the family's compiled set
and pass its validity predicate, else it is warned about once and the next tier answers.
`reload()` starts a new epoch; nothing else changes a selection inside a process, so a
captured CUDA graph and an eager call always run the same kernel.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tunedb import database, families, settings
from tunedb.database import tiers
from tunedb.families.contract import has_hook, hook
from tunedb.runtime import serving, untuned
from tunedb.errors import SignatureError, TunedbError
from tunedb.records import SENTINELS, ArchProfile, Config, Signature

TIER_NAMES: tuple[str, ...] = ("user", "system", "model", "default")
REPORT_NAMES = {"user": "user", "system": "system", "model": "cost model", "default": "default"}

Ranker = Callable[[Signature, int, "tuple[Config, ...]"], "Config | None"]


@dataclass(frozen=True)
class Resolution:
    """What serves one (family, signature, M): the config and the tier that chose it.

    entry_signature is the database key that answered (e.g. the dt=half entry serving a bf16
    call); None for the model and default tiers. A region naming the sentinel 'default'
    resolves to the family's concrete default config; other sentinels stay Config.sentinel().
    """

    config: Config
    tier: str
    entry_signature: Signature | None = None


class Slot:
    __slots__ = ("resolution", "calls")

    def __init__(self, resolution: Resolution) -> None:
        self.resolution = resolution
        self.calls = 0


_lock = threading.RLock()
_memo: dict[tuple[str, Signature, int], Slot] = {}
_compiled: dict[str, dict[str, Config]] = {}  # family -> id -> compiled config, this epoch
_past_counts: dict[tuple[str, str, str], int] = {}  # (family, signature, tier) from earlier epochs
_rankers: dict[str, Ranker] = {}
_family_rankers: dict[str, Ranker | None] = {}  # each family's cost-model pick, built this epoch
_family_models: dict[str, Any] = {}  # each family's cost model (or None), built this epoch
# (family, database file) -> why its `model` object cannot calibrate (None: it can), this epoch:
# model_params runs at every launch-table bind (host_bound), the check parses the whole object
_model_problems: dict[tuple[str, str], str | None] = {}
_arch: dict[str, Any] = {}  # "family", "profile": pinned or detected; empty until first needed


def resolve(family: str, sig: Signature, m: int) -> Resolution:
    """The config serving `sig` at size `m`, and the tier it came from. Counted per call."""
    slot = _memo.get((family, sig, m))
    if slot is None:
        slot = _resolve_slow(family, sig, m)
    slot.calls += 1  # unlocked: a lost increment under thread races is an accepted miscount
    return slot.resolution


def slot(family: str, sig: Signature, m: int) -> Slot:
    """The memo slot serving (family, sig, m) this epoch, not counted: a caller that issues the
    calls itself (the runtime's launch table) adds them to slot.calls, so the per-tier counters
    see every call and no second counter exists."""
    found = _memo.get((family, sig, m))
    return found if found is not None else _resolve_slow(family, sig, m)


def peek(family: str, sig: Signature, m: int) -> Resolution:
    """resolve() without counting a call: for tunedb's own lookups (prewarm, autotune, plans),
    so the per-tier counters report only the calls a model made."""
    return slot(family, sig, m).resolution


def _resolve_slow(family: str, sig: Signature, m: int) -> Slot:
    if not isinstance(sig, Signature):
        raise SignatureError(f"resolve() needs a Signature, got {type(sig).__name__} {sig!r}")
    if sig.family != family:
        raise SignatureError(f"signature {sig} belongs to kernel family {sig.family!r}, not {family!r}")
    if not isinstance(m, int) or isinstance(m, bool) or m < 0:
        raise ValueError(f"M={m!r} must be a non-negative int")
    with _lock:
        slot = _memo.get((family, sig, m))
        if slot is None:
            fam = families.get(family)
            check_signature(fam, sig)
            slot = Slot(_choose(fam, sig, m))
            _memo[(family, sig, m)] = slot
        return slot


def check_signature(fam: Any, sig: Signature) -> None:
    """SignatureError naming the bad field and what is allowed when `sig` is no key of `fam`'s
    (an op it lacks, a dtype it does not serve, a field missing, extra, mistyped or out of range):
    no tier can serve it, and its default tier's config would be judged on nothing."""
    if sig.op not in fam.ops:
        raise SignatureError(f"{sig}: op {sig.op!r} is not an op of kernel family {fam.name!r}; "
                             f"its ops: {', '.join(fam.ops)}")
    fam.schema.check(sig)
    own = getattr(fam, "check_key", None)
    if own is not None:
        own(sig)


def _choose(fam: Any, sig: Signature, m: int) -> Resolution:
    arch_family, profile = _arch_state()
    if profile is None:
        tiers.warn_once("selector", f"no-profile:{arch_family}",
                        f"tunedb: no arch profile for {arch_family}; every shape takes the family's "
                        f"fallback, untuned (measure one: `python -m tunedb.arch --measure`, or call "
                        f"tunedb.runtime.selector.configure(arch=...))")
        return Resolution(untuned.unprofiled(fam, sig), "default", None)
    if not settings.heuristic_enabled() or m == 0:
        # M=0: an empty call has no size a region or the model could price (a region's config
        # is invalid there, which warned against the file that holds it): the family's own answer
        return _default(fam, sig, profile)
    files = database.lookup(arch_family, fam.name)
    compiled = _compiled_set(fam, arch_family, files)
    for res, key, cid in serving.walk(fam, sig, m, ((res, res.db.entries) for res in files), record=True):
        config = _usable(fam, res, key, cid, sig, m, compiled, profile)
        if config is not None:
            return Resolution(config, res.tier, key)
    ranker = _ranker_for(fam, profile) if settings.model_fallback_enabled() else None
    if ranker is not None:
        config = _rank(fam, ranker, sig, m, compiled, profile)
        if config is not None:
            return Resolution(config, "model", None)
    return _default(fam, sig, profile, m)


def _default(fam: Any, sig: Signature, profile: ArchProfile | None, m: int | None = None) -> Resolution:
    """The default tier's answer (runtime/untuned.py: heuristic, else fallback, else default)."""
    return Resolution(untuned.answer(fam, sig, profile, m), "default", None)


def _usable(fam: Any, res: database.LoadResult, key: Signature, cid: str, sig: Signature, m: int,
            compiled: Mapping[str, Config], profile: ArchProfile) -> Config | None:
    where = f"{res.tier} tier {res.path} entry {key} names config {cid!r}"
    if cid in SENTINELS:
        if cid not in fam.sentinels(sig, settings.approximate_allowed()):
            return _skip(res, key, cid, f"{where}, a sentinel that does not apply to {sig}")
        config = fam.default_config(sig, profile) if cid == "default" else Config.sentinel(cid)
    else:
        config = compiled.get(cid)
        if config is None:
            return _skip(res, key, cid, f"{where}, which is not in this process's compiled set "
                                        f"(TUNEDB_COMPILE_SET={settings.compile_set()})")
    # judged at the call's size: a lane valid only at some sizes (GEMM's triton_decode, M <= 16)
    # serves the regions measured there, and a region rounds up to its largest measured size
    reason = fam.invalid_reason(config, sig, m, profile)
    if reason:
        return _skip(res, key, cid, f"{where}, which is invalid here: {reason}")
    return config


def _skip(res: database.LoadResult, key: Signature, cid: str, message: str) -> None:
    tiers.warn_once(str(res.path), f"config:{key}:{cid}",
                    f"tunedb: skipping {message}; the next tier answers")
    return None


def _compiled_set(fam: Any, arch_family: str, files: tuple[database.LoadResult, ...]) -> dict[str, Config]:
    got = _compiled.get(fam.name)
    if got is None:
        referenced = sorted({cid for res in files for cid in res.db.referenced_config_ids()})
        got = {c.id: c for c in fam.compile_set(arch_family, referenced)}
        _compiled[fam.name] = got
    return got


def _ranker_for(fam: Any, profile: ArchProfile) -> Ranker | None:
    """An installed ranker wins; else the family's cost model's pick (its `cost_model(profile,
    params)` hook, built once per epoch from the parameters the arch's database file ships).
    None: the family has no cost model, and the default answers."""
    ranker = _rankers.get(fam.name)
    if ranker is not None:
        return ranker
    if fam.name not in _family_rankers:
        model = family_model(fam, profile)
        _family_rankers[fam.name] = (functools.partial(serving.model_pick, model, family=fam.name)
                                     if model is not None else None)
    return _family_rankers[fam.name]


def family_model(fam: Any, profile: ArchProfile) -> Any:
    """The family's cost model for this epoch (its `cost_model(profile, params)` hook on the
    parameters the arch's database file ships), built once; None without one or when it cannot
    be built (the warning says why)."""
    if not has_hook(fam, "cost_model"):
        return None
    with _lock:  # (re-entrant) an epoch cleared meanwhile must not keep the last epoch's model
        if fam.name not in _family_models:
            try:
                _family_models[fam.name] = hook(fam, "cost_model")(profile, model_params(fam.name))
            except Exception as exc:  # a broken model costs its tier, not the op
                tiers.warn_once("selector", f"model:{fam.name}:{type(exc).__name__}",
                                f"tunedb: the {fam.name} cost model could not be built ({exc!r}); "
                                f"the default answers")
                _family_models[fam.name] = None
        return _family_models[fam.name]


def _rank(fam: Any, ranker: Ranker, sig: Signature, m: int, compiled: Mapping[str, Config],
          profile: ArchProfile) -> Config | None:
    candidates = serving.model_candidates(fam, sig, compiled.values(), profile, settings.approximate_allowed(), m)
    if not candidates:
        return None
    try:
        choice = ranker(sig, m, candidates)
    except Exception as exc:  # a broken ranker costs its tier, not the op
        tiers.warn_once("selector", f"ranker:{fam.name}:{type(exc).__name__}",
                        f"tunedb: the {fam.name} cost-model ranker failed ({exc!r}); "
                        f"the default answers")
        return None
    if choice is not None and choice not in candidates:
        tiers.warn_once("selector", f"ranker:{fam.name}:{getattr(choice, 'id', choice)}",
                        f"tunedb: the {fam.name} cost-model ranker chose {choice!r}, which is not one "
                        f"of its candidates; the default answers")
        return None
    return choice


def set_ranker(family: str, ranker: Ranker | None) -> None:
    """Install (None: remove) the cost-model tier's ranker for a kernel family.

    ranker(sig, m, candidates) -> one of candidates, or None to let the default answer.
    Candidates are the compiled, valid, non-sentinel configs. Starts a new epoch.
    """
    if ranker is not None and not callable(ranker):
        raise TypeError(f"ranker for {family!r} must be callable, got {ranker!r}")
    with _lock:
        if ranker is None:
            _rankers.pop(family, None)
        else:
            _rankers[family] = ranker
    reload()


def configure(arch_family: str | None = None, arch: ArchProfile | str | None = None) -> None:
    """Pin the architecture selections are made for. New epoch.

    Both None: detect it again at the next resolution (the current GPU's arch family and its
    cached or queried profile, see arch.current_profile; without a GPU, sm90's shipped one).
    arch_family alone: that family's shipped profile (none shipped: every shape takes the fallback).
    arch may also be an arch family's name ("sm90"): the same as arch_family=arch.
    """
    if isinstance(arch, str):
        if arch_family is not None and arch_family != arch:
            raise TunedbError(f"arch={arch!r} names another arch family than arch_family={arch_family!r}")
        arch_family, arch = arch, None
    elif arch is not None and not isinstance(arch, ArchProfile):
        raise TypeError(f"configure(arch=...) takes an ArchProfile or an arch family's name such as 'sm90', "
                        f"got {type(arch).__name__} {arch!r}")
    with _lock:
        _arch.clear()
        if arch is not None:
            if arch_family is not None and arch.arch_family != arch_family:
                raise TunedbError(f"arch_family={arch_family!r} but the profile is for "
                                  f"{arch.arch_family!r}")
            _arch.update(family=arch.arch_family, profile=arch)
        elif arch_family is not None:
            _arch.update(family=arch_family, profile=shipped_profile(arch_family))
    reload()


def shipped_profile(arch_family: str) -> ArchProfile | None:
    """The arch family's shipped profile, or None when none ships."""
    from tunedb import arch as arch_mod

    if arch_family not in arch_mod.SHIPPED_ARCHES:
        return None
    return arch_mod.shipped_profile(arch_family)


def current_arch_family() -> str:
    """The current CUDA device's arch family ('sm90'), or 'sm90' without a GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm{major}{minor}"
    except Exception:  # no usable torch: plan for the shipped architecture
        pass
    return "sm90"


def current_arch() -> tuple[str, ArchProfile | None]:
    """(arch family, profile) selections are made for: pinned by configure(), else detected."""
    with _lock:
        return _arch_state()


def model_params(family: str) -> Mapping[str, Any] | None:
    """The cost-model object ("model") of the first usable tier file of `family` for the
    current arch, this epoch: what a ranker reads its parameters from."""
    arch_family, _ = current_arch()
    for res in database.lookup(arch_family, family):
        if res.db.model is not None:
            seen = (family, str(res.path))
            if seen not in _model_problems:
                _model_problems[seen] = hook(families.get(family), "model_problem")(res.db.model)
            why = _model_problems[seen]
            if why is None:
                return res.db.model
            tiers.warn_once(str(res.path), "model", f"tunedb: skipping {res.path}'s cost-model object ({why}); "
                            "the next tier's calibrates the model")
    return None


def _detect() -> tuple[str, ArchProfile | None]:
    family = current_arch_family()
    try:
        import torch

        if torch.cuda.is_available():
            from tunedb import arch as arch_mod

            # cached or queried, never measured here: resolution must not run benchmarks
            return family, arch_mod.current_profile(measure=False)
    except Exception:  # no cached or shipped profile for this GPU: the shipped one, or none
        pass
    return family, shipped_profile(family)


def _arch_state() -> tuple[str, ArchProfile | None]:
    if not _arch:
        family, profile = _detect()
        _arch.update(family=family, profile=profile)
    return _arch["family"], _arch["profile"]


def _clear_epoch() -> None:
    with _lock:
        for (family, sig, _m), slot in _memo.items():
            if slot.calls:
                key = (family, sig.format(), slot.resolution.tier)
                _past_counts[key] = _past_counts.get(key, 0) + slot.calls
        _memo.clear()
        _compiled.clear()
        _family_rankers.clear()
        _family_models.clear()
        _model_problems.clear()
        serving.forget_decisions()


tiers.on_reload(_clear_epoch)


def state_key() -> str:
    """What a resolution depends on besides the tier files: the arch (family and profile), the
    installed rankers and the TUNEDB_* switches resolution reads. Part of the compile token."""
    import json

    from tunedb import settings

    arch_family, profile = current_arch()
    with _lock:
        # by identity too: two closures of one factory share a qualname but not their parameters
        rankers = sorted(f"{fam}={getattr(r, '__module__', '')}.{getattr(r, '__qualname__', type(r).__name__)}"
                         f"@{id(r):x}" for fam, r in _rankers.items())
    return json.dumps({"arch": arch_family, "profile": None if profile is None else profile.to_json(),
                       "rankers": rankers, "heuristic": settings.heuristic_enabled(),
                       "model_fallback": settings.model_fallback_enabled(),
                       "approximate": settings.approximate_allowed(), "compile_set": settings.compile_set()},
                      sort_keys=True, default=str)


def reload() -> int:
    """Start a new epoch (re-read every database file on next use); returns its number."""
    return database.reload()


def epoch() -> int:
    return database.epoch()


def counters() -> dict[str, dict[str, Any]]:
    """Per family: total calls, calls per tier, and calls per tier for each signature."""
    with _lock:
        counts = dict(_past_counts)
        for (family, sig, _m), slot in _memo.items():
            if slot.calls:
                key = (family, sig.format(), slot.resolution.tier)
                counts[key] = counts.get(key, 0) + slot.calls
    out: dict[str, dict[str, Any]] = {}
    for (family, sig, tier), n in sorted(counts.items()):
        fam = out.setdefault(family, {"calls": 0, "tiers": dict.fromkeys(TIER_NAMES, 0),
                                      "signatures": {}})
        fam["calls"] += n
        fam["tiers"][tier] += n
        per_sig = fam["signatures"].setdefault(sig, dict.fromkeys(TIER_NAMES, 0))
        per_sig[tier] += n
    return out


def reset_counters() -> None:
    with _lock:
        _past_counts.clear()
        for slot in _memo.values():
            slot.calls = 0


def report_lines() -> list[str]:
    """One line per family: `gemm: 96 calls over 5 signatures: 96 user, 0 system, ...`."""
    lines = []
    for family, data in sorted(counters().items()):
        tiers_text = ", ".join(f"{data['tiers'][t]} {REPORT_NAMES[t]}" for t in TIER_NAMES)
        n_sigs = len(data["signatures"])
        lines.append(f"{family}: {data['calls']} call{'s' * (data['calls'] != 1)} over {n_sigs} "
                     f"signature{'s' * (n_sigs != 1)}: {tiers_text}")
    return lines


def tuning_report() -> str:
    """report_lines() as text, one line per family (what tunedb.tuning_report() returns)."""
    lines = report_lines()
    return "\n".join(lines) if lines else "no tuned op has been called in this process"
