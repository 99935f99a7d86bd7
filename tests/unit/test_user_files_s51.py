"""Files and flags a user hands the CLI (session 51's probe): a byte-order mark (a Windows editor's
UTF-8) is read as UTF-8; a manifest line that is not an object, or lacks the field, is named as such;
a Hugging Face config given as the workload is told apart from a census file; --chunk-size outside
streaming is refused rather than recorded and repeated."""
from __future__ import annotations

import json

import pytest

from tunedb.census import modes, presets
from tunedb.census.censusfile import from_json, read_census, to_json
from tunedb.census.probe import traffic
from tunedb.database import schema
from tunedb.errors import CensusError
from tunedb.records import Point, ShapeSet, Signature

SIG = Signature.make("gemm", "gemm", "half", N=512, K=256)


def test_a_manifest_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"duration": 2.5}\r\n{"duration": 4}\r\n')
    assert modes.read_manifest(path, "duration") == [2.5, 4.0]


def test_a_census_with_a_byte_order_mark_is_read(tmp_path):
    census = ShapeSet((Point(SIG, 16, 1.0, 3, True, 0.0),), "w", (("mode", "offline"),))
    path = tmp_path / "c.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(to_json(census)).encode())
    assert read_census(path).points == from_json(to_json(census)).points


def test_a_table_with_a_byte_order_mark_is_not_corrupt(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"schema": 1}')
    assert schema.read_raw(path) == {"schema": 1}


@pytest.mark.parametrize("line,message", [
    ('[{"duration": 3}]', "line 1 is a JSON list, not an object"),
    ('{"seconds": 3}', "line 1 has no 'duration' field .*'seconds'"),
])
def test_a_manifest_line_names_what_is_wrong_with_it(tmp_path, line, message):
    path = tmp_path / "m.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(CensusError, match=message):
        modes.read_manifest(path, "duration")


def test_a_hugging_face_config_as_the_workload_is_named_as_one(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    with pytest.raises(CensusError, match="is a Hugging Face config, which tunedb does not read: give a module:callable"):
        presets.workload(str(cfg))
    census = tmp_path / "census.json"
    census.write_text(json.dumps({"schema": 1}))
    with pytest.raises(CensusError, match="a census file is measured by `tunedb build --census"):
        presets.workload(str(census))


@pytest.mark.parametrize("mode", ["offline", "prefill", "decode"])
def test_chunk_size_outside_streaming_is_refused(mode):
    with pytest.raises(CensusError, match=f"--chunk-size applies only to --mode streaming \\(this census is --mode {mode}\\)"):
        traffic(presets.workload("whisper-base"), mode, 2, 64, None)


def test_a_json_workload_nested_past_the_recursion_limit_keeps_the_census_hint(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000)
    with pytest.raises(CensusError, match="unknown workload .*a census file is measured by"):
        presets.workload(str(deep))
