"""Session 41 CLI audit: a new user's own model (module:callable) through `tunedb tune` / `census`.

- A bf16 Linear called on no rows (an empty slice) made the fused census (what `tunedb tune`
  takes) build a Point of M=0: the command stopped with a ValueError traceback (census/probe.py).
- An fp32 Linear run under torch.autocast in forward vanished from the fused census on meta: the
  tuned op went through the dispatcher into the recorder's own handler, where its F.linear ran
  unseen; the plan silently lost a signature and every weight moved (families/gemm/ops_autocast.py).
- A file path as the workload (mymodel.py:make) failed in importlib with a message that did not
  say what to give instead (census/presets.py).
"""
from __future__ import annotations

import pytest

from tunedb import cli, pipeline
from tunedb.build import steps as buildsteps
from tunedb.census.presets import workload
from tunedb.census.probe import take_census

MODELS = "audit_cli_models_s41"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setattr(buildsteps, "gpu_likely", lambda: False)
    monkeypatch.setenv("COLUMNS", "160")


def _sigs(census):
    return {p.signature.format(): sum(q.calls for q in census.points if q.signature == p.signature)
            for p in census.points}


def test_tune_of_a_model_with_an_empty_linear_call_prints_the_plan(no_gpu, capsys):
    assert cli.main(["tune", f"{MODELS}:empty_rows", "--max-batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "over 1 signature(s)" in out  # proj; side runs on no rows, which launches nothing
    assert "No GPU: nothing was measured." in out


def test_fused_census_skips_calls_on_no_rows():
    census = take_census(workload(f"{MODELS}:empty_rows"), "offline", 2, fused=True)
    assert all(p.m >= 1 for p in census.points)
    assert {s.split("|")[3:5] == ["N=48", "K=64"] for s in _sigs(census)} == {True}


def test_fused_census_keeps_the_fp32_gemm_run_under_autocast():
    w = workload(f"{MODELS}:autocast_body")
    aten = _sigs(take_census(w, "offline", 2, fused=False))
    fused = _sigs(take_census(w, "offline", 2, fused=True))
    fp32 = "gemm|op=gemm|dt=fp32|N=96|K=64"
    assert fp32 in aten
    # as docs/census.md says: an fp32 GEMM has the same op=gemm points with and without --fused
    assert fused.get(fp32) == aten[fp32]
    assert sum(fused.values()) == sum(aten.values())


@pytest.mark.parametrize("spec", ["mymodel.py:make", "./mymodel:make", "/tmp/models/mymodel.py:make"])
def test_a_file_path_workload_names_the_module_form(no_gpu, capsys, spec):
    assert cli.main(["tune", spec]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "names a file; give its module: mymodel:make" in err
