"""bench/lomo_transfer.py: the nearest-measured-neighbour rule's serving decisions, its scoring and
the choice of its parameters on training models only (CPU, synthetic points, well under a second)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

lt = pytest.importorskip("lomo_transfer")
P = lt.Params
MB = float(1 << 20)


def pt(key, model, m, weight_mb, ms, kind=""):
    return lt.Point(key, model, kind, m, weight_mb * MB, ms)


def test_serves_the_config_that_beats_torch_at_every_neighbour():
    train = [pt(i, "a", m, 8, {"torch": 10.0, "x": 9.0, "y": 9.5}) for i, m in enumerate((2, 4, 8))]
    here = pt("h", "h", 4, 10, {"torch": 10.0, "x": 9.0, "y": 9.0})
    cfg, band = lt.transfer_pick(train, here, here.ms, P(m_oct=1, w_oct=1, min_points=2, margin=0.05))
    assert cfg == "x" and band == pytest.approx(0.0)


def test_one_losing_neighbour_or_a_gain_inside_the_margin_serves_torch():
    train = [pt(1, "a", 4, 8, {"torch": 10.0, "x": 8.0}), pt(2, "a", 8, 8, {"torch": 10.0, "x": 10.5})]
    here = pt("h", "h", 4, 8, {"torch": 10.0, "x": 8.0})
    assert lt.transfer_pick(train, here, here.ms, P(1, 1, 1, 0.0)) == ("torch", None)
    # worst case +4%: inside a 5% margin, outside a 2% one
    train = [pt(1, "a", 4, 8, {"torch": 10.4, "x": 10.0}), pt(2, "a", 8, 8, {"torch": 12.0, "x": 10.0})]
    assert lt.transfer_pick(train, here, here.ms, P(1, 1, 1, 0.05))[0] == "torch"
    cfg, band = lt.transfer_pick(train, here, here.ms, P(1, 1, 1, 0.02))
    assert cfg == "x" and band == pytest.approx(1.2 / 1.04 - 1.0)


def test_no_evidence_serves_torch():
    here = pt("h", "h", 4, 8, {"torch": 10.0, "x": 5.0})
    win = {"torch": 10.0, "x": 5.0}
    # unmeasured at one neighbour, too few neighbours, another epilogue kind, M or weight too far
    assert lt.transfer_pick([pt(1, "a", 4, 8, win), pt(2, "a", 4, 8, {"torch": 10.0})], here, here.ms,
                            P(1, 1, 1, 0.0))[0] == "torch"
    assert lt.transfer_pick([pt(1, "a", 4, 8, win)], here, here.ms, P(1, 1, 2, 0.0))[0] == "torch"
    assert lt.transfer_pick([pt(1, "a", 4, 8, win, kind="+act")], here, here.ms, P(1, 1, 1, 0.0))[0] == "torch"
    assert lt.transfer_pick([pt(1, "a", 16, 8, win)], here, here.ms, P(1, 1, 1, 0.0))[0] == "torch"
    assert lt.transfer_pick([pt(1, "a", 4, 64, win)], here, here.ms, P(1, 1, 1, 0.0))[0] == "torch"
    assert lt.transfer_pick([], here, here.ms, P(1, 1, 0, 0.0))[0] == "torch"


def test_sentinels_are_never_transferred():
    train = [pt(1, "a", 4, 8, {"torch": 10.0, "default": 5.0})]
    here = pt("h", "h", 4, 8, {"torch": 10.0, "default": 5.0})
    assert lt.transfer_pick(train, here, here.ms, P(1, 1, 1, 0.0))[0] == "torch"


def test_act_up_takes_fused_evidence_from_heavier_weights_only():
    heavy = [pt(1, "a", 4, 100, {"torch": 10.0, "x": 9.0}, kind="+act")]
    light = [pt(1, "a", 4, 0.5, {"torch": 10.0, "x": 9.0}, kind="+act")]
    here = pt("h", "h", 4, 2, {"torch": 10.0, "x": 7.0}, kind="+act")
    up = P(1, 1, 1, 0.0, act_up=True)
    assert lt.transfer_pick(heavy, here, here.ms, up)[0] == "x"
    assert lt.transfer_pick(light, here, here.ms, up)[0] == "torch"
    # a plain GEMM keeps the symmetric weight window under act_up
    plain_here = pt("h", "h", 4, 2, {"torch": 10.0, "x": 7.0})
    plain_heavy = [pt(1, "a", 4, 100, {"torch": 10.0, "x": 9.0})]
    assert lt.transfer_pick(plain_heavy, plain_here, plain_here.ms, up)[0] == "torch"


def test_score_counts_served_points_and_gain_kept():
    pts = [pt(1, "h", 4, 8, {"torch": 10.0, "x": 8.0, "y": 10.6}), pt(2, "h", 4, 8, {"torch": 10.0, "x": 12.0})]
    s = lt.score(pts, {1: "x", 2: "torch"})
    assert s["served"] == 1 and s["served_max"] == pytest.approx(0.0)
    assert s["gain_kept"] == pytest.approx(1.0)
    assert lt.safe(s)
    bad = lt.score(pts, {1: "y"})
    assert bad["served_max"] == pytest.approx(0.325) and not lt.safe(bad)


def test_choose_decides_on_the_training_models_alone():
    # models a and b agree that x wins at M=4; c is where x loses: a rule that transfers across the
    # weight gap to c must be rejected by the inner split that holds c out
    a = [pt(("a", m), "a", m, 8, {"torch": 10.0, "x": 9.0}) for m in (2, 4)]
    b = [pt(("b", m), "b", m, 8, {"torch": 10.0, "x": 9.2}) for m in (2, 4)]
    c = [pt(("c", m), "c", m, 64, {"torch": 10.0, "x": 13.0}) for m in (2, 4)]
    prm, gain, inner = lt.choose(a + b + c)
    assert inner == 3 and gain > 0
    assert prm.w_oct < 3  # a window reaching c's weight would serve x there, 30% slower
    held = [pt(("h", 4), "h", 4, 8, {"torch": 10.0, "x": 9.1})]
    assert lt.apply(a + b + c, held, prm) == {("h", 4): "x"}


def test_choose_falls_back_to_the_strictest_rule_without_inner_evidence():
    only = [pt(1, "a", 4, 8, {"torch": 10.0, "x": 11.0})]
    prm, gain, _ = lt.choose(only)
    assert gain == 0.0 and prm == lt.grid()[0]


def test_regime_table_finds_a_config_consistent_across_models():
    pts = [pt(1, "a", 4, 8, {"torch": 10.0, "x": 9.0, "y": 8.0}), pt(2, "b", 8, 8, {"torch": 10.0, "x": 9.5, "y": 11.0})]
    rows = {r["model"]: r for r in lt.regime_table(pts)}
    assert rows["a"]["consistent_config"] == "y"
    assert rows["ALL"]["consistent_config"] == "x" and rows["ALL"]["consistent_worst_gain"] == pytest.approx(10 / 9.5 - 1)
    assert rows["ALL"]["oracle_gain_max"] == pytest.approx(0.25)
