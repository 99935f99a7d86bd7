"""bench/lomo_gv.py: the gv decode rule's serving decisions and the choice of its M* on the training
models alone (CPU, synthetic points, well under a second)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

gv = pytest.importorskip("lomo_gv")
lt = pytest.importorskip("lomo_transfer")


def pt(key, m, ms, model="a"):
    return lt.Point(key, model, "", m, 8.0 * (1 << 20), ms)


def first_gv(p):
    """A stand-in predictor: the alphabetically first gv arm measured at the point."""
    return next((c for c in sorted(p.ms) if c.startswith("gv")), None)


def test_serves_the_predicted_gv_arm_up_to_m_star_and_torch_beyond():
    pts = [pt(1, 1, {"torch": 10.0, "gv_a": 8.0}), pt(2, 4, {"torch": 10.0, "gv_a": 9.0}),
           pt(3, 8, {"torch": 10.0, "gv_a": 9.0}), pt(4, 2, {"torch": 10.0, "b64": 9.0})]
    picks = gv.gv_rule(pts, first_gv, 4)
    assert picks == {1: "gv_a", 2: "gv_a", 3: "torch", 4: "torch"}  # no gv arm measured at 4: torch
    assert set(gv.gv_rule(pts, first_gv, 0).values()) == {"torch"}


def test_m_star_stops_below_the_first_training_point_the_rule_loses_more_than_5_percent():
    train = [pt(1, 1, {"torch": 10.0, "gv_a": 8.0}), pt(2, 1, {"torch": 10.0, "gv_a": 10.3}),
             pt(3, 4, {"torch": 10.0, "gv_a": 9.0}), pt(4, 8, {"torch": 10.0, "gv_a": 11.0})]
    # M=1: worst regret 3% (safe); M<=4 adds a win; M<=8 adds a 10% loss: never served past 4
    assert gv.choose_m_star(train, first_gv) == 4
    # the loss at M=1 itself: nothing is safe, nothing served
    train[1] = pt(2, 1, {"torch": 10.0, "gv_a": 10.6})
    assert gv.choose_m_star(train, first_gv) == 0


def test_m_star_needs_evidence():
    # one training point at M <= 2 is not evidence enough; none at all serves nothing
    assert gv.choose_m_star([pt(1, 2, {"torch": 10.0, "gv_a": 5.0})], first_gv) == 0
    assert gv.choose_m_star([], first_gv) == 0
    two = [pt(1, 2, {"torch": 10.0, "gv_a": 5.0}), pt(2, 3, {"torch": 10.0, "gv_a": 5.0})]
    assert gv.choose_m_star(two, first_gv) == 16  # safe at every M*: the largest, M <= 16


def test_gain_shares_split_the_oracle_gain_by_kind_and_m_range():
    pts = [pt(1, 1, {"torch": 2.0, "x": 1.0}), pt(2, 8, {"torch": 2.0, "x": 1.0}),
           pt(3, 300, {"torch": 1.0, "x": 2.0})]
    assert gv.gain_shares(pts) == {"plain|m1": pytest.approx(0.5), "plain|m129+": 0.0,
                                   "plain|m2-16": pytest.approx(0.5)}
