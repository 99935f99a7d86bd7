"""The autotune cache file: versions 1-3, bucketed at-or-above lookup, validators, atomic save."""
from __future__ import annotations

import json

import pytest

from tunedb.buckets import bucket_of
from tunedb.errors import AutotuneWarning
from tunedb.records import Signature
from tunedb.runtime.autotune_cache import AutotuneCache, CacheRefused

SIG = Signature.parse("gemm|op=gemm|dt=bf16|N=512|K=256")
ENV = {"arch_family": "sm90", "sku": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
       "tunedb": "0.1.0"}


def _write(tmp_path, data, name="tune.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_lookup_takes_the_closest_measured_size_at_or_above_within_the_bucket():
    cache = AutotuneCache(ENV)
    assert bucket_of(100) == bucket_of(104) == 104
    cache.record(SIG, 100, "small", 0.01)
    cache.record(SIG, 97, "smaller", 0.01)
    assert cache.lookup(SIG, 97).config_id == "smaller"
    assert cache.lookup(SIG, 98).config_id == "small"
    assert cache.lookup(SIG, 100).config_id == "small"
    assert cache.lookup(SIG, 101) is None  # larger size in the same bucket: a miss
    assert cache.lookup(SIG, 90) is None  # another bucket (bucket 96): a miss
    assert cache.lookup(SIG.with_dt("fp16"), 100) is None  # the dtype is part of the key


def test_version3_round_trips_with_measured_sizes(tmp_path):
    cache = AutotuneCache(ENV)
    cache.record(SIG, 100, "b64x64x64_w4_s3_g8", 0.0123)
    cache.record(SIG, 3000, "torch", 0.5)
    assert cache.dirty
    path = cache.save(tmp_path / "sub" / "tune.json")
    assert not cache.dirty
    data = json.loads(path.read_text())
    assert data["version"] == 3 and data["env"] == ENV
    assert data["results"][SIG.format()]["104"]["100"] == {"config": "b64x64x64_w4_s3_g8", "ms": 0.0123}
    assert not list(path.parent.glob(".tune.json.*"))  # no temp file left behind
    again = AutotuneCache(ENV)
    again.load_into(path)
    assert not again.dirty
    assert sorted((r.m, r.config_id) for r in again.results()) == [(100, "b64x64x64_w4_s3_g8"),
                                                                   (3000, "torch")]
    assert again.lookup(SIG, 2049).config_id == "torch"
    assert again.lookup(SIG, 3001) is None


def test_version2_entry_has_no_measured_size_and_serves_its_whole_bucket(tmp_path):
    path = _write(tmp_path, {"version": 2, "env": {"arch_family": "sm90"},
                             "results": {SIG.format(): {"104": {"config": "v2cfg", "ms": 0.02}}}})
    cache = AutotuneCache(ENV)
    cache.load_into(path)
    for m in (97, 100, 104):
        assert cache.lookup(SIG, m).config_id == "v2cfg"
    assert cache.lookup(SIG, 105) is None
    assert cache.dirty  # an old version is rewritten as version 3 at exit
    cache.record(SIG, 99, "measured", 0.01)  # a measured result wins at or below its size
    assert cache.lookup(SIG, 98).config_id == "measured"
    assert cache.lookup(SIG, 101).config_id == "v2cfg"
    saved = json.loads(cache.save(tmp_path / "v3.json").read_text())
    assert saved["results"][SIG.format()]["104"]["bucket"]["config"] == "v2cfg"
    reread = AutotuneCache(ENV)
    reread.load_into(tmp_path / "v3.json")
    assert reread.lookup(SIG, 104).config_id == "v2cfg"


def test_version1_exact_shapes_become_measured_results(tmp_path):
    path = _write(tmp_path, {"version": 1, "results": {SIG.format(): {"100": "v1cfg", "3000": "torch"}}})
    cache = AutotuneCache(ENV)
    with pytest.warns(AutotuneWarning, match="records no arch family"):
        cache.load_into(path)
    assert cache.lookup(SIG, 100).config_id == "v1cfg"
    assert cache.lookup(SIG, 97).config_id == "v1cfg"
    assert cache.lookup(SIG, 101) is None
    assert {r.m for r in cache.results()} == {100, 3000}


def test_a_cache_from_another_arch_family_is_refused(tmp_path):
    path = _write(tmp_path, {"version": 3, "env": dict(ENV, arch_family="sm80"),
                             "results": {SIG.format(): {"104": {"100": {"config": "x", "ms": 1.0}}}}})
    cache = AutotuneCache(ENV)
    with pytest.raises(CacheRefused, match="arch family 'sm80'.*'sm90'"):
        cache.load_into(path)
    assert len(cache) == 0


def test_other_environment_differences_warn_and_still_serve(tmp_path):
    path = _write(tmp_path, {"version": 3, "env": dict(ENV, torch="2.13.0", sku="NVIDIA H100"),
                             "results": {SIG.format(): {"104": {"100": {"config": "x", "ms": 1.0}}}}})
    cache = AutotuneCache(ENV)
    with pytest.warns(AutotuneWarning, match="torch: '2.13.0'.*sku|sku: 'NVIDIA H100'"):
        cache.load_into(path)
    assert cache.lookup(SIG, 100).config_id == "x"


@pytest.mark.parametrize("text, reason", [
    ("{not json", "not valid JSON"),
    ("[]", "top level must be an object"),
    (json.dumps({"version": 9, "results": {}}), "unknown cache version 9"),
    (json.dumps({"version": 3, "results": {"gemm|bad": {}}}), "bad version-3 content"),
    (json.dumps({"version": 3, "results": {SIG.format(): {"104": {"100": {"ms": 1}}}}}), "string 'config'"),
    (json.dumps({"version": 1, "results": {SIG.format(): {"0": "x"}}}), "positive"),
    ('{"version": 3, "results": {"%s": {"104": {"100": {"config": "x", "ms": NaN}}}}}' % SIG.format(), "NaN"),
    (json.dumps({"version": 3, "results": {SIG.format(): {"104": {"100": {"config": "x", "ms": -5}}}}}), ">= 0"),
    ('{"version": 3, "version": 3, "results": {}}', "duplicate key"),
    (json.dumps({"version": True, "results": {}}), "whole number"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
])
def test_unusable_files_are_refused_with_the_reason(tmp_path, text, reason):
    path = tmp_path / "tune.json"
    path.write_text(text)
    with pytest.raises(CacheRefused, match=reason):
        AutotuneCache(ENV).load_into(path)


def test_two_caches_sharing_a_file_keep_each_others_results(tmp_path):
    """Each save re-reads the file under its lock and keeps what another process added since it
    loaded (a whole-file write used to drop the other's results)."""
    path = tmp_path / "tune.json"
    a, b = AutotuneCache(ENV), AutotuneCache(ENV)
    a.record(SIG, 100, "x", 0.1)
    b.record(SIG, 3000, "y", 0.2)
    a.save(path)
    b.save(path)
    merged = AutotuneCache(ENV)
    merged.load_into(path)
    assert merged.lookup(SIG, 100).config_id == "x" and merged.lookup(SIG, 3000).config_id == "y"
    assert "NaN" not in path.read_text()


def test_a_save_never_overwrites_an_unusable_file(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text("{truncated")
    cache = AutotuneCache(ENV)
    cache.record(SIG, 100, "x", 0.1)
    with pytest.raises(CacheRefused, match="not valid JSON"):
        cache.save(path)
    assert path.read_text() == "{truncated"
