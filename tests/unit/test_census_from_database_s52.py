"""A database file given where a census goes (`tunedb build --census`, `tunedb prebuild --census`):
its entries at the sizes they were measured at, so a shipped table can be re-measured."""
import json
import re
from pathlib import Path

import pytest

from tunedb.census import read_census
from tunedb.cli import main
from tunedb.errors import CensusError

SHIPPED = Path(__file__).parents[2] / "src" / "tunedb" / "db" / "sm90"
SIG = "gemm|op=gemm|dt=half|N=512|K=512"


def _db(tmp_path, entries, family="gemm"):
    path = tmp_path / "db.json"
    path.write_text(json.dumps({"schema": 1, "kernel_family": family, "arch_family": "sm90",
                                "configs": {}, "entries": entries}))
    return path


def test_a_database_reads_as_its_measured_points(tmp_path):
    path = _db(tmp_path, {SIG: {"regions": [[64, "torch"], [None, "torch"]],
                                "evidence": {"M=16": {}, "M=1024": {}, "_l2": "cold"}},
                          "gemm|op=gemm|dt=half|N=1024|K=512": {"regions": [[64, "torch"], [None, "torch"]]}})
    shapes = read_census(path)
    got = {(p.signature.format(), p.m) for p in shapes.points}
    assert got == {(SIG, 16), (SIG, 1024), ("gemm|op=gemm|dt=half|N=1024|K=512", 64)}
    assert all(p.must_tune for p in shapes.points)


def test_a_database_key_that_is_not_a_signature_is_named(tmp_path):
    path = _db(tmp_path, {"gemm|op=gemm|dt=half|N=abc|K=512": {"regions": [[None, "torch"]]}})
    with pytest.raises(CensusError, match="N=abc"):
        read_census(path)


def test_build_dry_run_plans_the_shipped_gemm_table(capsys):
    assert main(["build", "--census", str(SHIPPED / "gemm.json"), "--dry-run", "--out", "unused"]) == 0
    assert "signature(s)" in capsys.readouterr().out


def test_build_of_another_familys_table_names_the_family_to_pass(capsys):
    assert main(["build", "--census", str(SHIPPED / "bmm.json"), "--dry-run", "--out", "unused"]) == 2
    assert "pass --family bmm" in capsys.readouterr().err


def test_prebuild_dry_run_takes_a_database_file(capsys):
    assert main(["prebuild", "--census", str(SHIPPED / "gemm.json"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    n = len(json.loads((SHIPPED / "gemm.json").read_text())["entries"])
    assert f"{n} signatures from" in out and "nothing was compiled" in out


@pytest.mark.parametrize("key, says", [
    ("bmm|op=bmm|dt=half|N=4|K=4|lay=nn", "missing field 'B'"),
    ("bmm|op=bmm|dt=half|B=0|N=4|K=4|lay=nn", "B=0 must be a positive integer"),
    ("bmm|op=bmm|dt=half|B=2|N=4|K=4|lay=xx", "lay='xx'; allowed: nn, nt, tn, tt"),
    ("gemm_log_softmax|op=gemm_log_softmax|dt=bf16|N=5000|K=256|bias=2", "bias=2; allowed: 0, 1"),
    ("linalg|op=potrf|dt=fp32|n=8|extra=1", "unknown field 'extra'"),
    ("scaled_mm_fp8|op=scaled_mm|dt=fp8|N=4096|K=4096|out=bf16|scale=row", "fields must come in the order"),
])
def test_every_familys_census_key_is_checked_when_read(tmp_path, key, says):
    # families without a check_key hook of their own are checked against their schema's fields
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": 1, "workload": "w", "mode": "", "points": [
        {"signature": key, "M": 64, "weight": 1, "calls": 1, "must_tune": True, "eager_share": 0}]}))
    with pytest.raises(CensusError, match=re.escape(says)):
        read_census(path)


def test_a_census_keeps_calls_in_dtypes_a_family_leaves_to_torch(tmp_path):
    # the recorder files every call; whether its dtype is served is the build's question
    path = tmp_path / "c.json"
    key = "bmm|op=bmm|dt=fp64|B=2|N=4|K=4|lay=nn"
    path.write_text(json.dumps({"schema": 1, "workload": "w", "mode": "", "points": [
        {"signature": key, "M": 64, "weight": 1, "calls": 1, "must_tune": True, "eager_share": 0}]}))
    assert [p.signature.format() for p in read_census(path).points] == [key]


def test_an_empty_eager_kernel_us_is_its_default(monkeypatch):
    # every numeric setting reads an empty value as its default; this one read it as 0 (rule off)
    from tunedb import settings

    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "")
    assert settings.eager_kernel_us() == int(settings.EAGER_KERNEL_US.default) > 0
    monkeypatch.setenv("TUNEDB_EAGER_KERNEL_US", "0")
    assert settings.eager_kernel_us() == 0


def test_a_census_whose_batch_rows_pass_m_max_is_refused_before_any_forward(tmp_path):
    from tunedb.census import presets, probe

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"tokens": 1 << 24}) + "\n" for _ in range(300)))
    w = presets.PRESETS["llama-3-8b"]
    with pytest.raises(CensusError, match=r"256 x 16777216 tokens is 4294967296 rows.*--max-batch-size"):
        probe.traffic(w, "offline", 256, None, manifest)
    assert probe.traffic(w, "offline", 64, None, manifest)  # 64 x 2^24 = 2^30 rows: a census point
