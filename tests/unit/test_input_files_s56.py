"""Input files as a user hands them (session 56 probe): a measurement log whose first line starts
with a Windows editor's byte-order mark (its first record was dropped as a bad line), `-` for
standard input where tunedb reads an input file, and the database files that refuse it saying so."""
from __future__ import annotations

import subprocess
import sys
import warnings

from tunedb.measure.log import MeasurementLog, read_log
from tunedb.records import Measurement, Provenance, Signature, Status

SIG = Signature.make("gemm", "gemm", "bf16", N=768, K=256)
PROV = Provenance(utc="2026-12-07T12:00:00Z", git_commit="abc123", git_dirty="", gpu_name="NVIDIA H200",
                  gpu_uuid="GPU-1", driver="580.1", cuda="13.0", torch="2.11.0", triton="3.6.0", tunedb="0.1.0")


def _log(path):
    ok = Measurement(SIG, 16, "b32x64x64_w4_s3_g8", Status.OK, 0.0061, 0.0001, 3, (0.006, 0.0061, 0.0063),
                     "cold", 6.5, False, "", ())
    MeasurementLog(path, PROV, run_id="r").append([ok, ok])


def test_a_log_starting_with_a_byte_order_mark_keeps_its_first_record(tmp_path):
    plain, bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    _log(plain)
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "skipped a bad line"
        got = read_log(bom)
    assert [r.measurement for r in got] == [r.measurement for r in read_log(plain)] and len(got) == 2


def test_a_byte_order_mark_past_the_first_line_is_still_a_bad_line(tmp_path):
    path = tmp_path / "mid.jsonl"
    _log(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"\xef\xbb\xbf" + lines[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = read_log(path)
    assert len(got) == 1 and any("line 2" in str(w.message) or ":2:" in str(w.message) for w in caught)


def test_a_dash_reads_standard_input():
    code = "from tunedb.input_files import read_text; print(repr(read_text('-')))"
    out = subprocess.run([sys.executable, "-c", code], input="\ufeffhello\n", capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == repr("hello\n")


def test_diff_says_a_table_is_not_read_from_standard_input(tmp_path, capsys):
    from tunedb.cli import main

    assert main(["diff", "-", str(tmp_path / "b.json")]) == 2
    assert "standard input is not taken" in capsys.readouterr().err
