"""Audit (session 43): database files, the files commands take, and TUNEDB_* settings, fed bad
input as a user would. Each case: a clear error or one warning naming the file or the variable,
never a traceback from deep inside, and a corrupt file's bytes left as they were."""
import json
import os

import pytest

from tunedb import cli, database, settings
from tunedb.errors import CorruptDatabaseError, DatabaseWarning, SettingsError

SIG = "gemm|op=gemm|dt=half|N=512|K=256"
HUGE = 10 ** 400  # valid JSON; no float holds it


def _gemm_raw(evidence=None, model=None):
    entry = {"regions": [[None, "torch"]], "source": "build"}
    if evidence is not None:
        entry["evidence"] = evidence
    raw = {"schema": 1, "kernel_family": "gemm", "arch_family": "sm90", "validators": {},
           "configs": {}, "entries": {SIG: entry}}
    if model is not None:
        raw["model"] = model
    return raw


def _write(path, raw_or_text):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = raw_or_text if isinstance(raw_or_text, str) else json.dumps(raw_or_text)
    path.write_text(text, encoding="utf-8")
    return path


# --- 1. a huge integer in a user-tier file ------------------------------------------------------


def test_a_huge_integer_in_evidence_is_skipped_with_a_warning_not_a_crash(tiers_dirs):
    from tunedb.records import Entry, Region, Signature
    from tunedb.runtime import selector

    bad = _write(tiers_dirs / "sm90" / "gemm.json", _gemm_raw({"M=64": {"torch": [HUGE, 0.0, 3]}}))
    before = bad.read_bytes()
    database.reload()
    with pytest.warns(DatabaseWarning) as record:
        assert database.lookup("sm90", "gemm") == ()  # was: OverflowError out of the lookup
        res = selector.resolve("gemm", Signature.parse(SIG), 64)  # selection still answers
    assert res.tier != "user"
    message = " ".join(str(r.message) for r in record)
    assert str(bad) in message and "too large" in message
    # a later write to the same tier refuses to merge into it and leaves its bytes alone
    entry = Entry(Signature.parse(SIG), (Region(None, "torch"),), {}, "build", {}, ())
    with pytest.raises(CorruptDatabaseError, match="too large"):
        database.write_entries("user", "gemm", "sm90", [entry])
    assert bad.read_bytes() == before


def test_a_huge_integer_anywhere_is_a_corrupt_file_naming_it(tmp_path):
    for where, raw in {"model": _gemm_raw(model={"schema": 1, "scale": HUGE}),
                       "m_hi": {**_gemm_raw(), "entries": {SIG: {"regions": [[HUGE, "torch"]]}}}}.items():
        path = _write(tmp_path / f"{where}.json", raw)
        with pytest.raises(CorruptDatabaseError, match="too large") as info:
            database.load(path)
        assert str(path) in str(info.value)


def test_diff_of_a_file_with_a_huge_model_number_is_a_clear_error(tmp_path, capsys):
    a = _write(tmp_path / "a.json", _gemm_raw(model={"schema": 1, "scale": 1.0}))
    b = _write(tmp_path / "b.json", _gemm_raw(model={"schema": 1, "scale": HUGE}))
    assert cli.main(["diff", str(a), str(b)]) == 2  # was: OverflowError traceback
    err = capsys.readouterr().err
    assert str(b) in err and "Traceback" not in err


# --- 3. prebuild's input files ------------------------------------------------------------------


@pytest.mark.parametrize("text, why", [
    ('{"schema": 1, "kernel_family": "gemm", "arch_family": "sm90", "configs": [1]}', "'configs' must be an object"),
    ('{"schema": 1, "kernel_family": "gemm", "arch_family": "sm90", "entries": [1]}', "'entries' must be an object"),
    ('{"schema": 1, "kernel_family": "gemm", "arch_family": "sm90", "entries": {"%s": {"regions": 5}}}' % SIG,
     "'regions' must be a non-empty list"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ('{"schema": 1, "kernel_family": "linalg", "arch_family": "sm90"}', "kernel_family is 'linalg', expected 'gemm'"),
], ids=["configs-list", "entries-list", "regions-int", "deep", "linalg-file"])
def test_prebuild_referenced_refuses_a_file_that_is_no_gemm_database(tmp_path, capsys, text, why):
    path = _write(tmp_path / "ref.json", text)
    rc = cli.main(["prebuild", "--dry-run", "--referenced", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err  # was: AttributeError / TypeError / RecursionError traceback, or silence
    assert str(path) in err and why in err and "Traceback" not in err


def test_prebuild_census_with_an_over_long_integer_is_a_clear_error(tmp_path, capsys):
    path = _write(tmp_path / "census.json", '{"schema": 1, "n": ' + "9" * 5000 + "}")
    rc = cli.main(["prebuild", "--dry-run", "--census", str(path)])
    err = capsys.readouterr().err
    assert rc == 2, err  # was: ValueError traceback from the JSON reader
    assert str(path) in err and "Traceback" not in err


# --- 2. settings --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["TUNEDB_USER_DB", "TUNEDB_CACHE_DIR", "TUNEDB_CAPTURE"])
def test_a_path_setting_too_long_for_the_file_system_is_a_settings_error(tmp_path, monkeypatch, name):
    value = str(tmp_path / ("a" * 300))
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:  # was: OSError (File name too long)
        settings.check_all()
    assert f"{name}=" in str(info.value) and "a" * 300 in str(info.value)


@pytest.mark.parametrize("value", ["100000", "99999999999999999999999"])
def test_a_compile_job_count_no_machine_runs_is_refused(monkeypatch, value):
    # was accepted: the pool's prestart submits one no-op per job (range(10**23): never ends)
    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", value)
    with pytest.raises(SettingsError, match=f"TUNEDB_COMPILE_JOBS='{value}' is not a whole number from 0 to"):
        settings.compile_jobs()


def test_a_reasonable_compile_job_count_still_reads(monkeypatch):
    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", "64")
    assert settings.compile_jobs() == 64
    assert os.environ["TUNEDB_COMPILE_JOBS"] == "64"


def test_a_control_character_in_a_database_file_is_named_once_with_its_line():
    from tunedb.database import schema

    with pytest.raises(CorruptDatabaseError) as err:
        schema.loads('{"a": "x\ty"}', "bad.json")
    assert "Invalid control character at line 1" in str(err.value) and "at at" not in str(err.value)
