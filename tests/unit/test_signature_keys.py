"""Census and database keys are checked against the GEMM family's key fields (issue 17):
N=abc, a missing K, N=0 are refused with the field named, not built (or crashed on) later."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedb import cli, database
from tunedb.census import read_census
from tunedb.errors import CensusError, CorruptDatabaseError, SignatureError
from tunedb.families.gemm.signatures import check_key
from tunedb.records import Signature

DATA = Path(__file__).resolve().parents[1] / "data" / "db"
GOOD = "gemm|op=gemm|dt=half|N=512|K=512"


def census_with(tmp_path: Path, sig: str) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": 1, "workload": "toy", "mode": "offline", "points": [
        {"signature": sig, "M": 16, "weight": 1.0, "calls": 4, "must_tune": True, "eager_share": 0.0}]}))
    return path


@pytest.mark.parametrize("sig, message", [
    ("gemm|op=gemm|dt=half|N=abc|K=512", "N='abc' must be a positive integer"),
    ("gemm|op=gemm|dt=half|N=512", "missing K; op=gemm needs N=<int>, K=<int>"),
    ("gemm|op=gemm|dt=half|N=0|K=512", "N=0 must be a positive integer"),
    ("gemm|op=gemm|dt=half|N=512|K=512|M=3", "unknown field(s) M"),
    ("gemm|op=gemm_act|dt=half|N=512|K=512|act=swish|bias=1", "act='swish' is not one of"),
    ("gemm|op=bmm|dt=half|N=64|K=64", "missing B"),
])
def test_a_census_with_a_bad_key_is_refused_naming_the_field(tmp_path, sig, message):
    with pytest.raises(CensusError) as err:
        read_census(census_with(tmp_path, sig))
    assert message in str(err.value) and "points[0]" in str(err.value)


def test_good_keys_pass(tmp_path):
    for sig in (GOOD, "gemm|op=gemm_act|dt=bf16|N=2048|K=512|act=gelu|bias=1", "gemm|op=bmm|dt=half|B=8|N=64|K=1500"):
        check_key(Signature.parse(sig))
    assert len(read_census(census_with(tmp_path, GOOD)).points) == 1


def test_build_of_a_census_with_n_abc_is_one_line_not_a_type_error(tmp_path, capsys):
    path = census_with(tmp_path, "gemm|op=gemm|dt=half|N=abc|K=512")
    assert cli.main(["build", "--census", str(path), "--out", str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "N='abc' must be a positive integer" in err


@pytest.mark.parametrize("key", ["gemm|op=gemm|dt=half|N=abc|K=256", "gemm|op=gemm|dt=half|N=0|K=256",
                                 "gemm|op=gemm|dt=half|N=512"])
def test_a_database_key_with_a_bad_field_makes_the_file_corrupt(tmp_path, key):
    raw = json.loads((DATA / "a.json").read_text())
    raw["entries"][key] = {"regions": [[None, "torch"]], "source": "build"}
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(CorruptDatabaseError, match="entry key: signature"):
        database.load(path)
    assert database.load_file("user", path, "gemm", "sm90").state == "corrupt"


def test_check_key_raises_signature_error():
    with pytest.raises(SignatureError):
        check_key(Signature.parse("gemm|op=gemm|dt=half|N=abc|K=512"))
