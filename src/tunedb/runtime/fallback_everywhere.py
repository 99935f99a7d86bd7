"""Whether the selector would serve a signature with its family's fallback arm at EVERY size.

optimize() asks this of each module it could swap: where the answer is yes (GEMM: torch serves
the Linear at every M), swapping would only put tunedb's entry path (type checks, key, launch
table, counter) in front of the very call the module makes by itself -- in eager decode that
host time is the whole loss (Llama-3-8B, 2 layers, H200 session 11: 0.97x of plain at batch 1
with the system tier serving torch for 9 of 10 keys). So such a module is left as written.

left_reason() answers in two grades. MEASURED: the entries of the tiers present now (user,
system) name the fallback at every size. GUESSED: every size is the fallback's, but some sizes
only because no entry covers them and the guessing tiers decline there: the model tier (or, with
it off, the family default) answers the fallback at every probe size of those pieces (PROBES: 1..16
and the powers of 2 and 3 x 2^k up to 65536). A model nobody measured is of the second kind: on
sm90 the GEMM model tier declines every shape of every held-out model (bench/lomo_regret.py), and
swapping its Linears cost 1.05-1.14x plain eagerly (session 31, eight such models on the H200)
for the same cuBLAS calls. A guess the probes miss (the model tier serving at an M between two
probes) leaves that size to torch, the safe side. Any region naming another config, the
family default serving a non-fallback config, an installed ranker (set_ranker: never
second-guessed) or a model-tier answer other than the fallback at a probe answers None (swap).
`tunedb.autotune()` (a context with no model to hook) tunes the calls that reach tunedb, and
the GUESSED modules of the models optimize() registered through forward hooks while it is active
(report.measuring_guessed); after publishing it re-runs optimize() on the models whose modules
ran (runtime/patching.swap_left), as prewarm does for its model.
A tier written later in the process (tunedb tune, autotune's user tier) is not seen by modules
already left: re-run optimize() after it (it swaps what a tier now serves and keeps what it
swapped before). Pure of torch; no concrete family named (families come through their hooks).
"""
from __future__ import annotations

from typing import Any

from tunedb import database, families, settings
from tunedb.families.contract import hook
from tunedb.records import Signature
from tunedb.runtime import selector, serving, untuned


MEASURED = "measured"
GUESSED = "guessed"
# sizes probed in a piece no entry covers: every M to 16 (the decode lane's range), then each
# power of 2 and 3 x 2^k up to 65536
PROBES: tuple[int, ...] = tuple(sorted({*range(1, 17), *(2 ** k for k in range(5, 17)),
                                        *(3 * 2 ** k for k in range(3, 15))}))


def fallback_everywhere(family: str, sig: Signature) -> bool:
    """True when `sig` resolves to the family's fallback at every size from MEASURED entries:
    an entry covers every size and every region that may serve it names the fallback."""
    return left_reason(family, sig) == MEASURED


def left_reason(family: str, sig: Signature) -> str | None:
    """MEASURED, GUESSED or None (see the module docstring)."""
    fam = families.get(family)
    fallback = hook(fam, "pick_rule")().fallback
    if fallback not in fam.sentinels(sig, settings.approximate_allowed()):
        return None
    arch_family, profile = selector.current_arch()
    if profile is None or not settings.heuristic_enabled():
        return None  # the family default serves every shape
    files = database.lookup(arch_family, fam.name)
    sources = [(res, res.db.entries) for res in files]
    # Entry.lookup(m) is constant on each piece (lo, hi] between consecutive region bounds
    bounds = {1}
    for key in serving.serving_keys(fam, sig):
        for _res, entries in sources:
            entry = entries.get(key)
            if entry is not None:
                bounds.update(r.m_hi for r in entry.regions if r.m_hi is not None)
    tops = sorted(bounds)
    pieces = list(zip([0, *tops], tops)) + [(tops[-1], None)]  # the last: every size above
    guessed = False
    for lo, hi in pieces:
        # a region's config serves only near the sizes it was measured at (serving.unsupported),
        # so within one piece the walk's answer moves with m: asked at the piece's ends and probes
        unmeasured = []
        for m in _sizes(lo, hi):
            first = next(iter(serving.walk(fam, sig, m, sources)), None)
            if first is None:
                unmeasured.append(m)
            elif first[2] != fallback:
                return None  # a measured config serves here: swap
        if unmeasured:
            if not _guesses_fallback(fam, sig, unmeasured, fallback, profile, arch_family, files):
                return None  # unmeasured here, and a guessing tier may serve a config: swap
            guessed = True
    return GUESSED if guessed else MEASURED


def _sizes(lo: int, hi: int | None) -> list[int]:
    """The sizes asked of the piece (lo, hi]: its ends and the probes inside."""
    return sorted({lo + 1, *(m for m in PROBES if m > lo and (hi is None or m <= hi)),
                   *((hi,) if hi is not None else ())})


def _guesses_fallback(fam: Any, sig: Signature, sizes: list[int], fallback: str,
                      profile: Any, arch_family: str, files: Any) -> bool:
    """Whether what serves these unmeasured sizes -- the model tier, else the family default --
    answers the fallback at each."""
    if selector._rankers.get(fam.name) is not None:
        return False  # a ranker someone installed is never second-guessed
    model = selector.family_model(fam, profile) if settings.model_fallback_enabled() else None
    candidates: tuple = ()
    if model is not None:
        with selector._lock:  # as the selector builds it (an epoch may be clearing it)
            compiled = selector._compiled_set(fam, arch_family, files)
        candidates = serving.model_candidates(fam, sig, compiled.values(), profile, settings.approximate_allowed())
    for m in sizes:
        if candidates:
            try:
                pick = serving.model_pick(model, sig, m, candidates)  # no family: not noted for the report
            except Exception:  # a model that cannot answer: swap, as the selector would ask it
                return False
            if pick is not None:
                if pick.id != fallback:
                    return False
                continue
        if untuned.answer(fam, sig, profile, m).id != fallback:
            return False
    return True
