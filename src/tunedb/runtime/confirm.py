"""confirm(): each Triton pick a model serves, timed inside the model's captured forward against
torch; a pick that is slower there is overridden to torch in the user tier, at the M it served.

    tunedb.optimize(model)
    tunedb.prewarm(model, (x,))
    tunedb.confirm(model, (x,))        # then capture CUDA graphs

Why: a build times each config alone, in CUDA graphs of repeated calls, and a kernel can run
differently between a model's other kernels. On the H200 (session 6), Conformer b8's tuned
tier served tma_b128x256x64_w8_s3_g8 for N=2048 K=512 +SiLU at M=5992: 35.2 us alone against
37.5 us for F.linear + SiLU, but 46.5 us per call inside the model, where F.linear + SiLU took
35.4 us, and the tuned forward was 1.2% slower than plain PyTorch.

How: the forward is captured once as served and once per pick (a signature and the entry that
answers it) with that signature pinned to torch at the pick's Ms (a launch-table override), and
the two graphs are replayed in shuffled paired rounds; the pick is demoted when the per-round
time ratios (served / torch) have a median beyond 1 + tol and all but one exceed 1. Only picks
of the user and system tiers are judged (they have an entry to edit); the cost model's and the
default's are reported as unjudged. A demotion is a user-tier entry keyed by the call's own
signature (the shipped file is never edited, nor an entry that answers other signatures too):
the regions the user tier had for it, above them the answering entry's, and torch at exactly
the demoted Ms; then a new epoch starts. One case is not exact: Ms that another user-tier key
(a dt=half entry) answered, above the copied regions, are answered by the copy afterwards.
"""
from __future__ import annotations

import math
import numbers
import random
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from tunedb.records import Entry, Point, Region, ShapeSet, Signature
from tunedb.runtime.nogpu import warn_no_gpu

TOL = 0.003  # the graph rows' A/A noise floor on the H200 was 0.1-0.3%
JUDGED_TIERS = ("user", "system")
DEMOTED_TO = "torch"  # what plain PyTorch runs: F.linear (+ the activation)

# measurer(signature, Ms) -> (served ms per forward, torch ms per forward, per-round ratios), with
# the signature pinned to torch at those Ms only
Measurer = Callable[[Signature, "tuple[int, ...]"], "tuple[float, float, list[float]]"]


@dataclass(frozen=True)
class Verdict:
    """One signature's pick judged in the model (times per forward, ms; ratio served / torch)."""

    signature: Signature
    ms: tuple[int, ...]  # the M values the model called it at
    config_id: str
    tier: str
    served_ms: float | None = None
    torch_ms: float | None = None
    ratio: float | None = None
    demoted: bool = False
    why: str = ""  # why it was not judged

    def line(self) -> str:
        where = f"{self.signature} M={','.join(map(str, self.ms))}: {self.config_id} ({self.tier})"
        if self.ratio is None:
            return f"{where}: not judged ({self.why})"
        verdict = f"demoted to {DEMOTED_TO}" if self.demoted else f"kept ({self.why})" if self.why else "kept"
        return (f"{where}: {self.served_ms:.4f} ms vs {self.torch_ms:.4f} ms with {DEMOTED_TO} "
                f"({self.ratio:.4f}x), {verdict}")


@dataclass(frozen=True)
class ConfirmResult:
    verdicts: tuple[Verdict, ...]
    elapsed_s: float

    @property
    def demoted(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.demoted)

    def summary(self) -> str:
        judged = sum(v.ratio is not None for v in self.verdicts)
        return (f"confirm: {len(self.verdicts)} Triton-served signature(s), {judged} judged in the model, "
                f"{len(self.demoted)} demoted to {DEMOTED_TO} in {self.elapsed_s:.1f}s")


def demote_regions(regions: tuple[Region, ...], ms: tuple[int, ...],
                   lane: str = DEMOTED_TO) -> tuple[Region, ...]:
    """`regions` with `lane` served at exactly each M of `ms` that they serve, every other M
    unchanged (adjacent regions of one config merged)."""
    out = list(regions)
    for m in sorted(set(ms)):
        served = next((i for i, r in enumerate(out) if r.m_hi is None or r.m_hi >= m), None)
        if served is None:  # past every bounded region: another tier answers there
            continue
        r = out[served]
        lower = out[served - 1].m_hi + 1 if served > 0 else 1  # the first M the region serves
        pieces = [Region(m - 1, r.config_id)] if lower < m else []  # (m_hi >= 1: M=0 is no GEMM)
        pieces.append(Region(m, lane))
        if r.m_hi is None or r.m_hi > m:
            pieces.append(r)
        out[served:served + 1] = pieces
    merged: list[Region] = []
    for r in out:
        if merged and merged[-1].config_id == r.config_id:
            merged[-1] = r  # the later bound covers both
        else:
            merged.append(r)
    return tuple(merged)


Group = tuple  # (signature, tier, entry signature, config id): one pick, judged once


def _picks(points: Any) -> dict[Group, list[int]]:
    """{(signature, tier, answering entry's key, config id): [M, ...]} of the points a Triton
    config serves now (one signature can be answered by different entries at different Ms)."""
    from tunedb import families
    from tunedb.runtime import selector

    out: dict[Group, list[int]] = {}
    for p in points:
        res = selector.peek(p.signature.family, p.signature, p.m)
        # a framework arm (a sentinel, or a lane the family names with the sentinels) is what
        # confirm demotes to, never what it judges
        if res.config.is_sentinel or getattr(res.config, "lane", None) in families.get(p.signature.family).sentinels(p.signature, True):
            continue
        out.setdefault((p.signature, res.tier, res.entry_signature, res.config.id), []).append(p.m)
    return out


def slower(ratios: list[float], tol: float) -> bool:
    """Served clearly slower than torch: the median ratio beyond 1 + tol, and every round but
    at most one slower (a sign test, so one noisy round cannot demote a pick alone)."""
    return statistics.median(ratios) > 1 + tol and sum(r > 1 for r in ratios) >= len(ratios) - 1


def graph_measurer(model: Any, inputs: Any, rounds: int = 7, block_ms: float = 10.0,
                   seed: int = 0) -> Measurer:
    """The default measurer: model(*inputs) captured as served and with one signature pinned to
    torch, replayed in `rounds` shuffled paired rounds of about block_ms each."""
    import torch

    from tunedb import families
    from tunedb.measure.cudagraph import capture as capture_graph
    from tunedb.measure.gpuenv import wait_reaped
    from tunedb.runtime import launch_table
    from tunedb.runtime.prewarm import forward_of

    forward = forward_of(model, inputs)
    wait_reaped()  # a build's worker still exiting (its CUDA teardown) would disturb the rounds

    def capture() -> Any:
        with torch.no_grad():
            return capture_graph(forward, warmup=2)

    def block(graph: Any, n: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n

    served = capture()
    block(served, 3)
    once = min(block(served, 1) for _ in range(3))
    replays = max(3, min(200, math.ceil(block_ms / max(once, 1e-3))))
    rng = random.Random(seed)

    def measure(sig: Signature, ms: tuple[int, ...]) -> tuple[float, float, list[float]]:
        lane = families.get(sig.family).parse_config(DEMOTED_TO)
        with launch_table.overriding(lambda fam, s, m: (lane, "confirm") if s == sig and m in ms else None):
            pinned = capture()
        graphs, times = {"served": served, "torch": pinned}, {"served": [], "torch": []}
        block(pinned, 3)  # its first replays upload the graph
        order = list(graphs)
        for _ in range(rounds):
            rng.shuffle(order)
            for key in order:
                times[key].append(block(graphs[key], replays))
        del pinned, graphs
        ratios = [s / t for s, t in zip(times["served"], times["torch"])]
        return statistics.median(times["served"]), statistics.median(times["torch"]), ratios

    return measure


def confirm(model: Any, inputs: Any = None, *, tol: float = TOL, measurer: Measurer | None = None,
            publish: bool = True, **measure_kw: Any) -> ConfirmResult:
    """Judge every Triton pick `model` serves on `inputs` (example inputs, or a census ShapeSet
    / Points with an injected `measurer`) inside its captured forward; picks slower than torch by
    more than `tol` are written to the user tier as torch at their M (publish=False: judged
    only). Extra keywords (rounds=, block_ms=, seed=) go to graph_measurer."""
    from tunedb.runtime.prewarm import points_of

    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not 0 <= tol < 1:
        raise ValueError(f"tol={tol!r} must be a number in [0, 1)")
    if not isinstance(publish, bool):  # publish="no" is truthy: it wrote the user tier
        raise TypeError(f"confirm publish={publish!r} must be True or False")
    _check_measure_kw(measure_kw, measurer)
    shapes_only = model is None or isinstance(inputs, ShapeSet) or (
        isinstance(inputs, (list, tuple)) and inputs and all(isinstance(p, Point) for p in inputs))
    if measurer is None and not shapes_only and warn_no_gpu(
            "confirm", "no pick was judged and the user tier is unchanged"):
        return ConfirmResult((), 0.0)
    start = time.monotonic()
    points = points_of(model, inputs, "confirm")
    picks = _picks(points)
    if publish:  # before any timing: a demotion that cannot be written failed only at the end
        _check_user_tier({g[0].family for g in picks if g[1] in JUDGED_TIERS and g[2] is not None})
    if measurer is None and picks:
        if shapes_only:
            raise TypeError("confirm times the model itself: pass the model and example inputs "
                            "(a census or Points only says which shapes to judge), or measurer=")
        measurer = graph_measurer(model, inputs, **measure_kw)
    verdicts: list[Verdict] = []
    demoted: dict[Signature, list[tuple[Group, tuple[int, ...], str]]] = {}
    for group, ms in sorted(picks.items(), key=lambda kv: (kv[0][0].format(), min(kv[1]))):
        sig, tier, key, cid = group
        ms_t = tuple(sorted(set(ms)))
        if tier not in JUDGED_TIERS or key is None:
            verdicts.append(Verdict(sig, ms_t, cid, tier,
                                    why=f"a {tier}-tier pick has no entry to edit; measure it first (prewarm)"))
            continue
        try:
            served_ms, torch_ms, ratios = measurer(sig, ms_t)
        except Exception as exc:  # noqa: BLE001 - one signature's failure is its verdict
            verdicts.append(Verdict(sig, ms_t, cid, tier, why=f"timing failed: {type(exc).__name__}: {exc}"))
            continue
        verdicts.append(Verdict(sig, ms_t, cid, tier, served_ms, torch_ms, statistics.median(ratios),
                                slower(ratios, tol)))
        if verdicts[-1].demoted:
            note = (f"M={','.join(map(str, ms_t))}: {cid} -> {DEMOTED_TO} (confirm: {served_ms:.4f} vs "
                    f"{torch_ms:.4f} ms per forward in the model)")
            demoted.setdefault(sig, []).append((group, ms_t, note))
    if demoted and publish:
        verdicts = _publish(demoted, verdicts)
    return ConfirmResult(tuple(verdicts), time.monotonic() - start)


_MEASURE_KW = ("rounds", "block_ms", "seed")


def _check_measure_kw(kw: dict[str, Any], measurer: Measurer | None) -> None:
    """TypeError / ValueError naming a keyword graph_measurer does not take or a bad value (rounds=0
    ended in statistics' 'no median for empty data'; a misspelt keyword was dropped silently)."""
    unknown = sorted(set(kw) - set(_MEASURE_KW))
    if unknown:
        raise TypeError(f"confirm() got unexpected keyword(s) {', '.join(unknown)}; it takes tol=, measurer=, "
                        f"publish= and the default measurer's {', '.join(k + '=' for k in _MEASURE_KW)}")
    if kw and measurer is not None:
        raise TypeError(f"confirm's {', '.join(k + '=' for k in kw)} set the default measurer; a measurer= "
                        f"given times on its own terms (pass one or the other)")
    rounds, seed = kw.get("rounds", 3), kw.get("seed", 0)
    # fewer than three rounds and the sign test lets one noisy round demote a pick
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral) or rounds < 3:
        raise ValueError(f"confirm rounds={rounds!r} must be an int of at least 3 (the sign test needs them)")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
        raise ValueError(f"confirm seed={seed!r} must be an int or None")
    v = kw.get("block_ms", 1.0)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < math.inf:
        raise ValueError(f"confirm block_ms={v!r} must be a positive finite number of milliseconds")


def _check_user_tier(families: set[str]) -> None:
    """DatabaseError naming the user tier when a demotion could not be written there (the tier is
    off, or its file's place cannot take a new file), before anything is timed."""
    if not families:
        return
    from tunedb.database import tiers
    from tunedb.database.target import unwritable
    from tunedb.errors import DatabaseError
    from tunedb.runtime import selector

    arch = selector.current_arch()[0]
    for family in sorted(families):
        path = tiers.file_path("user", arch, family)
        why = "the user tier is off (TUNEDB_USER_DB=off)" if path is None else unwritable(path)
        if why is not None:
            raise DatabaseError(f"confirm writes its demotions to the user tier, but {why}; set TUNEDB_USER_DB "
                                f"to a writable directory, or pass publish=False to judge only")


def _publish(demoted: dict[Signature, list[tuple[Group, tuple[int, ...], str]]],
             verdicts: list[Verdict]) -> list[Verdict]:
    """Write each demoted signature's user-tier entry, keyed by the call's own signature (an
    entry answering other signatures too, e.g. dt=half or the plain GEMM's for a gemm_act call,
    is copied, not edited): the regions the user tier has for it, then, above them, those of the
    entry that answered, with torch at the demoted Ms. A signature whose demoted picks came from
    two entries other than its own user-tier one takes the first; the others are reported (a
    second confirm judges them against the new entry). New epoch."""
    from tunedb import database
    from tunedb.runtime import selector
    arch = selector.current_arch()[0]
    by_family: dict[str, tuple[list[Entry], dict[str, Any]]] = {}
    skipped: set[tuple[Signature, tuple[int, ...]]] = set()
    for sig, rows in demoted.items():
        own = _user_entry(arch, sig)
        regions, evidence, configs = (own.regions, dict(own.evidence), {}) if own else ((), {}, {})
        answered = list(dict.fromkeys((g[1], g[2]) for g, _m, _n in rows if (g[1], g[2]) != ("user", sig)))
        # the file's own entry may have grown a catch-all since this epoch read it: it then
        # answers every M, and no other entry's regions can go above it
        base_key = answered[0] if answered and not any(r.m_hi is None for r in regions) else None
        if base_key is not None:
            base, configs = _entry(arch, sig.family, *base_key)
            below = max((r.m_hi for r in regions), default=0)
            regions = regions + tuple(r for r in base.regions if r.m_hi is None or r.m_hi > below)
            evidence = {**base.evidence, **evidence}
        taken = [(ms, note) for g, ms, note in rows if (g[1], g[2]) in (("user", sig), base_key)]
        skipped |= {(sig, ms) for g, ms, _n in rows if (g[1], g[2]) not in (("user", sig), base_key)}
        ms_all = tuple(m for ms, _ in taken for m in ms)
        notes = (own.notes if own else ()) + tuple(note for _, note in taken)
        entry = Entry(sig, demote_regions(regions, ms_all), evidence, "confirm", {}, notes)
        entries, named = by_family.setdefault(sig.family, ([], {}))
        entries.append(entry)
        named.update((cid, configs[cid]) for cid in entry.config_ids() if cid in configs)
    for family, (entries, named) in by_family.items():
        database.write_entries("user", family, arch, entries, named)
    selector.reload()
    return [replace(v, demoted=False, why="slower, but another entry answers this signature at other Ms: "
                    "not written; run confirm again") if (v.signature, v.ms) in skipped else v
            for v in verdicts]


def _user_entry(arch: str, sig: Signature) -> Entry | None:
    """The user tier's entry for `sig` as the file holds it now (not this epoch's copy)."""
    from tunedb import database

    path = database.file_path("user", arch, sig.family)
    if path is None or not path.exists():
        return None
    return database.load(path, sig.family, arch).entries.get(sig)


def _entry(arch: str, family: str, tier: str, key: Signature) -> tuple[Entry, dict[str, Any]]:
    """The entry that answered, and its file's configs (a copy into the user tier needs them)."""
    from tunedb import database

    for res in database.lookup(arch, family):
        if res.tier == tier and key in res.db.entries:
            return res.db.entries[key], dict(res.db.configs)
    raise LookupError(f"the {tier}-tier entry {key} that served the pick is gone (reloaded meanwhile?)")
