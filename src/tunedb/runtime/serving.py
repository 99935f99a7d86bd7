"""How a database serves a call, written once for the selector and the oracle: the serving-key
walk (a family's keys for a signature, in runs of one op) and the model tier's candidate set.

Pure: no torch, no GPU, no concrete family (a family comes in through its contract hooks).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from tunedb.families.contract import hook
from tunedb.records import ArchProfile, Config, Entry, Signature


def serving_keys(fam: Any, sig: Signature) -> tuple[Signature, ...]:
    """Database keys that may serve `sig`, most specific first (the family's serving_keys hook)."""
    return tuple(hook(fam, "serving_keys")(sig))


def by_op(keys: Iterable[Signature]) -> list[tuple[Signature, ...]]:
    """The serving keys in runs of one op, in the family's order (most specific first). Every tier
    is asked the keys of the call's own op before any key of another op (gemm_act falling back to
    the plain op's entry, which never measured the epilogue): an exact entry in a lower tier beats
    a fallback entry in a higher one."""
    groups: list[list[Signature]] = []
    for key in keys:
        if groups and groups[-1][0].op == key.op:
            groups[-1].append(key)
        else:
            groups.append([key])
    return [tuple(g) for g in groups]


def walk(fam: Any, sig: Signature, m: int, sources: Iterable[tuple[Any, Mapping[Signature, Entry]]],
         native: bool = False) -> Iterable[tuple[Any, Signature, str]]:
    """(source, key, config id) in serving order for `sig` at size m over `sources` ((tag,
    entries) pairs, the highest tier first): each op run of keys is asked of every source."""
    sources = list(sources)
    for group in by_op(serving_keys(fam, sig)):
        for tag, entries in sources:
            for key in group:
                entry = entries.get(key)
                cid = entry.lookup(m, native) if entry is not None else None
                if cid is not None:
                    yield tag, key, cid


def model_candidates(fam: Any, sig: Signature, compiled: Iterable[Config], profile: ArchProfile,
                     approximate: bool = False) -> tuple[Config, ...]:
    """What the model tier chooses among: the compiled, valid, non-sentinel configs (sorted by
    id), plus the pick rule's fallback when it applies to `sig` -- the framework's op is a
    candidate too: where no compiled config is predicted to beat it, the model tier answers the
    fallback (held out of calibration on the H200 log: 16% geomean regret over tiles alone, 3%
    with torch; bench/costmodel_heldout.py). Empty when no compiled config is valid."""
    configs = tuple(sorted((c for c in compiled if not c.is_sentinel
                            and fam.invalid_reason(c, sig, None, profile) is None), key=lambda c: c.id))
    if not configs:
        return ()
    fallback = hook(fam, "pick_rule")().fallback
    if fallback in fam.sentinels(sig, approximate):
        configs += (Config.sentinel(fallback),)
    return configs


# (family, signature, m) -> the model tier's Decision this epoch (what the report explains)
_decisions: dict[tuple[str, Signature, int], Any] = {}


def model_pick(model: Any, sig: Signature, m: int, candidates: tuple[Config, ...],
               family: str | None = None) -> Config | None:
    """The model tier's pick through the family model's serving rule: its decide() when it has
    one (the GEMM confidence rule: a config serves only beyond its regime's error band), noted
    for the report under `family`; else its pick()."""
    decide = getattr(model, "decide", None)
    if decide is None:
        return model.pick(sig, m, candidates)
    decision = decide(sig, m, candidates)
    if decision is None:
        return None
    if family is not None:
        _decisions[(family, sig, m)] = decision
    return decision.config


def decision(family: str, sig: Signature, m: int) -> Any:
    """The model tier's noted Decision at (sig, m) this epoch, or None."""
    return _decisions.get((family, sig, m))


def decisions(family: str | None = None) -> dict[tuple[str, Signature, int], Any]:
    return {key: d for key, d in _decisions.items() if family is None or key[0] == family}


def forget_decisions() -> None:
    _decisions.clear()


def confidence_line(family: str) -> str | None:
    """`gemm model tier: 3 shape(s) served a config, 5 declined (predicted gain inside the error
    band)`; None when the model tier decided nothing this epoch."""
    mine = decisions(family)
    if not mine:
        return None
    served = sum(1 for d in mine.values() if getattr(d, "best", None) is not None and d.config is d.best)
    declined = sum(1 for d in mine.values() if getattr(d, "declined", False))
    return (f"{family} model tier: {len(mine)} unmeasured shape(s), {served} served a predicted-faster "
            f"config, {declined} declined (predicted gain not beyond the model's error band, or the shape far from every "
            f"measured one: the fallback serves)")
