"""Robust statistics of the measurement protocol: median, MAD sigma, stopping and halving rules.

Pure Python (no numpy, no torch): the protocol loop, the replay and fake timers and the tests
all run these on plain lists of per-call milliseconds.
"""
from __future__ import annotations

import math
import random
from typing import Iterable, Mapping, Sequence

# sigma = 1.4826 * MAD is consistent with the standard deviation for normal noise,
# and a few outliers (a preempted replay, a clock dip) barely move it.
MAD_TO_SIGMA = 1.4826
# The median's standard error is sqrt(pi/2) ~ 1.2533 times the mean's for normal noise.
MEDIAN_SE_FACTOR = 1.2533
# How far apart (in standard errors of each median) two arms must sit for the later one to be
# "clearly behind", and from how many samples (a MAD from 5 samples underestimates the spread).
# Replaying the recorded builds and tunes (bench/rounds_replay.py, ~700 protocol calls): 2 SE
# from 5 samples changed 7 winners by up to 4%; 3 SE from 10 changed 1, by 1.5% (inside the
# build's 3% band), for 13% less round time overall and 25% less on whisper-large-v3 at M=12000.
SEPARATION_SE = 3.0
SEPARATION_MIN_N = 10


def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of no samples")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


def mad_sigma(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation: a robust sigma."""
    med = median(values)
    return MAD_TO_SIGMA * median([abs(v - med) for v in values])


def median_se(values: Sequence[float]) -> float:
    """Standard error of the median, from the robust sigma."""
    return MEDIAN_SE_FACTOR * mad_sigma(values) / math.sqrt(len(values))


def converged(values: Sequence[float], rel_tol: float, min_n: int) -> bool:
    """True when at least min_n samples pin the median to within rel_tol of itself."""
    if len(values) < max(min_n, 2):
        return False
    med = median(values)
    if med <= 0:
        return True  # nothing left to resolve at zero cost
    return median_se(values) <= rel_tol * med


def settled(samples: Mapping[str, Sequence[float]], scores: Mapping[str, float], rel_tol: float,
            min_n: int) -> bool:
    """Whether the protocol can stop sampling these arms: every arm is converged (its median
    pinned to rel_tol) or clearly behind the leader (from SEPARATION_MIN_N samples each, its
    score SEPARATION_SE standard errors down still above the leader's as many up); the leader
    is settled by converging, or by every other arm being clearly behind it. A lone arm must
    converge; no arms at all are settled.

    Under power-limited clocks a long GEMM's samples spread 2-5% (whisper-large-v3 at M=12000 on
    the H200), so its median never pins to 0.5% within the round cap; without the second clause
    a default 37% behind the leader kept every survivor sampling to the cap. An arm behind by
    less than its noise keeps sampling: the build's 3% band and 1.05x gate read its median."""
    if not samples:
        return True
    if any(len(v) < max(min_n, 2) for v in samples.values()):
        return False
    lead = min(scores, key=lambda c: (scores[c], c))
    others = [c for c in samples if c != lead]
    ceiling = scores[lead] + SEPARATION_SE * median_se(samples[lead])
    separable = all(len(v) >= SEPARATION_MIN_N for v in samples.values())
    behind = {c: separable and scores[c] - SEPARATION_SE * median_se(samples[c]) > ceiling for c in others}
    if others and all(behind.values()):
        return True  # the leader's rank is settled too
    return converged(samples[lead], rel_tol, min_n) and all(
        behind[c] or converged(samples[c], rel_tol, min_n) for c in others)


def gate_decided(samples: Mapping[str, Sequence[float]], scores: Mapping[str, float], fallback: str,
                 min_speedup: float, min_n: int) -> bool:
    """Whether a point's verdict is already the fallback's: no other arm, scored SEPARATION_SE
    standard errors better than its median (its most hopeful), beats the fallback's score as many
    errors worse (its most doubtful) by min_speedup, the gate a region must pass to take the
    fallback's place. Sampling on would only sharpen medians that serve nowhere at this point;
    each arm keeps min_n samples for the evidence and the cost model's refit.

    It decides a signature measured at one M only (the build passes it for those): across
    several points a region's gate is a geomean and an arm behind here can still win there.
    From min_n samples, unlike settled()'s SEPARATION_MIN_N: a wrong stop needs an arm truly
    1.05x ahead to read about 6 standard errors of its median slower than it is (3 on each
    side), where settled() separates arms a noise-width apart. On whisper-large-v3 at M=12000
    (cuBLAS ahead of every Triton config by 6-31%) it ends a point at the first check."""
    if fallback not in samples or any(len(v) < max(min_n, 2) for v in samples.values()):
        return False
    ceiling = (scores[fallback] + SEPARATION_SE * median_se(samples[fallback])) / min_speedup
    return all(scores[c] - SEPARATION_SE * median_se(samples[c]) > ceiling for c in samples if c != fallback)


def round_order(arm_ids: Sequence[str], rng: random.Random) -> list[str]:
    """One round's order: a seeded shuffle, so drift hits every arm alike and runs reproduce."""
    order = list(arm_ids)
    rng.shuffle(order)
    return order


def halving_rounds(min_rounds: int, max_rounds: int) -> frozenset[int]:
    """Round counts after which successive halving prunes: min_rounds, 2x, 4x ... below the cap."""
    out, r = set(), max(1, min_rounds)
    while r < max_rounds:
        out.add(r)
        r *= 2
    return frozenset(out)


def halve(scores: Mapping[str, float], protected: Iterable[str]) -> tuple[str, ...]:
    """The arms that survive one halving: the better half (by score, lower wins) plus the protected.

    Protected arms (the default, the incumbent) always survive and do not take a slot of the
    better half; ties break on the id so the result does not depend on dict order.
    """
    protected = set(protected)
    free = sorted((a for a in scores if a not in protected), key=lambda a: (scores[a], a))
    keep = max(1, math.ceil(len(free) / 2)) if free else 0
    survivors = set(free[:keep]) | (protected & set(scores))
    return tuple(a for a in scores if a in survivors)


def objective_score(samples: Sequence[float], host_us: float | None, alpha: float) -> float:
    """The ranking score of an arm: median GPU ms + alpha x host issue ms."""
    return median(samples) + alpha * (host_us or 0.0) / 1000.0


def summarize(values: Sequence[float]) -> tuple[float, float, int]:
    """(median, sigma, n) of one arm's samples."""
    return median(values), mad_sigma(values), len(values)

