"""The product mode's eager kernel line (families/bmm/eager_line.py, serving.serve): a tiled
product whose torch kernel is predicted short runs as the model wrote it outside a capture and
counts as a candidate (the short back-off); inside a capture the tile serves."""
from __future__ import annotations

import types

import pytest
import torch

from tunedb import settings
from tunedb.arch import shipped_profile
from tunedb.families.bmm import eager_line, ops, serving
from tunedb.runtime import selector


@pytest.fixture
def sm90(monkeypatch):
    profile = shipped_profile("sm90")
    monkeypatch.setattr(selector, "current_arch", lambda: ("sm90", profile))
    return profile


def test_a_short_product_is_below_the_line_and_a_long_one_is_not(sm90):
    small = (torch.empty(12, 50, 48, dtype=torch.bfloat16), torch.empty(12, 48, 50, dtype=torch.bfloat16))
    big = (torch.empty(32, 4096, 128, dtype=torch.bfloat16), torch.empty(32, 128, 4096, dtype=torch.bfloat16))
    assert eager_line.short_eagerly(*small)
    assert not eager_line.short_eagerly(*big)  # 137 GFLOP: milliseconds' worth at any H100's peak
    with settings.override(EAGER_KERNEL_US="0"):
        assert not eager_line.short_eagerly(*small)
    with settings.override(EAGER_FALLBACK="0"):
        assert not eager_line.short_eagerly(*small)


def test_no_arch_profile_means_no_product_yields(monkeypatch):
    monkeypatch.setattr(selector, "current_arch", lambda: ("sm90", None))
    assert not eager_line.short_eagerly(torch.empty(2, 4, 4), torch.empty(2, 4, 4))


@pytest.mark.parametrize("short", [True, False])
def test_serve_yields_a_short_tiled_product_eagerly_and_serves_it_in_a_capture(monkeypatch, short):
    capturing = {"on": False}
    tile = types.SimpleNamespace(config=types.SimpleNamespace(id="tile"), signature=None)
    monkeypatch.setattr(serving, "eligible", lambda a, b: True)
    monkeypatch.setattr(serving, "_capturing", lambda: capturing["on"])
    monkeypatch.setattr(ops, "bound_for", lambda a, b: tile)
    monkeypatch.setattr(ops, "serves_torch", lambda bound: False)
    monkeypatch.setattr(ops, "bmm", lambda a, b: torch.bmm(a, b) + 1)  # the tile, told apart
    monkeypatch.setattr(eager_line, "short_eagerly", lambda a, b: short)
    serving._clear()
    a, b = torch.randn(3, 5, 4), torch.randn(3, 4, 6)
    before = (getattr(serving._state, "candidates", 0), getattr(serving._state, "served", 0))
    for _ in range(2):  # the decision, then the cached one
        got = serving.serve(a, b)
        if short:
            assert got is None  # the model's own torch.matmul runs
        else:
            torch.testing.assert_close(got, torch.bmm(a, b) + 1)
    after = (getattr(serving._state, "candidates", 0), getattr(serving._state, "served", 0))
    assert (after[0] - before[0], after[1] - before[1]) == ((2, 0) if short else (0, 2))
    capturing["on"] = True
    torch.testing.assert_close(serving.serve(a, b), torch.bmm(a, b) + 1)  # a capture: the tile
    serving._clear()
