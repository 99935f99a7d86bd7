"""Tier files: where they live, loading once per epoch, skipping bad files with one warning."""
import json
from pathlib import Path
import warnings

import pytest

from fake_family import tier_dirs_fixture, valid_raw
from tunedb import database, settings
from tunedb.database import tiers
from tunedb.errors import DatabaseWarning

tier_dirs = tier_dirs_fixture()


def test_tier_paths(tier_dirs):
    assert database.file_path("user", "sm90", "gemm") == tier_dirs.user / "sm90" / "gemm.json"
    assert database.file_path("system", "sm90", "gemm") == tier_dirs.system / "sm90" / "gemm.json"
    with settings.override(USER_DB="off"):
        assert database.file_path("user", "sm90", "gemm") is None


def test_shipped_system_tier_is_package_data():
    root = tiers.system_root()
    assert root.name == "db" and root.parent.name == "tunedb"


def test_user_then_system_order_and_missing_files(tier_dirs):
    tier_dirs.write("system", valid_raw())
    got = database.lookup("sm90", "fake")
    assert [r.tier for r in got] == ["system"]
    tier_dirs.write("user", valid_raw())
    assert [r.tier for r in database.lookup("sm90", "fake")] == ["system"]  # same epoch
    database.reload()
    assert [r.tier for r in database.lookup("sm90", "fake")] == ["user", "system"]
    assert tiers.get("user", "sm80", "fake").state == "missing"


def test_user_tier_off_is_not_read(tier_dirs):
    tier_dirs.write("user", valid_raw())
    with settings.override(USER_DB="off"):
        database.reload()
        assert database.lookup("sm90", "fake") == ()
        assert tiers.get("user", "sm90", "fake") is None


def test_each_file_is_read_once_per_epoch(tier_dirs, monkeypatch):
    tier_dirs.write("system", valid_raw())
    reads = []
    real = tiers.load_file
    monkeypatch.setattr(tiers, "load_file", lambda *a: reads.append(a[1]) or real(*a))
    database.reload()
    for _ in range(5):
        database.lookup("sm90", "fake")
    assert reads.count(tier_dirs.path("system")) == 1
    epoch = database.epoch()
    assert database.reload() == epoch + 1
    database.lookup("sm90", "fake")
    assert reads.count(tier_dirs.path("system")) == 2


@pytest.mark.parametrize("text, reason", [
    ('{"schema": 1, "kernel_', "not valid JSON"),
    (json.dumps(valid_raw(entries={"fake|op=mm|dt=half|N=128|K=64": {"regions": [[None, "nope"]]}})), "does not define"),
    (json.dumps(valid_raw(arch_family="sm80")), "arch_family is 'sm80', expected 'sm90'"),
    (json.dumps(valid_raw(kernel_family="gemm")), "kernel_family is 'gemm', expected 'fake'"),
    (json.dumps(valid_raw(schema=7)), "schema 7 is not supported"),
])
def test_bad_file_is_skipped_with_one_warning_naming_it(tier_dirs, text, reason):
    bad = tier_dirs.write("user", None, text=text)
    tier_dirs.write("system", valid_raw())
    database.reload()
    with pytest.warns(DatabaseWarning) as record:
        got = database.lookup("sm90", "fake")
        database.lookup("sm90", "fake")
    assert [r.tier for r in got] == ["system"]  # the other file still serves
    assert len(record) == 1
    message = str(record[0].message)
    assert str(bad) in message and reason in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        database.lookup("sm90", "fake")  # no second warning this epoch
    database.reload()
    with pytest.warns(DatabaseWarning):
        database.lookup("sm90", "fake")  # a new epoch warns again


def test_a_library_caller_gets_the_warning_once_and_a_handler_the_record(tier_dirs, tmp_path):
    """The skip is one DatabaseWarning (catchable, filterable) and a 'tunedb' log record for an
    application's handlers; with no handler configured, logging's last resort no longer prints
    the record as a second line (a fresh interpreter: pytest's own log handlers hide it here)."""
    import logging
    import os
    import subprocess
    import sys

    import tunedb

    bad = tier_dirs.write("user", None, family="gemm", text='{"schema": 1, "kernel_')
    database.reload()
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logging.getLogger("tunedb").addHandler(handler)
    try:
        with pytest.warns(DatabaseWarning, match="not valid JSON"):
            database.lookup("sm90", "gemm")
    finally:
        logging.getLogger("tunedb").removeHandler(handler)
    assert len(seen) == 1 and str(bad) in seen[0]
    src = str(Path(tunedb.__file__).resolve().parents[1])
    env = {**os.environ, "TUNEDB_USER_DB": str(tier_dirs.user), "TUNEDB_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "from tunedb import database; database.lookup('sm90', 'gemm')"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if str(bad) in line]
    assert len(lines) == 1 and "DatabaseWarning: tunedb: skipping user-tier database file" in lines[0], proc.stderr


def test_unreadable_path_is_skipped_not_raised(tier_dirs):
    path = tier_dirs.path("user")
    path.mkdir(parents=True)  # a directory where the file should be
    database.reload()
    with pytest.warns(DatabaseWarning, match="unreadable"):
        assert database.lookup("sm90", "fake") == ()


def test_discover_lists_every_arch_and_family(tier_dirs):
    tier_dirs.write("system", valid_raw())
    tier_dirs.write("system", valid_raw(arch_family="sm80"), arch="sm80")
    (tier_dirs.system / "sm90" / "fake.json.lock").write_text("")
    found = [(a, f) for a, f, _ in tiers.discover("system")]
    assert found == [("sm80", "fake"), ("sm90", "fake")]
    assert [(a, f) for a, f, _ in tiers.discover("system", "sm80")] == [("sm80", "fake")]
