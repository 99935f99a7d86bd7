"""Session 53's runtime probe: what the run-time API must do with odd input (each case was a
traceback, a stuck object or a silent wrong answer)."""
from __future__ import annotations

import json
import threading

import pytest

from tunedb.errors import CorruptDatabaseError
from tunedb.records import Signature
from tunedb.runtime.autotune_cache import AutotuneCache, CacheRefused

ENV = {"arch_family": "sm90", "sku": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "tunedb": "0.1.0"}


@pytest.mark.parametrize("key", ["gemm|op=gemm|dt=bf16|N=abc|K=256", "gemm|op=gemm|dt=bf16|N=-5|K=256"])
def test_an_autotune_cache_key_with_a_bad_field_is_refused_on_load(tmp_path, key):
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"version": 3, "env": ENV, "results": {key: {"104": {"100": {"config": "x", "ms": 1.0}}}}}))
    with pytest.raises(CacheRefused, match="N"):
        AutotuneCache(ENV).load_into(path)


def test_a_number_beyond_a_float_in_a_database_file_is_corrupt():
    from tunedb.database import schema

    with pytest.raises(CorruptDatabaseError, match="1e400 is beyond a float"):
        schema.loads('{"model": {"sentinel": {"torch": 1e400}}}', "db.json")
    assert schema.loads('{"x": 1.5e300}', "db.json") == {"x": 1.5e300}


def test_a_refused_autotune_enter_leaves_the_tuner_usable(tmp_path, monkeypatch):
    import tunedb
    from tunedb.runtime import autotuner

    tuner = tunedb.autotune(cache=str(tmp_path / "tune.json"), measurer=lambda *a, **k: [], publish=False)

    def refuse(path):
        raise OSError("read-only")

    monkeypatch.setattr(autotuner, "check_writable", refuse)
    with pytest.raises(OSError, match="read-only"), tuner:
        pass
    assert tuner.__dict__.get("_depth", 0) == 0
    monkeypatch.undo()
    with tuner:
        assert tuner._ctx is not None  # this time the override is installed
    assert tuner.__dict__.get("_depth", 0) == 0


@pytest.mark.parametrize("cache", ["", ".", "out/"])
def test_an_autotune_cache_that_names_no_file_is_refused(cache):
    import tunedb

    with pytest.raises(ValueError, match="names no file"):
        tunedb.autotune(cache=cache)


@pytest.mark.parametrize("arch", [5, "SM90", "hopper"])
def test_a_bad_arch_family_is_refused_when_autotune_is_called(arch):
    import tunedb

    with pytest.raises(ValueError, match="arch_family=.* must be None"):
        tunedb.autotune(cache=None, arch_family=arch)


def test_the_report_reads_the_served_decisions_while_another_thread_adds_to_them():
    from tunedb.runtime import serving

    sig = Signature.parse("gemm|op=gemm|dt=bf16|N=512|K=256")
    stop, errors = threading.Event(), []

    def add():  # sizes come and go (the dicts stay small, their size keeps changing)
        m = 0
        while not stop.is_set():
            m = m % 200 + 1
            key = ("gemm", sig, m)
            if serving._decisions.pop(key, 0) == 0:
                serving._decisions[key] = None
            if serving._fallbacks.pop(key, 0) == 0:
                serving._fallbacks[key] = (sig, "x", "why")

    t = threading.Thread(target=add)
    t.start()
    try:
        for _ in range(2000):
            try:
                serving.decisions("gemm")
                serving.fallbacks("gemm")
            except RuntimeError as exc:  # "dictionary changed size during iteration"
                errors.append(exc)
                break
    finally:
        stop.set()
        t.join()
        serving.forget_decisions()
    assert errors == []
