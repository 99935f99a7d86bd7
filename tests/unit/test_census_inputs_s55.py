"""The inputs that shape a census, as real files hold them (session 55 probe): a manifest given as a
pipe (tune hashed it for the cache key and the census found it empty, or hung on a FIFO), raw
U+2028 in a text field, fractional token counts, brackets nested past the stack, a capture past the
census file's limits, and the capture grid's top length."""
from __future__ import annotations

import json
import os

import pytest

from tunedb.census import cache, modes
from tunedb.census.capture import read_capture
from tunedb.census.censusfile import read_census
from tunedb.errors import CensusError

SIG = "gemm|op=gemm|dt=half|N=512|K=512"


def test_a_manifest_that_is_a_pipe_is_not_read_for_the_cache_key(tmp_path):
    fifo = tmp_path / "m.jsonl"
    os.mkfifo(fifo)
    assert cache.key("whisper-base", manifest=str(fifo)) is None  # returns at once: nothing opened the FIFO


def test_a_text_field_with_a_raw_line_separator_is_one_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"duration": 5.0, "text": "a\u2028b\u0085c"}, ensure_ascii=False) + "\n"
                    + json.dumps({"duration": 2.5}) + "\n", encoding="utf-8")
    assert modes.read_manifest(path, "duration") == [5.0, 2.5]


@pytest.mark.parametrize("value", [0.5, 100.9])
def test_a_fractional_token_count_is_refused_with_its_line(tmp_path, value):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"tokens": 7}) + "\n" + json.dumps({"tokens": value}) + "\n")
    with pytest.raises(CensusError, match=rf"line 2: 'tokens' must be a whole number >= 1 .*got {value}"):
        modes.read_manifest(path, "tokens")
    path.write_text(json.dumps({"tokens": 7.0}) + "\n")
    assert modes.read_manifest(path, "tokens") == [7.0]


def test_json_nested_past_the_stack_is_named_not_a_traceback(tmp_path):
    deep = "[" * 100000
    manifest, capture, census = tmp_path / "m.jsonl", tmp_path / "c.jsonl", tmp_path / "census.json"
    manifest.write_text(deep + "\n")
    capture.write_text(deep + "\n" + json.dumps({"signature": SIG, "M": 1, "calls": 1}) + "\n")
    census.write_text(deep)
    with pytest.raises(CensusError, match="line 1 is not JSON: nested too deeply"):
        modes.read_manifest(manifest, "duration")
    with pytest.raises(CensusError, match="line 1 is not JSON: nested too deeply"):
        read_capture(capture)
    with pytest.raises(CensusError, match="nested too deeply"):
        read_census(census)


@pytest.mark.parametrize("row, named", [
    ({"signature": SIG, "M": 99999999999999, "calls": 1}, "M must be an int in"),
    ({"signature": SIG, "M": 16, "calls": 10 ** 20}, "calls an int in"),
    ({"signature": SIG, "M": 16, "calls": 1, "captured": "true"}, "'captured' must be true or false"),
])
def test_a_capture_line_a_census_file_could_not_hold_is_refused(tmp_path, row, named):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({"signature": SIG, "M": 1, "calls": 1}) + "\n")
    with pytest.raises(CensusError, match=rf"line 1: .*{named}"):
        read_capture(path)


def test_only_a_last_line_without_its_newline_is_a_torn_write(tmp_path):
    path = tmp_path / "c.jsonl"
    good = json.dumps({"signature": SIG, "M": 16, "calls": 2}) + "\n"
    path.write_text(good + '{"signature": "gemm|op=ge')  # the writer died mid-line
    assert [p.m for p in read_capture(path).points] == [16]
    path.write_text(good + "garbage\n")  # a whole line, newline and all: not a torn write
    with pytest.raises(CensusError, match="line 2 is not JSON"):
        read_capture(path)


@pytest.mark.parametrize("max_length, step, top", [(3000, 0, 3000), (1000, 300, 1000), (2048, 0, 2048)])
def test_the_capture_grid_reaches_max_length(max_length, step, top):
    grid = modes.length_grid(max_length, step)
    assert grid[-1] == top and list(grid) == sorted(set(grid))
    counts = modes.offline([max_length] * 3, 4, max_length, step)
    assert all(k.captured for k, n in counts.items() if n)  # a batch at the limit is captured, not eager
