"""Partitioner properties over random tables: cover, ordering/coverage, the gate, determinism
and stability under noise inside the margins."""
import math
import random

from hypothesis import assume, given, settings, strategies as st

from tunedb.build.partition import _effective_weights, _geomean_speedup, partition, segment, set_cover
from tunedb.families.contract import PickRule
from tunedb.records import Entry, Point, Signature

SIG = Signature.make("gemm", "gemm", "half", N=1024, K=1024)
TOL, GATE = 0.03, 1.05
RULE = PickRule(fallback="torch", tie_band=TOL)


@st.composite
def problems(draw):
    """Times whose ratios to the best are either inside a 0.5% noise band or >= 10% off: the
    regime where a margin-based partitioner has a unique right answer."""
    ms = sorted(draw(st.sets(st.integers(1, 8192), min_size=1, max_size=10)))
    configs = ["torch"] + [f"c{i}" for i in range(draw(st.integers(1, 5)))]
    table = {}
    for m in ms:
        base = draw(st.floats(0.001, 10.0))
        winner = draw(st.sampled_from(configs))
        for c in configs:
            if c != winner and c != "torch" and draw(st.booleans()) and draw(st.booleans()):
                continue  # some arms were not measured here (failed or pruned)
            near = c == winner or draw(st.booleans())
            ratio = draw(st.floats(1.0, 1.005)) if near else draw(st.floats(1.1, 3.0))
            table[(m, c)] = base * ratio
    weights = [draw(st.sampled_from([0.0, 0.1, 1.0, 5.0])) for _ in ms]
    points = [Point(SIG, m, weight=w, must_tune=bool(i % 2)) for i, (m, w) in enumerate(zip(ms, weights))]
    return points, table


def _best(table, m):
    return min(t for (mm, _), t in table.items() if mm == m)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_cover_puts_every_point_within_tol_of_its_best(prob):
    points, table = prob
    ms = [p.m for p in points]
    chosen = set_cover(ms, table, _effective_weights(points), RULE)
    for m in ms:
        assert any((m, c) in table and table[(m, c)] <= _best(table, m) * (1 + TOL) for c in chosen)
    # The DP serves every point by a covering config (before the gate).
    for i, j, c in segment(ms, table, _effective_weights(points), chosen, RULE):
        for m in ms[i:j]:
            assert table[(m, c)] <= _best(table, m) * (1 + TOL)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_regions_are_sorted_cover_every_m_and_pass_the_gate(prob):
    points, table = prob
    part = partition(points, table, fallback="torch", min_speedup=GATE, tol=TOL)
    his = [r.m_hi for r in part.regions]
    assert his[-1] is None
    assert his[:-1] == sorted(his[:-1]) and len(set(his[:-1])) == len(his) - 1
    assert all(h in {p.m for p in points} for h in his[:-1])
    assert all(a.config_id != b.config_id for a, b in zip(part.regions, part.regions[1:]))
    entry = Entry(SIG, part.regions)
    weights = _effective_weights(points)
    ms = sorted(p.m for p in points)
    # Above the largest measured M only the fallback serves (regions round up).
    assert part.regions[-1].config_id == "torch" and entry.lookup(ms[-1] + 1) == "torch"
    for region in part.regions:
        served = [m for m in ms if entry.lookup(m) == region.config_id]
        if region.m_hi is None and region.config_id == "torch" and len(part.regions) > 1:
            continue  # the catch-all above the last measured M
        assert served, "every region serves a measured point"
        if region.config_id != "torch":
            assert _geomean_speedup(served, table, weights, region.config_id, "torch") >= GATE


@settings(max_examples=100, deadline=None)
@given(problems(), st.randoms(use_true_random=False))
def test_deterministic_and_stable_under_noise_inside_the_margin(prob, rnd):
    points, table = prob
    first = partition(points, table, fallback="torch")
    # Order of inputs does not matter.
    shuffled_points = list(points)
    rnd.shuffle(shuffled_points)
    items = list(table.items())
    rnd.shuffle(items)
    assert partition(shuffled_points, dict(items), fallback="torch") == first
    # Pre-gate speedups that sit on the gate's edge may legitimately flip; skip those draws.
    ms = [p.m for p in points]
    weights = _effective_weights(points)
    chosen = set_cover(ms, table, weights, RULE)
    for i, j, c in segment(ms, table, weights, chosen, RULE):
        s = _geomean_speedup(ms[i:j], table, weights, c, "torch")
        assume(s is None or abs(math.log(s / GATE)) > 0.02)
    noisy = {k: t * math.exp(rnd.uniform(-0.004, 0.004)) for k, t in table.items()}
    assert partition(points, noisy, fallback="torch").regions == first.regions
