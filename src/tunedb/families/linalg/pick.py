"""Spec 003's pick rule for one linalg cell (op, dtype, n, batch), through the contract's PickRule.

    1. Dependency-free ("native") arms: the fastest time t*; every native arm within the tie band
       (t <= t* x (1 + tie_band)) ties, and the simplest of them takes the cell: the library arm,
       then thread, then warp, then block; within a packing fewer warps, then fewer problems per
       program (configs.simplicity: a total order, so noise never decides between tied arms).
       The library arm is the fallback: it keeps any cell it ties (min_speedup 1.0: no gate
       beyond the band) and takes a cell no native arm measured.
    2. An arm that needs an optional dependency takes the cell only when the fastest native arm
       is more than dep_margin slower (t* > t_dep x (1 + dep_margin)); of the arms that clear
       it, the simplest within dep_margin of the fastest of them (spec 003: a dependency-carrying
       arm wins only where it beats the simplest by more than the margin; session 25: the CUDA
       tier's near-equal configs moved 13 of 216 served picks between two tunes under a 2% band).
    Each cell keeps both winners: `winner` (all arms) and `native` (no optional dependency).
Because a tie goes to the simpler arm, a re-run whose noise stays inside the band reproduces the
cell. Failed or unmeasured arms (None, non-finite, non-positive times) cannot win.

`decide` takes one time per arm (the medians); `decide_paired` asks the same questions of the
paired rounds (each arm's per-round ratio to the fastest, with an order-statistic interval), and
`ambiguous` says whether a cell's intervals still straddle the band edge (the tune then measures
more rounds). `decide_low` is the rule against the two noises the recorded re-measurements show
(session 15 B and D, two tunes in one call): each arm's lower quartile (bursts only ever slow a
sample down) and a tie band widened to the launch jitter between processes (noise_band); with
blocks of rounds (each a fresh capture), the median over blocks of each block's lower quartile
(block_times). `near_edge` names the arms that sit within the noise of the band's edge, where the
tune measures further blocks (session 17).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping

from tunedb.families.contract import PickRule
from tunedb.families.linalg import configs
from tunedb.measure.stats import median

TIE_BAND = 0.02
DEP_MARGIN = 0.05

LINALG_RULE = PickRule(fallback=configs.LIBRARY, min_speedup=1.0, tie_band=TIE_BAND, dep_margin=DEP_MARGIN,
                       dep_tie_band=DEP_MARGIN,
                       simplicity=configs.simplicity, dependency=configs.dependency)


@dataclass(frozen=True)
class CellPick:
    """One cell's decision: the full winner, the native winner, and why. `stat` names the
    statistic the decision compared and `times` holds it per arm (ns per problem) when it is not
    the median (the table keeps both: serving compares what the pick compared)."""

    winner: str
    native: str
    reason: str
    stat: str = "median"
    times: Mapping[str, float] = field(default_factory=dict)


def decide(times: Mapping[str, float | None], rule: PickRule = LINALG_RULE) -> CellPick:
    """The cell's pick from each arm's time (any unit, lower is better)."""
    ok = {a: float(t) for a, t in times.items() if t is not None and math.isfinite(t) and t > 0}
    native = {a: t for a, t in ok.items() if rule.is_native(a)}
    if not native:
        return CellPick(rule.fallback, rule.fallback, "no native arm measured ok: the fallback serves")
    got = rule.pick(ok)
    best = min(native.values())
    why = (f"{got.native}: {native[got.native]:.4g} vs fastest native {best:.4g} "
           f"(tie band {rule.tie_band:.0%}, simplest wins)")
    if got.winner != got.native:
        why = (f"{got.winner} ({rule.dependency(got.winner)}) beats the fastest native arm by "
               f"{best / ok[got.winner]:.3f}x > {1 + rule.dep_margin:.2f}x; native: {why}")
    return CellPick(got.winner, got.native, why)


# --- the paired-rounds variant ------------------------------------------------------------------
# The median rule above compares two point medians, so an arm sitting near the band edge lands
# on either side from one run to the next (session 9: 17 of 216 cells moved between two tunes).
# The ladder times every arm once per round in a shuffled order, so the per-round ratio of two
# arms cancels what a round shares (clocks, a neighbour's L2 traffic); its median comes with a
# distribution-free interval from order statistics. The variant asks the band question of that
# interval rather than of the point estimate.
TIE_TESTS = ("plausible", "shown")


def order_stat_index(rounds: int, coverage: float) -> int:
    """k such that [x(k), x(n-1-k)] (0-based order statistics of n rounds) covers the median
    with probability >= coverage (binomial, no distribution assumed); 0 when n is too small."""
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage={coverage} must be in (0, 1)")
    k, tail = 0, 1.0 / 2.0 ** rounds  # tail: P(at most k rounds below the median)
    while 2 * (k + 1) < rounds:
        nxt = tail + math.comb(rounds, k + 1) / 2.0 ** rounds
        if 1.0 - 2.0 * nxt < coverage:
            break
        k, tail = k + 1, nxt
    return k


def ratio_interval(arm: list[float], ref: list[float], coverage: float = 0.9) -> tuple[float, float, float]:
    """(low, median, high) of the per-round ratio arm[r] / ref[r] over the rounds both have."""
    n = min(len(arm), len(ref))
    if n == 0:
        raise ValueError("ratio_interval needs at least one round of both arms")
    ratios = sorted(a / r for a, r in zip(arm[:n], ref[:n]))
    k = order_stat_index(n, coverage)
    return ratios[k], median(ratios), ratios[n - 1 - k]


def valid_samples(samples: Mapping[str, "list[float] | tuple[float, ...] | None"]) -> dict[str, list[float]]:
    """The arms whose every round timed ok (finite, positive), as float lists."""
    return {a: [float(t) for t in s] for a, s in samples.items()
            if s and all(t is not None and math.isfinite(t) and t > 0 for t in s)}


def decide_paired(samples: Mapping[str, "list[float] | tuple[float, ...] | None"],
                  rule: PickRule = LINALG_RULE, coverage: float = 0.9, tie: str = "plausible") -> CellPick:
    """Spec 003's rule on paired rounds (samples[arm][r]: round r's time; any unit, lower is better).

    The fastest native arm f is the one of lowest median. A native arm ties with f when the
    interval of its per-round ratio to f (coverage `coverage`) says it is within the tie band:
    tie="plausible": its low end is (the simpler arm keeps the cell unless f is shown more than the
    band faster); tie="shown": its high end is (a simpler arm takes the cell only when shown
    within the band). The simplest tied arm takes the cell. A dependency arm wins only when the
    low end of the fastest native arm's ratio to it clears 1 + dep_margin (shown beyond the margin);
    of the arms that do, the simplest within dep_band() of the fastest (by median)."""
    if tie not in TIE_TESTS:
        raise ValueError(f"tie={tie!r}; allowed: {', '.join(TIE_TESTS)}")
    ok = valid_samples(samples)
    native = {a: s for a, s in ok.items() if rule.is_native(a)}
    if not native:
        return CellPick(rule.fallback, rule.fallback, "no native arm measured ok: the fallback serves")
    med = {a: median(s) for a, s in ok.items()}
    fastest = min(native, key=lambda a: (med[a], rule.simplicity(a), a))
    edge = 1.0 + rule.tie_band
    bounds = {a: ratio_interval(s, native[fastest], coverage) for a, s in native.items()}
    tied = [a for a, (lo, _, hi) in bounds.items() if (lo if tie == "plausible" else hi) <= edge]
    pick_native = min(tied, key=lambda a: (rule.simplicity(a), a != rule.fallback, a))
    lo, mid, hi = bounds[pick_native]
    why = (f"{pick_native}: {mid:.4f}x [{lo:.4f}, {hi:.4f}] of fastest native {fastest} "
           f"(paired rounds, {coverage:.0%} interval, tie band {rule.tie_band:.0%} {tie}, simplest wins)")
    deps = {a: s for a, s in ok.items() if not rule.is_native(a)}
    clear = {a: ratio_interval(native[fastest], s, coverage)[0] for a, s in ok.items() if not rule.is_native(a)}
    clear = {a: low for a, low in clear.items() if low > 1.0 + rule.dep_margin}
    if clear:  # of the tier's arms shown beyond the margin, the simplest within its band
        best_dep = rule.dep_tie_pick({a: med[a] for a in clear})
        return CellPick(best_dep, pick_native,
                        f"{best_dep} ({rule.dependency(best_dep)}) beats the fastest native arm by at least "
                        f"{clear[best_dep]:.3f}x > {1 + rule.dep_margin:.2f}x; native: {why}")
    return CellPick(pick_native, pick_native, why)


def ambiguous(samples: Mapping[str, "list[float] | tuple[float, ...] | None"], rule: PickRule = LINALG_RULE,
              coverage: float = 0.9) -> bool:
    """Whether the paired intervals leave the cell open: the pick differs depending on which end
    of an arm's interval is believed (the "plausible" and "shown" picks differ). More rounds
    narrow the intervals; a cell whose arms sit clear of the band edge is never ambiguous."""
    return (decide_paired(samples, rule, coverage, "plausible").winner
            != decide_paired(samples, rule, coverage, "shown").winner)


# --- the noise-margin variant (decide="low") ------------------------------------------------------
# What two tunes of one call (s15 B and D: separate processes, 216 cells each) say about noise:
# 1. Between processes, one kernel's time per call moves by a few tens of ns that no round of one
#    process sees (each run's paired interval is +-0.3% wide): for the contenders of a cell (arms
#    within 15% of the fastest) the run-to-run change of an arm's ratio to the fastest, times the
#    fastest arm's time per call, is p50 36 / 40 ns, p90 101 / 110 ns (D / B) where a call takes
#    under 5 us, and p95 1.8% of the time where it takes longer. At batch 256 a call is 1.3-1.5 us
#    (the graph's launch floor): 100 ns is 7%, and 13 of D's 17 disagreements are such cells
#    (each run sure of itself, the two runs on either side of the 2% band).
# 2. Within a process, stretches where every arm's samples come out 1.1-3.4x slow (a GPU-side
#    slowdown: the excess grows with the replay's length; clustered in time: a sample after a slow
#    one is slow 40% of the time, against 6.6% overall in D's run b). Bursts never make a sample
#    faster, so the lower quartile of an arm's samples is its undisturbed time as long as fewer
#    than three quarters of them are hit; the median fails at half (4 of D's 17 disagreements).
# The band of a cell is therefore max(tie band, LAUNCH_JITTER_NS / the fastest arm's time per
# call): an arm closer to the fastest than the run-to-run jitter of one call ties with it, and the
# simplest tied arm takes the cell, as spec 003 asks ("nothing bakes sub-noise jitter"). Where a
# call takes over 7.5 us the spec's 2% governs unchanged. 150 ns is 1.5x the p90 above (a margin
# sits above the noise, not at it); --launch-jitter-ns sets it, 0 turns the widening off.
LAUNCH_JITTER_NS = 150.0
LOW_QUANTILE = 0.25
LOW_STAT = "q25"  # CellPick.stat of decide_low (the table's evidence `_stat`)
DISTURBED = 0.10  # a sample this far above its arm's lower quartile is counted as disturbed


def quantile(values: "list[float] | tuple[float, ...]", q: float) -> float:
    """The q-quantile of `values` (linear interpolation between order statistics)."""
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q} must be in [0, 1]")
    xs = sorted(float(v) for v in values)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


MAX_NOISE_BAND = 0.99


def noise_band(call_ns: float, tie_band: float = TIE_BAND, jitter_ns: float = LAUNCH_JITTER_NS) -> float:
    """The cell's tie band: the rule's band, widened to the launch jitter between processes where
    one call (ns per problem x batch) is short enough for it to matter."""
    if jitter_ns < 0:
        raise ValueError(f"jitter_ns={jitter_ns} must be >= 0")
    if not (call_ns > 0 and math.isfinite(call_ns)):
        return tie_band
    # a jitter longer than the call ties every arm within (nearly) 2x: the simplest takes the
    # cell; the band stays below 1, where a PickRule's band must lie
    return max(tie_band, min(jitter_ns / call_ns, MAX_NOISE_BAND))


def low_times(samples: Mapping[str, "list[float] | tuple[float, ...] | None"],
              q: float = LOW_QUANTILE) -> dict[str, float]:
    """Each arm's lower quantile over its rounds; arms without valid samples are left out."""
    return {a: quantile(s, q) for a, s in valid_samples(samples).items()}


def block_times(samples: Mapping[str, "list[float] | tuple[float, ...] | None"], block: int | None = None,
                q: float = LOW_QUANTILE) -> dict[str, float]:
    """Each arm's time: the lower quantile of its rounds, or with `block` (rounds a block; each
    block of a tune on fresh CUDA graphs, see ladder.measure_cell) the median over blocks of each
    block's lower quantile (a last partial block joins the one before it). One block: low_times."""
    ok = valid_samples(samples)
    if block is None or block < 1:
        return {a: quantile(s, q) for a, s in ok.items()}
    return {a: median([quantile(c, q) for c in _blocks(s, block)]) for a, s in ok.items()}


def _blocks(values: list[float], block: int) -> list[list[float]]:
    cuts = [values[i:i + block] for i in range(0, len(values), block)]
    if len(cuts) > 1 and len(cuts[-1]) < block:
        cuts[-2:] = [cuts[-2] + cuts[-1]]
    return cuts


def decide_low(samples: Mapping[str, "list[float] | tuple[float, ...] | None"], batch: int,
               rule: PickRule = LINALG_RULE, jitter_ns: float = LAUNCH_JITTER_NS,
               q: float = LOW_QUANTILE, block: int | None = None) -> CellPick:
    """Spec 003's rule on each arm's lower quartile (ns per problem; with `block`, the median
    over blocks of rounds of each block's: block_times), with the cell's tie band widened to the
    launch jitter (noise_band; `batch` turns ns per problem into ns per call). The dependency
    margin is the rule's, unchanged."""
    if batch < 1:
        raise ValueError(f"batch={batch} must be at least 1")
    return decide_times(block_times(samples, block, q), batch, rule, jitter_ns)


def cell_band(times: Mapping[str, float], batch: int, rule: PickRule = LINALG_RULE,
              jitter_ns: float = LAUNCH_JITTER_NS) -> float:
    """The tie band decide_low judges a cell with: the rule's, widened to the launch jitter of
    the fastest native arm's call (times in ns a problem)."""
    native = [t for a, t in times.items() if rule.is_native(a)]
    return noise_band(min(native) * batch, rule.tie_band, jitter_ns) if native else rule.tie_band


def decide_times(times: Mapping[str, float], batch: int, rule: PickRule = LINALG_RULE,
                 jitter_ns: float = LAUNCH_JITTER_NS) -> CellPick:
    """decide_low on each arm's statistic already taken (ns a problem): what a `--pick low` tune
    decided, and what `tunedb linalg repick` re-decides from a table's recorded statistic."""
    band = cell_band(times, batch, rule, jitter_ns)
    got = decide(times, replace(rule, tie_band=band))
    return CellPick(got.winner, got.native, f"{got.reason}; lower quartile, band {band:.1%} "
                                            f"(launch jitter {jitter_ns:g} ns a call)", LOW_STAT, dict(times))


def disturbed(samples: Mapping[str, "list[float] | tuple[float, ...] | None"], q: float = LOW_QUANTILE,
              slack: float = DISTURBED) -> float:
    """The largest share, over arms, of samples more than `slack` above the arm's lower quantile:
    how much of a cell a burst took. Past a half the lower quartile is at risk (the tune then
    measures more rounds)."""
    worst = 0.0
    for a, low in low_times(samples, q).items():
        s = samples[a]
        worst = max(worst, sum(t > low * (1.0 + slack) for t in s) / len(s))
    return worst


# --- the sequential part: more captures where the pick sits at its band's edge ------------------
# Two tunes disagree where an arm's ratio to the fastest lies within the between-process noise of
# the band's edge (s16 D: the 5 cells left, all batch 256, 0.3-1.6% of the ratio from the edge).
# No rule of one run's numbers removes that: any threshold has an edge, and a rule that moves
# the edge by the run's own spread adds that spread's noise (the replay: a "plausible" tie on a
# bootstrap interval agrees on 209 of s16 D's 216 cells where the point rule agrees on 211).
# What lowers the chance that two runs straddle the edge is a smaller variance of the estimate
# there: the sequential rule measures a cell whose pick is near the edge in further blocks of
# rounds, each on fresh CUDA graphs, inputs and outputs (GraphTimer.refresh: a new capture, new
# addresses), and decides on the median over blocks. "Near" is z x sigma / sqrt(blocks) in
# ns a call, sigma the larger of CAPTURE_SIGMA_NS (the between-process sd of one estimate: the
# change of a ratio between two runs has p90 101-110 ns, so sd 101-110 / 1.645 / sqrt(2) ~ 45 ns
# per run; where a call is long the change is relative, p95 1.8%, so an sd of at least
# CAPTURE_SIGMA_REL) and the spread of the arm's ratio over this run's blocks (from 3 blocks on).
# If the between-process noise is per capture, the blocks average it away where it matters; if
# it is per process, the blocks agree with each other and nothing changes (the device run says
# which: each round records its block).
CAPTURE_SIGMA_NS = 45.0
CAPTURE_SIGMA_REL = 0.0065  # 1.8% / 1.96 / sqrt(2)
EDGE_Z = 1.645


def near_edge(samples: Mapping[str, "list[float] | tuple[float, ...] | None"], batch: int, block: int,
              rule: PickRule = LINALG_RULE, jitter_ns: float = LAUNCH_JITTER_NS,
              sigma_ns: float = CAPTURE_SIGMA_NS, q: float = LOW_QUANTILE) -> list[str]:
    """The arms whose side of an edge of the decision could move the cell's pick, and whose ratio
    lies within that edge's noise zone (EDGE_Z x sigma / sqrt(blocks), sigma the largest of
    `sigma_ns` a call, CAPTURE_SIGMA_REL, the ratio's standard error from the samples' spread
    (ratio_se) and, over 3 or more blocks, the sd of its per-block ratios). Three edges: the
    native tie band (the native pick and every simpler native arm, against the fastest native);
    the dependency margin (each optional-tier arm against the fastest native arm: which of them
    clear it decides whether the tier serves and which of its arms compete); and the tier's own
    band (dep_band(), among the arms that clear the margin: the tier's pick, which serves wherever
    the tier runs; session 25 found those picks moving between two tunes while the native ones
    held). Empty: the pick is clear of every edge."""
    if batch < 1 or block < 1:
        raise ValueError(f"batch={batch} and block={block} must be at least 1")
    ok = valid_samples(samples)
    native = {a: s for a, s in ok.items() if rule.is_native(a)}
    deps = {a: s for a, s in ok.items() if not rule.is_native(a)}
    if not native:
        return []  # the fallback serves (decide): no edge to be near
    times = block_times(ok, block, q)
    band = cell_band(times, batch, rule, jitter_ns)
    out: set[str] = set()
    if len(native) >= 2:
        chosen = decide_times(times, batch, rule, jitter_ns).native
        out |= _band_edge(native, times, chosen, band, batch, block, rule, sigma_ns, q)
    if deps:
        best = min(native, key=lambda a: times[a])
        edge = 1.0 + rule.dep_margin
        for a in sorted(deps):
            sigma, k = _sigma(native[best], deps[a], times[a] * batch, block, sigma_ns, q)
            if abs(times[best] / times[a] - edge) <= EDGE_Z * sigma / math.sqrt(k):
                out |= {best, a}
        eligible = {a: s for a, s in deps.items() if times[best] > times[a] * edge}
        if len(eligible) >= 2:
            banded = replace(rule, tie_band=band)
            dep_pick = banded.dep_tie_pick({a: times[a] for a in eligible})
            out |= _band_edge(eligible, times, dep_pick, banded.dep_band(), batch, block, rule, sigma_ns, q)
    return sorted(out)


def _sigma(arm: "list[float] | tuple[float, ...]", ref: "list[float] | tuple[float, ...]", call_ns: float,
           block: int, sigma_ns: float, q: float) -> tuple[float, int]:
    """(one block's sd of the ratio arm / ref, the blocks both have): the largest of the capture
    floor (sigma_ns a call, CAPTURE_SIGMA_REL), the samples' own spread (ratio_se) and, over 3 or
    more blocks, the sd of the per-block ratios."""
    a, r = _blocks(list(arm), block), _blocks(list(ref), block)
    k = min(len(a), len(r))
    sigma = max(sigma_ns / call_ns, CAPTURE_SIGMA_REL, ratio_se(arm, ref, block, q),
                _sd([quantile(a[i], q) / quantile(r[i], q) for i in range(k)]))
    return sigma, k


def _sd(ratios: list[float]) -> float:
    """The sample sd of per-block ratios; 0 below 3 blocks (too few to say)."""
    k = len(ratios)
    if k < 3:
        return 0.0
    mean = sum(ratios) / k
    return math.sqrt(sum((x - mean) ** 2 for x in ratios) / (k - 1))


def ratio_se(arm: "list[float] | tuple[float, ...]", ref: "list[float] | tuple[float, ...]", block: int,
             q: float = LOW_QUANTILE) -> float:
    """The relative standard error of one block's ratio of two arms' lower quartiles, from the
    samples' own spread (sd from the interquartile range, the se of a quartile of `block`
    samples ~1.36 sd / sqrt(block)). Session 25: a 1.5 ms cell whose samples spread 8% moved its
    pick between two tunes while the fixed 0.65% floor called it clear of the edge."""
    def rel(xs: "list[float] | tuple[float, ...]") -> float:
        if len(xs) < 4:
            return 0.0
        sd = (quantile(xs, 0.75) - quantile(xs, 0.25)) / 1.349
        return 1.36 * sd / math.sqrt(block) / quantile(xs, q)
    return math.hypot(rel(arm), rel(ref))


def _band_edge(group: Mapping[str, "list[float] | tuple[float, ...]"], all_times: Mapping[str, float], chosen: str,
               band: float, batch: int, block: int, rule: PickRule, sigma_ns: float, q: float) -> set[str]:
    """Within one group of arms (the native ones, or the optional tiers' that clear the margin):
    the arms as simple as the group's pick or simpler whose ratio to the group's fastest lies
    within the noise of the tie band's edge (a less simple arm never takes the cell from the pick
    by crossing it). `all_times`: block_times of the cell, already taken."""
    times = {a: all_times[a] for a in group}
    fastest = min(times.values())
    call = fastest * batch
    edge = 1.0 + band
    rank = rule.simplicity(chosen)
    blocks = {a: _blocks(list(s), block) for a, s in group.items()}
    k = min(len(b) for b in blocks.values())
    per_block = [min(quantile(b[i], q) for b in blocks.values()) for i in range(k)]
    first = min(times, key=lambda a: times[a])
    out = set()
    for a in sorted(group):
        if rule.simplicity(a) > rank or times[a] == fastest:
            continue  # the fastest arm's ratio is 1 by definition: it crosses no edge itself
        sigma = max(sigma_ns / call, CAPTURE_SIGMA_REL, ratio_se(group[a], group[first], block, q),
                    _sd([quantile(blocks[a][i], q) / per_block[i] for i in range(k)]))
        if abs(times[a] / fastest - edge) <= EDGE_Z * sigma / math.sqrt(k):
            out.add(a)
    return out
