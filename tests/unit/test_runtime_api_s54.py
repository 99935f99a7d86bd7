"""The runtime API on misuse (session 54's probe): autotune's approximate=/measurer=/publisher= are
checked on entry, one tuner entered from several threads stays one context, a tuner that cannot
measure leaves an older cache file as it was, TUNEDB_USER_DB under a file is refused, and
confirm's errors name confirm."""
from __future__ import annotations

import json
import threading
import time
import warnings

import pytest

import tunedb
from tunedb import settings
from tunedb.errors import SettingsError
from tunedb.runtime import launch_table


def _measurer(family, sig, m, ids, incumbent):
    return []


@pytest.mark.parametrize("kw, named", [
    ({"approximate": "no"}, "approximate='no' must be True, False or None"),
    ({"measurer": 5}, "measurer=5 must be a callable"),
    ({"publisher": "user"}, "publisher='user' must be a callable"),
])
def test_autotune_names_a_bad_keyword_on_entry(kw, named, tiers_dirs):
    with pytest.raises(TypeError, match=named):
        tunedb.autotune(cache=None, **kw)


def test_one_tuner_entered_from_threads_at_once_stays_one_context(tiers_dirs):
    tuner = tunedb.autotune(cache=None, publish=False, measurer=_measurer, arch_family="sm90")
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        with tuner:
            assert launch_table._overrides  # every thread inside sees the tuner's override
            time.sleep(0.02)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tuner.__dict__.get("_depth") == 0 and not launch_table._overrides
    with tuner:  # and it still works afterwards
        assert len(launch_table._overrides) == 1
    with pytest.raises(RuntimeError, match="exited more times"):
        tuner.__exit__(None, None, None)


def test_a_tuner_that_cannot_measure_leaves_an_older_cache_file_as_it_was(tiers_dirs, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"version": 2, "env": {"arch_family": "sm90"}, "results": {
        "gemm|op=gemm|dt=bf16|N=512|K=256": {"104": {"config": "b64x64x64_w4_s3_g8", "ms": 0.01}}}}))
    before = path.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tunedb.autotune(cache=str(path)):
            pass
    assert path.read_bytes() == before


def test_a_user_tier_under_a_regular_file_is_refused(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SettingsError, match="lies under .*afile, which is a file, not a directory"):
        with settings.override(USER_DB=str(afile / "sub")):
            settings.check_all()


def test_confirms_errors_name_confirm():
    with pytest.raises(TypeError, match="^confirm needs a model"):
        tunedb.confirm(None, (1,), measurer=lambda sig, ms: (1.0, 1.0, [1.0, 1.0, 1.0]))


def test_autotune_is_a_decorator_too(tiers_dirs):
    tuner = tunedb.autotune(cache=None, publish=False, measurer=_measurer, arch_family="sm90")
    seen = []

    @tuner
    def step(x):
        seen.append(len(launch_table._overrides))
        return x + 1

    assert step(1) == 2 and step(2) == 3
    assert seen == [1, 1] and not launch_table._overrides


def test_without_a_gpu_a_refused_cache_names_no_side_file(tiers_dirs, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "tune.json"
    path.write_text("{ not json")
    with pytest.warns(Warning) as got:
        with tunedb.autotune(cache=str(path)):
            pass
    text = " ".join(str(w.message) for w in got)
    assert "nothing is measured on this machine, so nothing is written" in text and "go to" not in text
    assert path.read_text() == "{ not json" and not list(tmp_path.glob("tune.*.json"))
