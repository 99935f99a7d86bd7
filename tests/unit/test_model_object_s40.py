"""A database file's cost-model object that cannot calibrate the model: every bad field is named,
and a user file's bad object is skipped with a warning, never hiding the shipped tier's."""
from __future__ import annotations

import math

import pytest

from tunedb import database
from tunedb.errors import ConfigError, DatabaseWarning
from tunedb.families.gemm.model_params import ModelParams
from tunedb.records import Entry, Region, Signature
from tunedb.runtime import selector


@pytest.mark.parametrize("field, value, words", [
    ("scale", -1e9, "scale must be a finite number > 0, got -1000000000.0"),
    ("scale", "big", "scale must be a finite number > 0, got 'big'"),
    ("torch_margin", math.nan, "torch_margin must be a finite number >= 0, got nan"),
    ("l2_bw_factor", 0, "l2_bw_factor must be a finite number > 0"),
    ("lane_eff", {"triton_mma": -0.5}, "lane_eff['triton_mma'] must be a finite number > 0"),
    ("lane_eff", [], None),  # empty: the defaults
    ("lane_eff", [1, 2], "lane_eff must be an object"),
    ("fitted_on", True, "fitted_on must be a finite number >= 0, got True"),
])
def test_each_bad_field_is_named(field, value, words):
    raw = {**ModelParams().to_json(), field: value}
    if words is None:
        assert ModelParams.from_json(raw).lane_eff == ModelParams().lane_eff
        return
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("(", r"\(")):
        ModelParams.from_json(raw)


def _write(tier: str, model: dict) -> None:
    entry = Entry(Signature.parse("gemm|op=gemm|dt=bf16|N=64|K=32"), (Region(None, "torch"),))
    database.write_entries(tier, "gemm", "sm90", [entry], [], model=model)
    selector.reload()


def test_a_bad_user_object_is_skipped_with_a_warning_and_the_shipped_one_calibrates(tiers_dirs):
    shipped = {**ModelParams(scale=1.25).to_json()}
    _write("system", shipped)
    _write("user", {**shipped, "scale": -1e9})
    with pytest.warns(DatabaseWarning, match=r"skipping .*gemm.json's cost-model object \(cost-model scale must be"):
        got = selector.model_params("gemm")
    assert got["scale"] == 1.25
    _write("user", {**shipped, "scale": 2.0})  # a good user object still comes first
    assert selector.model_params("gemm")["scale"] == 2.0
