"""TUNEDB_* settings: read on access, validated, overridable; the user tier's location."""
import os
from pathlib import Path

import pytest

from tunedb import settings
from tunedb.errors import SettingsError


def test_user_db_off_disables_the_user_tier():
    with settings.override(USER_DB="off"):
        assert settings.user_db_dir() is None
    with settings.override(USER_DB="OFF"):
        assert settings.user_db_dir() is None


def test_user_db_moves_the_user_tier(tmp_path):
    with settings.override(USER_DB=str(tmp_path)):
        assert settings.user_db_dir() == tmp_path


def test_user_db_default_is_under_the_cache_root(tmp_path):
    with settings.override(USER_DB=None, CACHE_DIR=str(tmp_path)):
        assert settings.user_db_dir() == tmp_path / "v1"
    with settings.override(USER_DB=None, CACHE_DIR=None):
        assert settings.user_db_dir() == Path.home() / ".cache" / "tunedb" / "v1"


def test_settings_are_read_on_access_not_at_import():
    with settings.override(HEURISTIC="0"):
        assert settings.heuristic_enabled() is False
    with settings.override(HEURISTIC=None):
        assert settings.heuristic_enabled() is True
    with settings.override(MODEL_FALLBACK="0"):
        assert settings.model_fallback_enabled() is False
    with settings.override(MODEL_FALLBACK="auto"):
        assert settings.model_fallback_enabled() is True


def test_bad_value_names_the_variable_and_what_is_allowed():
    with settings.override(HEURISTIC="maybe"):
        with pytest.raises(SettingsError) as err:
            settings.heuristic_enabled()
    assert "TUNEDB_HEURISTIC" in str(err.value) and "'maybe'" in str(err.value)
    assert "0, 1" in str(err.value)


@pytest.mark.parametrize("value", ["\u00b2", "\u0663", "-1", "4.5"])
def test_a_count_that_is_not_ascii_digits_is_refused_by_name(value):
    # str.isdigit() accepts a superscript two, which int() then cannot read
    with settings.override(COMPILE_JOBS=value):
        with pytest.raises(SettingsError, match="TUNEDB_COMPILE_JOBS"):
            settings.compile_jobs()


def test_override_restores_previous_values():
    before = os.environ.get("TUNEDB_COMPILE_SET")
    with settings.override(COMPILE_SET="all"):
        assert settings.compile_set() == "all"
    assert os.environ.get("TUNEDB_COMPILE_SET") == before


def test_override_rejects_unknown_names():
    with pytest.raises(SettingsError, match="NOPE"):
        with settings.override(NOPE="1"):
            pass


def test_describe_lists_every_variable_with_its_value():
    with settings.override(USER_DB="/some/where"):
        rows = {name: value for name, value, _doc in settings.describe()}
    assert rows["TUNEDB_USER_DB"] == "/some/where"
    assert set(rows) == {s.name for s in settings.ALL}


def test_the_first_read_of_any_setting_checks_them_all():
    """TUNEDB_MODEL_FALLBACK=maybe used to pass for a workload whose shapes never asked the model."""
    with settings.override(MODEL_FALLBACK="maybe"):
        with pytest.raises(SettingsError, match="TUNEDB_MODEL_FALLBACK='maybe' is not allowed; use one of auto, 0, 1"):
            settings.heuristic_enabled()


def test_check_all_names_every_bad_variable():
    with settings.override(JIT_LAUNCH="true", COMPILE_SET="bogus"):
        with pytest.raises(SettingsError) as err:
            settings.check_all()
        assert set(settings.problems()) == {"TUNEDB_JIT_LAUNCH", "TUNEDB_COMPILE_SET"}
    assert "TUNEDB_JIT_LAUNCH='true'" in str(err.value) and "TUNEDB_COMPILE_SET='bogus'" in str(err.value)
    assert settings.problems() == {}


def test_path_settings_refuse_the_wrong_kind_of_path(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    with settings.override(USER_DB=str(afile)):
        with pytest.raises(SettingsError, match="TUNEDB_USER_DB=.* is not a directory"):
            settings.user_db_dir()
    with settings.override(CACHE_DIR=str(afile)):
        with pytest.raises(SettingsError, match="TUNEDB_CACHE_DIR=.* is not a directory"):
            settings.cache_root()
    with settings.override(CAPTURE=str(tmp_path)):
        with pytest.raises(SettingsError, match="TUNEDB_CAPTURE=.* is a directory"):
            settings.capture_path()
    with settings.override(USER_DB=str(tmp_path / "new"), CAPTURE=str(tmp_path / "rec.jsonl")):
        assert settings.user_db_dir() == tmp_path / "new"  # not existing yet is fine


def test_lenient_reads_what_status_reports():
    with settings.override(JIT_LAUNCH="true"), settings.lenient():
        assert settings.heuristic_enabled() is True


def test_capture_in_a_missing_directory_is_refused_when_read(tmp_path):
    # it was accepted, and on a GPU the first recorded call raised FileNotFoundError inside the
    # model's forward (census/capture.record_call opens the file then)
    with settings.override(CAPTURE=str(tmp_path / "no_such_dir" / "rec.jsonl")):
        with pytest.raises(SettingsError, match="TUNEDB_CAPTURE=.*no_such_dir.*not a directory"):
            settings.check_all()


def test_the_swap_decisions_never_swallow_a_bad_setting():
    """optimize()'s per-module questions (a family measured here? torch everywhere for this key?)
    caught every exception, so a bad TUNEDB_* value silently changed what was swapped."""
    import torch

    from tunedb.families.gemm import left_as_written
    from tunedb.runtime import patching, selector

    selector.reload()  # an earlier optimize() in this process memoised the arch and tiers (no setting read)
    with settings.override(MODEL_FALLBACK="maybe"):
        with pytest.raises(SettingsError, match="TUNEDB_MODEL_FALLBACK"):
            patching._measured("linalg")
        with pytest.raises(SettingsError, match="TUNEDB_MODEL_FALLBACK"):
            left_as_written.torch_everywhere(("gemm", torch.bfloat16, 512, 512, "none", False))


def test_a_number_setting_set_but_empty_reads_as_its_default():
    """TUNEDB_COMPILE_MEM_MB= (set, empty) passed the check and then failed int('') where the
    compile pool sized itself."""
    with settings.override(COMPILE_MEM_MB="", SIBLING_ROWS=""):
        settings.check_all()
        assert settings.compile_mem_mb() == 1024 and settings.sibling_rows() == 16


def test_a_command_prints_tunedbs_own_warnings_on_one_line(tmp_path, capsys):
    """A warning tunedb's code raises (a skipped log line) printed Python's file:line prefix and
    the source line before the command's error."""
    from tunedb import cli

    log = tmp_path / "existing.json"
    log.write_text('{"a": 1}\n')
    assert cli.main(["evaluate", "--log", str(log)]) != 0
    err = capsys.readouterr().err
    assert "tunedb warning: measurement log" in err and "log.py:" not in err and "return [" not in err


def test_path_settings_refuse_an_unknown_home_and_a_blank_value():
    for name in ("USER_DB", "CACHE_DIR", "CAPTURE"):
        with settings.override(**{name: "~no_such_user_tunedb/x"}):
            assert "whose home directory is unknown here" in settings.problems()[f"TUNEDB_{name}"]
        with settings.override(**{name: "   "}):
            assert "is blank" in settings.problems()[f"TUNEDB_{name}"]
    with settings.override(USER_DB="~no_such_user_tunedb/x"):
        with pytest.raises(SettingsError, match="TUNEDB_USER_DB='~no_such_user_tunedb/x' starts with"):
            settings.user_db_dir()
        with settings.lenient():  # what `tunedb status` reads: the value as written, no traceback
            assert str(settings.user_db_dir()) == "~no_such_user_tunedb/x"


def test_every_declared_setting_is_checked_listed_and_overridable():
    """A Setting left out of ALL is never checked up front, never shown by `tunedb status` and
    refused by override() (TUNEDB_EAGER_KERNEL_US was, for a while)."""
    from tunedb import settings

    declared = {v.name for v in vars(settings).values() if isinstance(v, settings.Setting)}
    assert declared == {s.name for s in settings.ALL}
    with settings.override(EAGER_KERNEL_US="0"):
        assert settings.eager_kernel_us() == 0
