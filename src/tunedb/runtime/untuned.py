"""What serves a shape no tier measured and no model tier picked: the family's heuristic, else
the pick rule's fallback, else the family default. One definition for the selector's default
tier and the oracle's replay of it (evaluate/oracle.py), so regret is computed on what is served.

The family default is what TUNEDB_HEURISTIC=0 gets; for GEMM it is an untuned Triton tile, which
once served shapes no census named. A heuristic is a guess, like the model tier:
TUNEDB_MODEL_FALLBACK=0 turns both off, so only measured entries and the fallback serve.
Pure: no torch, no GPU, no concrete family (a family comes in through its contract hooks).
"""
from __future__ import annotations

from typing import Any

from tunedb import settings
from tunedb.families.contract import hook
from tunedb.records import ArchProfile, Config, Signature


def answer(fam: Any, sig: Signature, profile: ArchProfile | None, m: int | None = None,
           concrete: bool = False) -> Config:
    """The config for `sig` at size m: the heuristic when it has one (asked at m where the family
    says HEURISTIC_PER_SIZE, or with `concrete`: the arm a per-call sentinel such as scaled_mm's
    `heuristic` runs at m, which the oracle needs), else the pick rule's fallback (the vendor op:
    what a config must beat to be served, so never slower than it), else the family default."""
    if profile is None or not settings.heuristic_enabled():
        return fam.default_config(sig, profile)
    if settings.model_fallback_enabled():
        try:
            config = hook(fam, "heuristic")(sig, m if concrete else heuristic_size(fam, m), profile)
        except Exception:  # a broken heuristic costs itself: the fallback answers
            config = None
        # judged at the call's size (None: every size): a heuristic asked once per signature
        # may name a config that cannot launch at this one (linalg's block lane past CUDA's grid)
        if config is not None and fam.invalid_reason(config, sig, m, profile) is None:
            return config
    found = fallback(fam, sig, profile)
    return found if found is not None else fam.default_config(sig, profile)


def unprofiled(fam: Any, sig: Signature) -> Config:
    """A GPU with no profile (an arch with no shipped one, before `python -m tunedb.arch
    --measure`): nothing measured or modelled can serve, and the family default is a Triton tile
    nobody timed on it (GEMM: b64x64x64 on every Linear of a new user's A100, where cuBLAS ran
    before optimize()). The pick rule's fallback serves where it applies; TUNEDB_HEURISTIC=0
    still asks for the default by name."""
    if settings.heuristic_enabled():
        cid = hook(fam, "pick_rule")().fallback
        if cid in fam.sentinels(sig, settings.approximate_allowed()):
            return Config.sentinel(cid)
    return answer(fam, sig, None)


def heuristic_size(fam: Any, m: int | None) -> int | None:
    """The size a family's heuristic is asked at: the call's, for a family whose heuristic says
    it answers per size (`HEURISTIC_PER_SIZE`), else None (one answer per signature, which the
    family's op resolves per call, as scaled_mm's sentinel)."""
    return m if getattr(fam, "HEURISTIC_PER_SIZE", False) else None


def fallback(fam: Any, sig: Signature, profile: ArchProfile) -> Config | None:
    """The pick rule's fallback for `sig` as a config ('default' resolved), or None when it does
    not apply or is invalid here."""
    cid = hook(fam, "pick_rule")().fallback
    if cid not in fam.sentinels(sig, settings.approximate_allowed()):
        return None
    config = fam.default_config(sig, profile) if cid == "default" else Config.sentinel(cid)
    return config if fam.invalid_reason(config, sig, None, profile) is None else None
