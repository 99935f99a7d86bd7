"""store.write_atomic, what every file tunedb writes goes through: a symlinked target is written
through its link (the link stays), a device target (/dev/null) is written through and stays a
device (it was replaced by a regular file as root), and an existing file keeps its mode."""
from __future__ import annotations

import os
import stat

from tunedb.database.store import write_atomic


def test_a_symlink_is_followed_and_kept(tmp_path):
    real = tmp_path / "real" / "gemm.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "gemm.json"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_an_existing_files_mode_is_kept(tmp_path):
    target = tmp_path / "census.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and stat.S_IMODE(os.stat(target).st_mode) == 0o600
    fresh = tmp_path / "fresh.json"
    write_atomic(fresh, "x")
    assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o644


def test_dev_null_stays_a_device():
    before = os.stat(os.devnull)
    assert stat.S_ISCHR(before.st_mode)
    write_atomic(os.devnull, "discarded")
    after = os.stat(os.devnull)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_a_lone_surrogate_escape_makes_a_file_corrupt_and_a_pair_is_text():
    import pytest

    from tunedb.database import schema
    from tunedb.errors import CorruptDatabaseError

    with pytest.raises(CorruptDatabaseError, match="lone UTF-16 surrogate"):
        schema.loads('{"validators": {"triton": "3.6\\ud800"}}', "gemm.json")
    assert schema.loads('{"note": "\\ud83d\\ude00"}') == {"note": "\U0001F600"}
