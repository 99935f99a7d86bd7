"""A preset's census is taken once per key and read back after; the key follows every input."""
from __future__ import annotations

import pytest

from tunedb import pipeline, settings
from tunedb.census import cache
from tunedb.records import Point, ShapeSet, Signature

SIG = Signature.make("gemm", "gemm", "half", N=512, K=256)


@pytest.fixture
def counted(tmp_path, monkeypatch):
    from tunedb.census import probe

    calls = []

    def fake(w, mode="offline", max_batch=8, chunk=None, manifest=None, device="meta", impl="auto", seed=0,
             fused=False):
        calls.append((w.name, mode, max_batch, fused))
        return ShapeSet((Point(SIG, max_batch, 1.0, 3), Point(SIG, 2 * max_batch, 0.5, 1, True, 0.25)), w.name,
                        (("mode", mode), ("impl", "hf"), ("device", device)))

    monkeypatch.setattr(probe, "take_census", fake)
    with settings.override(CACHE_DIR=str(tmp_path / "cache")):
        yield calls


def test_the_second_census_is_read_from_the_cache_and_equals_the_first(counted):
    first = pipeline.take_census("whisper-base", cached=True)
    second = pipeline.take_census("whisper-base", cached=True)
    assert len(counted) == 1 and second == first
    assert dict(first.meta)["impl"] == "hf" and first.points[1].must_tune


def test_other_arguments_or_code_take_a_new_census(counted, monkeypatch):
    pipeline.take_census("whisper-base", cached=True)
    pipeline.take_census("whisper-base", cached=True, max_batch=4)
    pipeline.take_census("whisper-base", cached=True, fused=False)
    assert len(counted) == 3
    monkeypatch.setattr(cache, "source_hash", lambda: "edited")
    pipeline.take_census("whisper-base", cached=True)
    assert len(counted) == 4


def test_a_manifest_enters_the_key_by_its_content(counted, tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"duration": 3.0}\n')
    k1 = cache.key("whisper-base", manifest=str(manifest))
    manifest.write_text('{"duration": 9.0}\n')
    assert cache.key("whisper-base", manifest=str(manifest)) != k1


def test_a_user_callable_is_never_cached():
    assert cache.key("mymodule:build") is None


def test_uncached_calls_always_take_the_census(counted):
    pipeline.take_census("whisper-base")
    pipeline.take_census("whisper-base")
    assert len(counted) == 2
