"""The JSONL measurement log: round trip with provenance, concurrent appends, torn lines."""
import json
import multiprocessing as mp
import warnings

import pytest

from tunedb.measure.log import MeasurementLog, read_log
from tunedb.measure.provenance import collect, git_state
from tunedb.errors import MeasurementError
from tunedb.records import Measurement, Provenance, Signature, Status

SIG = Signature.make("gemm", "gemm", "bf16", N=768, K=256)
PROV = Provenance(utc="2026-11-29T12:00:00Z", git_commit="abc123", git_dirty="d1", gpu_name="NVIDIA H200",
                  gpu_uuid="GPU-1234", driver="580.1", cuda="13.0", torch="2.11.0", triton="3.6.0",
                  tunedb="0.1.0")


def measurements():
    ok = Measurement(SIG, 416, "b32x64x64_w4_s3_g8", Status.OK, 0.0061, 0.0001, 3,
                     (0.0060, 0.0061, 0.0063), "cold", 6.5, False, "",
                     (("sm_clock_mhz", 1980), ("throttle", "")))
    bad = Measurement(SIG, 416, "b128x256x64_w8_s4_g8", Status.INCORRECT,
                      detail="relative error 0.04 exceeds the bound 0.008")
    return [ok, bad]


def test_round_trip_with_provenance_and_run_id(tmp_path):
    path = tmp_path / "sub" / "sm90.jsonl"
    log = MeasurementLog(path, PROV, run_id="run1")
    assert log.append(measurements()) == 2
    MeasurementLog(path, PROV).append(measurements()[:1])
    records = read_log(path)
    assert [r.measurement for r in records[:2]] == measurements()
    assert all(r.provenance == PROV for r in records)
    assert [r.run_id for r in records[:2]] == ["run1", "run1"] and records[2].run_id not in ("", "run1")
    first = json.loads(path.read_text().splitlines()[0])
    assert first["provenance"]["gpu_uuid"] == "GPU-1234" and first["samples"] == [0.0060, 0.0061, 0.0063]


def _append_many(path, worker):
    log = MeasurementLog(path, PROV, run_id=f"w{worker}")
    for _ in range(40):
        log.append(measurements())


def test_concurrent_appends_never_interleave(tmp_path):
    path = tmp_path / "log.jsonl"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    records = read_log(path, strict=True)
    assert len(records) == 4 * 40 * 2
    assert {r.run_id for r in records} == {"w0", "w1", "w2", "w3"}


def test_torn_and_foreign_lines_are_skipped_with_a_warning(tmp_path):
    path = tmp_path / "log.jsonl"
    MeasurementLog(path, PROV, run_id="r").append(measurements())
    with path.open("a") as fh:
        fh.write('{"signature": "gemm|op=gemm|dt=bf16|N=768|K=256", "M": 4\n')  # torn
        fh.write('{"signature": "nope", "M": 4, "config": "x", "status": "ok"}\n')
        fh.write('{"signature": "gemm|op=gemm|dt=bf16|N=768|K=256", "M": 4, "config": "x", "status": "fast"}\n')
    with pytest.warns(RuntimeWarning) as caught:
        records = read_log(path)
    assert [str(w.message).split(": skipped")[0].rsplit(":", 1)[1] for w in caught] == ["3", "4", "5"]
    assert "'fast' is not a valid Status" in str(caught[2].message)
    assert len(records) == 2
    with pytest.raises(MeasurementError, match=r":3:"):
        read_log(path, strict=True)
    with pytest.raises(MeasurementError, match="cannot read measurement log"):
        read_log(tmp_path / "missing.jsonl")


def test_lines_of_the_wrong_types_or_bytes_are_skipped_never_a_crash(tmp_path):
    path = tmp_path / "log.jsonl"
    MeasurementLog(path, PROV, run_id="r").append(measurements())
    head = '{"signature": "gemm|op=gemm|dt=bf16|N=768|K=256", "M": 4, "config": "x", "status": "ok"'
    with path.open("ab") as fh:
        fh.write(b"\xff\xfe not utf-8\n")
        fh.write((head + ', "median_ms": 0.1, "provenance": [1, 2]}\n').encode())
        fh.write((head + ', "median_ms": "fast"}\n').encode())
        fh.write((head + ', "median_ms": 1e999}\n').encode())  # json reads it as inf
        fh.write((head + ', "median_ms": 0.1, "samples": [0.1, "x"]}\n').encode())
    with pytest.warns(RuntimeWarning) as caught:
        records = read_log(path)
    assert len(records) == 2 and len(caught) == 5
    assert "median_ms" in str(caught[2].message) and "inf" in str(caught[3].message)


def test_a_compressed_log_cut_short_keeps_what_was_read(tmp_path):
    import gzip

    plain = tmp_path / "log.jsonl"
    log = MeasurementLog(plain, PROV, run_id="r")
    for _ in range(200):
        log.append(measurements())
    blob = gzip.compress(plain.read_bytes())
    cut = tmp_path / "log.jsonl.gz"
    cut.write_bytes(blob[: len(blob) // 2])
    with pytest.warns(RuntimeWarning, match="skipped a bad line"):
        records = read_log(cut)
    assert 0 < len(records) < 400 and all(r.run_id == "r" for r in records)
    with pytest.raises(MeasurementError, match="not a regular file"):
        read_log(tmp_path)


def test_non_finite_numbers_are_refused(tmp_path):
    bad = Measurement(SIG, 1, "x", Status.OK, float("inf"))
    with pytest.raises(ValueError):
        MeasurementLog(tmp_path / "l.jsonl", PROV).append([bad])


def test_collected_provenance_names_this_checkout():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prov = collect(gpu={"gpu_name": "NVIDIA H200", "gpu_uuid": "GPU-9", "driver": "580"})
    commit, dirty = git_state()
    assert prov.git_commit == commit and len(commit) == 40
    assert prov.gpu_uuid == "GPU-9" and prov.tunedb and prov.utc.endswith("Z")
    assert prov.triton and prov.torch


def test_a_gzipped_log_reads_like_the_plain_one(tmp_path):
    import gzip

    plain = tmp_path / "m.jsonl"
    log = MeasurementLog(plain, Provenance(gpu_name="NVIDIA H200"), run_id="r1")
    sig = Signature.parse("gemm|op=gemm|dt=half|N=512|K=256")
    log.append([Measurement(sig, 64, "torch", Status.OK, 0.01, 0.001, 9, (0.01,) * 9)])
    packed = tmp_path / "m.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [r.measurement for r in read_log(packed)] == [r.measurement for r in read_log(plain)]


def test_a_file_that_is_no_log_is_one_error_not_a_warning_a_line(tmp_path):
    """A census or a database handed over as a log (session 33's CLI audit: 10,274 warnings, then
    an error that never said the file was no log): the first few bad lines are warned about, the
    rest counted in one warning, and a file of several lines none of which is a measurement is a
    MeasurementError saying so. One torn line alone stays a warning (a writer killed mid-line)."""
    census = tmp_path / "census.json"
    census.write_text("\n".join(f'{{"signature": "x", "M": {m}}}' for m in range(40)) + "\n")
    with pytest.warns(RuntimeWarning) as caught, pytest.raises(MeasurementError, match="is not a measurement log"):
        read_log(census)
    assert len(caught) <= 6
    path = tmp_path / "log.jsonl"
    MeasurementLog(path, PROV, run_id="r").append(measurements())
    with path.open("a") as fh:
        fh.write("\n".join("garbage" for _ in range(30)) + "\n")
    with pytest.warns(RuntimeWarning) as caught:
        assert len(read_log(path)) == 2
    assert len(caught) == 6 and "25 more bad line(s) skipped (30 in all, 2 measurements read)" in str(caught[-1].message)
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"signature": "gemm|op=gemm|dt=bf16|N=768|K=256", "M"')
    with pytest.warns(RuntimeWarning):
        assert read_log(torn) == []
