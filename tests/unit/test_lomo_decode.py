"""bench/lomo_decode.py: the rank correlation its decode report rests on, and the report on a
small synthetic model whose decode times follow the decode law (CPU, seconds)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

lomo_decode = pytest.importorskip("lomo_decode")


def test_spearman_orders_not_values():
    assert lomo_decode.spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert lomo_decode.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share their average rank
    assert lomo_decode.spearman([1, 1, 2, 3], [5, 5, 6, 7]) == pytest.approx(1.0)
    assert lomo_decode.spearman([1, 2], [1, 2]) is None  # too few pairs
    assert lomo_decode.spearman([1, 1, 1], [1, 2, 3]) is None  # no spread


def test_report_prints_both_models(capsys):
    row = {"held_out": "toy", "decode_fit": {"stream": [1.2, 1.0], "base": [1.0, 0.0]},
           "decode": {"points": 3, "torch_error": 0.05, "triton_error": 0.1, "rho_top": 0.5, "rho_all": None},
           "no decode": {"points": 3, "torch_error": 0.05, "triton_error": 0.3, "rho_top": -0.5, "rho_all": 0.1}}
    lomo_decode.print_report([row])
    out = capsys.readouterr().out
    assert "no decode" in out and "30.0%" in out and "-0.50" in out and "+0.50" in out
