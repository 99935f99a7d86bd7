"""TUNEDB_CENSUS_BESIDE=1: a preset's census taken in a child process is the census the parent
would take, read from the census cache; a child that fails or is late leaves the parent to take it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tunedb import pipeline, settings
from tunedb.census import beside, cache
from tunedb.census.censusfile import to_json

KW = dict(mode="offline", max_batch=2, chunk=None, manifest=None, capture=None, impl="mirror", fused=True,
          cached=True)


@pytest.fixture
def on(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), CENSUS_BESIDE="1"):
        yield


def test_the_child_census_is_read_from_the_cache_and_equals_the_parents_own(on):
    child = beside.start("whisper-base", KW)
    assert child is not None
    try:
        assert child.wait(limit_s=300)
    finally:
        child.close()
    key_kw = {k: KW[k] for k in ("mode", "max_batch", "chunk", "manifest", "impl", "fused")}
    assert cache.hit("whisper-base", **key_kw)
    from_child = pipeline.take_census("whisper-base", **KW)
    own = pipeline.take_census("whisper-base", **{**KW, "cached": False})
    assert to_json(from_child) == to_json(own)
    assert beside.start("whisper-base", KW) is None  # cached now: no child


def test_no_child_unless_on_cached_and_an_uncached_preset(tmp_path, on):
    with settings.override(CENSUS_BESIDE="0"):
        assert not beside.wanted("whisper-base", KW)
    assert not beside.wanted("whisper-base", {**KW, "cached": False})
    assert not beside.wanted("tests.unit.fake_family:nothing", KW)  # a user's callable is never cached
    assert beside.wanted("whisper-base", KW)


def _beside(args: list[str]) -> beside.Beside:
    proc = subprocess.Popen([sys.executable, "-c", *args])
    return beside.Beside(proc, "whisper-base", {})


def test_a_failed_child_says_so_and_the_parent_takes_the_census():
    assert not _beside(["import sys; sys.exit(3)"]).wait()


def test_a_late_child_is_stopped_at_the_limit():
    child = _beside(["import time; time.sleep(60)"])
    assert not child.wait(limit_s=0.5)
    assert child.proc.poll() is not None and child.waited < 30


def test_tune_with_the_child_prints_what_it_prints_without(tmp_path, capsys, monkeypatch):
    from tunedb import cli
    from tunedb.build import steps

    monkeypatch.setenv("COLUMNS", "300")
    # the child starts only where a GPU is likely: say one is, and start no measuring worker
    monkeypatch.setattr(steps, "gpu_likely", lambda: True)
    monkeypatch.setattr(steps, "start_worker", lambda opts, gpu: None)
    started = []
    real_start = beside.start
    monkeypatch.setattr(beside, "start", lambda *a: started.append(real_start(*a)) or started[-1])
    outs = []
    for flag in ("0", "1"):
        with settings.override(CACHE_DIR=str(tmp_path / flag / "cache"), USER_DB=str(tmp_path / flag / "user"),
                               CENSUS_BESIDE=flag):
            rc = cli.main(["tune", "whisper-base", "--impl", "mirror", "--max-batch-size", "2"])
            assert rc in (0, None)
            outs.append(capsys.readouterr().out)
            key_kw = dict(mode="offline", max_batch=2, chunk=None, manifest=None, impl="mirror", fused=True)
            assert cache.hit("whisper-base", **key_kw)
    assert outs[0] == outs[1] and "census of whisper-base" in outs[0]
    assert started[0] is None and started[1] is not None and started[1].proc.returncode == 0


def test_no_child_where_no_gpu_is_likely(tmp_path, monkeypatch, capsys):
    from tunedb import cli
    from tunedb.build import steps

    monkeypatch.setattr(steps, "gpu_likely", lambda: False)
    monkeypatch.setattr(beside, "start", lambda *a: pytest.fail("a child started without a GPU"))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user"), CENSUS_BESIDE="1"):
        assert cli.main(["tune", "whisper-base", "--impl", "mirror", "--max-batch-size", "2"]) in (0, None)


def test_the_child_finds_this_tunedb_without_reordering_the_path(monkeypatch):
    import os
    from pathlib import Path

    root = os.path.realpath(Path(beside.__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", root]))
    assert beside._child_env()["PYTHONPATH"] == os.pathsep.join(["/elsewhere", root])
    import site

    # appended (last) only when site-packages does not hold it either (an installed tunedb)
    installed = root in {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    want = ["/elsewhere"] if installed else ["/elsewhere", root]
    assert beside._child_env()["PYTHONPATH"].split(os.pathsep) == want
