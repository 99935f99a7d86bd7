"""Session 53's command-line probe: what a refused or odd command must not do (lose a file, run
minutes of work before refusing an option it could check first, ignore an option silently)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedb import cli, settings

DATA = Path(__file__).resolve().parents[1] / "data" / "db"


def one_line_error(capsys, argv, rc=2) -> str:
    assert cli.main(list(argv)) == rc
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def home(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


@pytest.mark.parametrize("held,words", [
    ('{"kernel_family": "gemm", "entries": {}}', "a tuning database (kernel_family 'gemm')"),
    ('{"duration": 3.2}\n{"duration": 1.0}\n', "something that is not JSON"),
    ('[1, 2]', "JSON that is not a census"),
])
def test_census_never_overwrites_a_file_that_is_not_a_census(capsys, home, held, words):
    out = home / "gemm.json"
    out.write_text(held)
    line = one_line_error(capsys, ["census", "whisper-base", "--out", str(out)])
    assert f"--out {out} exists and holds {words}" in line
    assert out.read_text() == held


def test_census_refuses_its_own_manifest_as_out_and_overwrites_a_census(capsys, home):
    manifest = home / "traffic.jsonl"
    manifest.write_text('{"duration": 3.2}\n')
    line = one_line_error(capsys, ["census", "whisper-base", "--manifest", str(manifest), "--out", str(manifest)])
    assert "is this run's --manifest input" in line and manifest.read_text() == '{"duration": 3.2}\n'
    out = home / "census.json"
    assert cli.main(["census", "whisper-base", "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert cli.main(["census", "whisper-base", "--max-batch-size", "4", "--out", str(out)]) == 0  # a census: replaced
    assert json.loads(out.read_text()) != first
