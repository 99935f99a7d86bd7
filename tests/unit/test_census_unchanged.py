"""The census after the cold-path speed work is the census before it, point for point.

tests/data/census/*.json were written by the code before that work (commit 1f6e6ac, transformers
5.24.0 for the hf file) with censusfile.to_json. A change here means the census changed: if that
is intended, regenerate the file with the same call and say why in the commit.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tunedb import pipeline
from tunedb.census.censusfile import to_json

DATA = Path(__file__).resolve().parents[1] / "data" / "census"
HF = importlib.util.find_spec("transformers") is not None
HF_RECORDED = "5.24.0"  # the transformers version the hf file was taken with

CASES = {
    "whisper-base_offline_fused_mirror.json": ("whisper-base", dict(mode="offline", impl="mirror", fused=True)),
    "llama-3-8b_decode4_fused_mirror.json": ("llama-3-8b", dict(mode="decode", impl="mirror", fused=True, max_batch=4)),
}


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_mirror_census_equals_the_recorded_one(name):
    workload, kw = CASES[name]
    assert to_json(pipeline.take_census(workload, **kw)) == recorded(name)


def _hf_version_matches() -> bool:
    import transformers

    return transformers.__version__ == HF_RECORDED


@pytest.mark.skipif(not HF, reason="transformers not installed")
def test_the_hf_whisper_census_has_the_recorded_points_and_says_hf():
    # whisper-base's mirror has the library model's keys: the hf census is the recorded mirror
    # census but for its impl
    want = recorded("whisper-base_offline_fused_mirror.json")
    got = to_json(pipeline.take_census("whisper-base", mode="offline", impl="auto", fused=True))
    assert got["points"] == want["points"]
    assert got["meta"] == {**want["meta"], "impl": "hf"}


@pytest.mark.skipif(not HF, reason="transformers not installed")
def test_the_hf_llama_decode_census_equals_the_recorded_one():
    if not _hf_version_matches():
        pytest.skip(f"recorded with transformers {HF_RECORDED}")
    got = to_json(pipeline.take_census("llama-3-8b", mode="decode", impl="hf", fused=True, max_batch=4))
    assert got == recorded("llama-3-8b_decode4_fused_hf.json")


def _structure(model: torch.nn.Module) -> list[tuple[str, str, str]]:
    """(module path, class, act) of every submodule: what optimize() swapped and fused."""
    return [(name, type(m).__name__, str(getattr(m, "act", ""))) for name, m in model.named_modules()]


def _optimized(name: str, impl: str) -> torch.nn.Module:
    from tunedb.census.presets import workload
    from tunedb.census.probe import _optimized

    w = workload(name)
    built = w.build(torch.device("meta"), impl)
    out = _optimized(w, built.model)
    return getattr(out, "model", out)


@pytest.mark.parametrize("name, impl", [
    ("whisper-base", "mirror"), ("conformer", "mirror"), ("llama-3-8b", "mirror"),
    pytest.param("whisper-base", "hf", marks=pytest.mark.skipif(not HF, reason="transformers not installed")),
    pytest.param("llama-3-8b", "hf", marks=pytest.mark.skipif(not HF, reason="transformers not installed")),
])
def test_skipping_modules_without_a_linear_child_changes_no_fusion(name, impl, monkeypatch):
    # optimize() reads a module class's source only when the module holds an nn.Linear; reading
    # every class (as before) must give the same swaps and fusions
    from tunedb.families.gemm import fusion_plan

    fast = _structure(_optimized(name, impl))
    monkeypatch.setattr(fusion_plan, "_may_fuse", lambda children: True)
    assert _structure(_optimized(name, impl)) == fast
    assert any(kind == "TunedLinear" for _, kind, _ in fast)


def test_the_llama_mirror_census_names_the_library_models_points():
    # the speculative plan measures the mirror's census for the library model's: the same keys
    # (gate_proj fused with its SiLU module in both), sizes and calls
    mirror = recorded("llama-3-8b_decode4_fused_mirror.json")["points"]
    hf = recorded("llama-3-8b_decode4_fused_hf.json")["points"]
    assert sorted((p["signature"], p["M"], p["calls"]) for p in mirror) == sorted(
        (p["signature"], p["M"], p["calls"]) for p in hf)
