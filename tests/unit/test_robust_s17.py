"""Session 17's robustness fixes on the CPU: settings the serving path honours, bad inputs named,
shapes a hashed launch cannot take, and models nobody gave us (each test fails before its fix)."""
from __future__ import annotations

import pytest
import torch

import tunedb
from tunedb import settings
from tunedb.database import tiers


def test_recommend_honours_model_fallback_off_as_the_serving_path_does(tmp_path):
    # the selector's default tier turns the linalg heuristic off under TUNEDB_MODEL_FALLBACK=0
    # (runtime/untuned.answer) and serves the library arm; recommend() still said the heuristic
    from tunedb import arch, families
    from tunedb.runtime import untuned

    fam = families.get("linalg")
    with tiers.system_root_override(tmp_path):
        guessed = tunedb.recommend("posv", "fp64", 16, 4096)
        with settings.override(MODEL_FALLBACK="0"):
            off = tunedb.recommend("posv", "fp64", 16, 4096)
            served = untuned.answer(fam, fam.make_signature("posv", "fp64", 16),
                                    arch.shipped_profile("sm90"), 4096)
    assert guessed.source == "heuristic" and guessed.arm != "torch"
    assert off.arm == "torch" and off.packing == "library" and off.source == "fallback"
    assert "TUNEDB_MODEL_FALLBACK=0" in off.reason
    assert served.id == "torch"  # the serving path's answer, which the plan now states


def test_recommend_still_reads_a_measured_entry_with_model_fallback_off():
    # the setting turns guesses off, not measurements: the shipped sm90 table keeps serving
    with settings.override(MODEL_FALLBACK="0"):
        got = tunedb.recommend("potrf", "fp32", 8, 2048)
    assert got.source == "measured"
