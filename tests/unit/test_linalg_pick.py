"""Spec 003's pick rule for one linalg cell: margin, tie band, simplicity order, dependency
split, and a pure-noise re-run reproducing every decision."""
from __future__ import annotations

import random

import pytest

from tunedb.families.linalg import configs
from tunedb.families.contract import PickRule
from tunedb.families.linalg.pick import LINALG_RULE, decide


def test_the_fastest_native_arm_wins_beyond_the_tie_band():
    got = decide({"torch": 10.0, "thread_p64_w2": 5.0, "warp_p8_w4": 4.0, "block_w4": 6.0})
    assert got.winner == got.native == "warp_p8_w4"


def test_a_simpler_arm_within_the_tie_band_takes_the_cell():
    # block is fastest, warp is 1.5% slower (inside 2%), thread is 3% slower (outside)
    got = decide({"torch": 10.0, "thread_p64_w2": 1.03, "warp_p8_w4": 1.015, "block_w4": 1.0})
    assert got.winner == "warp_p8_w4"
    # thread inside the band too: the simplest wins
    assert decide({"thread_p64_w2": 1.019, "warp_p8_w4": 1.015, "block_w4": 1.0}).winner == "thread_p64_w2"


def test_the_library_arm_keeps_a_cell_it_ties():
    assert decide({"torch": 1.01, "thread_p64_w2": 1.0}).winner == "torch"
    assert decide({"torch": 1.03, "thread_p64_w2": 1.0}).winner == "thread_p64_w2"


def test_the_simplicity_order_is_library_thread_warp_block():
    ranks = [configs.simplicity(a) for a in ("torch", "thread_p64_w2", "warp_p8_w4", "block_w4")]
    assert ranks == sorted(ranks) and len(set(ranks)) == 4


def test_a_dependency_arm_needs_more_than_the_dependency_margin():
    base = {"torch": 10.0, "warp_p8_w4": 1.0}
    within = decide({**base, "nvmath_block": 1.0 / 1.04})
    assert within.winner == within.native == "warp_p8_w4"
    beyond = decide({**base, "nvmath_block": 1.0 / 1.06})
    assert beyond.winner == "nvmath_block" and beyond.native == "warp_p8_w4"


def test_the_dependency_margin_is_measured_against_the_fastest_native_arm():
    # warp takes the native cell by the tie band (1.5% slower than block); the dependency arm is
    # 6% faster than warp but only 4.4% faster than block, the fastest native arm: no win
    got = decide({"warp_p8_w4": 1.015, "block_w4": 1.0, "nvmath_block": 1.015 / 1.06})
    assert got.winner == got.native == "warp_p8_w4"


def test_failed_arms_cannot_win_and_nothing_usable_leaves_the_fallback():
    got = decide({"torch": 2.0, "thread_p64_w2": None, "warp_p8_w4": float("inf"), "block_w4": float("nan")})
    assert got.winner == "torch"
    empty = decide({"thread_p64_w2": None})
    assert (empty.winner, empty.native) == ("torch", "torch")


def test_a_dependency_arm_alone_never_takes_a_cell_without_a_native_measurement():
    got = decide({"nvmath_block": 1.0})
    assert got.winner == got.native == "torch"


def test_the_rule_refuses_nonsense_margins():
    from dataclasses import replace

    with pytest.raises(ValueError, match="tie_band"):
        replace(LINALG_RULE, tie_band=-0.1)
    with pytest.raises(ValueError, match="dep_margin"):
        replace(LINALG_RULE, dep_margin=-1.0)
    assert isinstance(LINALG_RULE, PickRule) and LINALG_RULE.min_speedup == 1.0


def test_the_decision_does_not_depend_on_the_order_arms_are_listed():
    times = {"torch": 3.0, "thread_p64_w2": 1.01, "warp_p8_w4": 1.0, "block_w4": 1.01, "nvmath_x": 0.5}
    items = list(times.items())
    first = decide(times)
    for seed in range(10):
        random.Random(seed).shuffle(items)
        assert decide(dict(items)) == first


def _true_cells(rng: random.Random) -> list[dict[str, float]]:
    """Cells whose arms are either within 0.8% of the fastest or more than 4% slower (so noise
    of +-0.5% cannot move an arm across the 2% band's edge)."""
    arms = ["torch", "thread_p64_w2", "warp_p8_w4", "block_w4", "nvmath_block"]
    cells = []
    for _ in range(300):
        best = rng.uniform(1.0, 100.0)
        cell = {}
        for arm in arms:
            cell[arm] = best * (1 + rng.uniform(0.0, 0.008) if rng.random() < 0.4 else 1.04 + rng.uniform(0, 1))
        if rng.random() < 0.3:  # a dependency arm clearly beyond the 5% margin
            cell["nvmath_block"] = min(cell[a] for a in arms[:4]) / rng.uniform(1.08, 2.0)
        cells.append(cell)
    return cells


def test_a_pure_noise_rerun_reproduces_every_cell():
    cells = _true_cells(random.Random(3))
    noise = random.Random(4)

    def rerun() -> list:
        return [decide({a: t * (1 + noise.uniform(-0.005, 0.005)) for a, t in cell.items()}) for cell in cells]
    first, second = rerun(), rerun()
    assert [(p.winner, p.native) for p in first] == [(p.winner, p.native) for p in second]
    assert LINALG_RULE.tie_band == 0.02 and LINALG_RULE.dep_margin == 0.05


def test_two_configs_of_one_packing_in_the_band_resolve_without_the_noise():
    # whichever of the two is a hair faster, fewer warps (then fewer problems per program) wins
    for a, b in ((1.0, 1.01), (1.01, 1.0)):
        assert decide({"warp_p8_w4": a, "warp_p8_w2": b, "warp_p16_w2": a}).winner == "warp_p8_w2"
