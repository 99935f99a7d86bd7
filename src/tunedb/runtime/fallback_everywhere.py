"""Whether the selector would serve a signature with its family's fallback arm at EVERY size.

optimize() asks this of each module it could swap: where the answer is yes (GEMM: torch serves
the Linear at every M), swapping would only put tunedb's entry path (type checks, key, launch
table, counter) in front of the very call the module makes by itself -- in eager decode that
host time is the whole loss (Llama-3-8B, 2 layers, H200 session 11: 0.97x of plain at batch 1
with the system tier serving torch for 9 of 10 keys). So such a module is left as written.

The answer is judged from the tiers present now (user, system), the model tier's own rule and
the switches, conservatively: any region naming another config, an installed ranker, a model that
cannot say it declines every size, or a default that is not the fallback answers "no" (swap).
A tier written later in the process (tunedb tune, autotune's user tier) is not seen by modules
already left: re-run optimize() after it (it swaps what a tier now serves and keeps what it
swapped before). Pure of torch; no concrete family named (families come through their hooks).
"""
from __future__ import annotations

from typing import Any

from tunedb import database, families, settings
from tunedb.families.contract import has_hook, hook
from tunedb.records import Signature
from tunedb.runtime import selector, serving


def fallback_everywhere(family: str, sig: Signature) -> bool:
    """True when `sig` resolves to the family's fallback (pick_rule().fallback) at every size:
    every region of every entry that may serve it names the fallback, and the sizes no entry
    covers go to a model tier (or default) that answers the fallback at every size."""
    fam = families.get(family)
    fallback = hook(fam, "pick_rule")().fallback
    if fallback not in fam.sentinels(sig, settings.approximate_allowed()):
        return False
    arch_family, profile = selector.current_arch()
    if profile is None or not settings.heuristic_enabled():
        return False  # the family default serves every shape
    files = database.lookup(arch_family, fam.name)
    sources = [(res, res.db.entries) for res in files]
    # Entry.lookup(m) is constant between consecutive region bounds: one size per piece decides
    bounds = {1}
    for key in serving.serving_keys(fam, sig):
        for _res, entries in sources:
            entry = entries.get(key)
            if entry is not None:
                bounds.update(r.m_hi for r in entry.regions if r.m_hi is not None)
    sizes = sorted(bounds) + [max(bounds) + 1]  # the last: every size above the last bound
    unmeasured: bool | None = None
    for m in sizes:
        first = next(iter(serving.walk(fam, sig, m, sources)), None)
        if first is not None:
            if first[2] != fallback:
                return False  # a measured config (even one the selector might skip): swap
            continue
        if unmeasured is None:
            unmeasured = _unmeasured_fallback(fam, sig, fallback, arch_family, profile, files)
        if not unmeasured:
            return False
    return True


def _unmeasured_fallback(fam: Any, sig: Signature, fallback: str, arch_family: str, profile: Any,
                         files: Any) -> bool:
    """Whether a size no entry covers gets the fallback: the model tier declines at every size
    (its `declines_everywhere(sig)`), or, without a model tier, the default is the fallback."""
    if settings.model_fallback_enabled():
        if selector.installed_ranker(fam.name) is not None:
            return False  # a ranker someone installed: nothing to say about its answers
        if has_hook(fam, "cost_model"):
            try:
                model = hook(fam, "cost_model")(profile, selector.model_params(fam.name))
            except Exception:  # the selector's model tier would fail too: the default answers
                model = None
            if model is not None:
                candidates = serving.model_candidates(fam, sig, selector.compiled_set(fam, arch_family, files).values(),
                                                      profile, settings.approximate_allowed())
                if candidates:
                    declines = getattr(model, "declines_everywhere", None)
                    return bool(declines is not None and declines(sig))
    return _default_id(fam, sig, profile) == fallback


def _default_id(fam: Any, sig: Signature, profile: Any) -> str:
    """The config id the selector's default tier gives `sig` (its heuristic, else the default)."""
    if settings.model_fallback_enabled():
        try:
            config = hook(fam, "heuristic")(sig, None, profile)
        except Exception:
            config = None
        if config is not None and fam.invalid_reason(config, sig, None, profile) is None:
            return config.id
    return fam.default_config(sig, profile).id
