"""Whether the selector would serve a signature with its family's fallback arm at EVERY size.

optimize() asks this of each module it could swap: where the answer is yes (GEMM: torch serves
the Linear at every M), swapping would only put tunedb's entry path (type checks, key, launch
table, counter) in front of the very call the module makes by itself -- in eager decode that
host time is the whole loss (Llama-3-8B, 2 layers, H200 session 11: 0.97x of plain at batch 1
with the system tier serving torch for 9 of 10 keys). So such a module is left as written.

The answer is judged from the MEASURED entries of the tiers present now (user, system),
conservatively: any region naming another config, any size no entry covers, or the family
default serving (guesses off) answers "no" (swap). A size no entry covers is left to the model
tier, and `tunedb.autotune()` (a context with no model to hook) tunes only the calls that reach
tunedb: leaving such a Linear would make `optimize(); with autotune(): model(x)` measure nothing
on a model no table covers.
A tier written later in the process (tunedb tune, autotune's user tier) is not seen by modules
already left: re-run optimize() after it (it swaps what a tier now serves and keeps what it
swapped before). Pure of torch; no concrete family named (families come through their hooks).
"""
from __future__ import annotations

from tunedb import database, families, settings
from tunedb.families.contract import hook
from tunedb.records import Signature
from tunedb.runtime import selector, serving


def fallback_everywhere(family: str, sig: Signature) -> bool:
    """True when `sig` resolves to the family's fallback (pick_rule().fallback) at every size:
    an entry covers every size and every region that may serve it names the fallback."""
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
    for m in sizes:
        first = next(iter(serving.walk(fam, sig, m, sources)), None)
        if first is None or first[2] != fallback:
            return False  # unmeasured here (model tier, autotune) or a measured config: swap
    return True

