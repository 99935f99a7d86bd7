"""The census file (round trip, validation, merge), run-time capture, and `tunedb census`."""
import json
from pathlib import Path

import pytest

from tunedb import cli, families, settings
from tunedb.census import merge, read_capture, read_census, record_call, write_census
from tunedb.census.censusfile import from_json, to_json
from tunedb.errors import CensusError
from tunedb.records import Point, ShapeSet, Signature

SIG = Signature.make("gemm", "gemm", "half", N=512, K=512)
SIG2 = Signature.make("gemm", "gemm", "half", N=2048, K=512)
MANIFEST = Path(__file__).parents[1] / "data" / "manifests" / "synthetic_24.jsonl"


def census(points, mode="offline"):
    return ShapeSet(tuple(points), "w", (("mode", mode), ("max_batch_size", "4")))


def test_round_trip(tmp_path):
    c = census([Point(SIG, 1500, 0.25, 12, True, 0.0), Point(SIG2, 16, 0.75, 3, False, 1.0)])
    path = tmp_path / "sub" / "c.json"
    write_census(path, c)
    back = read_census(path)
    assert sorted(back.points, key=lambda p: (p.signature, p.m)) == sorted(c.points, key=lambda p: (p.signature, p.m))
    assert back.workload == "w" and dict(back.meta) == dict(c.meta)
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and data["mode"] == "offline" and data["meta"] == {"max_batch_size": "4"}
    assert set(data["points"][0]) == {"signature", "M", "weight", "calls", "must_tune", "eager_share"}
    assert [p.name for p in path.parent.iterdir()] == ["c.json"]  # no temp file left behind


def test_a_census_of_unpatched_calls_reads_back(tmp_path):
    # a fused census of the optimized model keys MHA's packed in-projection as op=unpatched;
    # `tunedb tune` caches the census and must read it back (conformer did not)
    seen = Signature.make("gemm", "unpatched", "half", N=1536, K=512, src="call")
    c = census([Point(SIG, 64, 0.5, 2, True, 0.0), Point(seen, 64, 0.5, 2, True, 0.0)])
    write_census(tmp_path / "c.json", c)
    assert {p.signature for p in read_census(tmp_path / "c.json").points} == {SIG, seen}
    bad = Signature.make("gemm", "unpatched", "half", N=1536, K=512, src="nowhere")
    data = to_json(census([Point(bad, 64, 1.0, 2, True, 0.0)]))
    with pytest.raises(CensusError, match="src='nowhere' is not one of conv1d, call"):
        from_json(data, "c.json")


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.pop("points"), "missing field 'points'"),
    (lambda d: d.update(schema=2), "'schema' must be 1"),
    (lambda d: d["points"][0].update(M="16"), r"points\[0\]: field 'M' must be int"),
    (lambda d: d["points"][0].update(M=0), "'M' must be in \\[1, 2147483647\\], got 0"),
    (lambda d: d["points"][0].update(M=2**40), "'M' must be in \\[1, 2147483647\\]"),
    (lambda d: d["points"][0].update(weight=-1), "'weight' must be a number in \\[0, 1e\\+15\\]"),
    (lambda d: d["points"][0].update(weight=1e300), "'weight' must be a number in \\[0, 1e\\+15\\], got 1e\\+300"),
    (lambda d: d["points"][0].update(must_tune=1), "'must_tune' must be bool"),
    (lambda d: d["points"][0].update(eager_share=1.5), r"'eager_share' must be in \[0, 1\]"),
    (lambda d: d["points"][0].update(signature="gemm|N=5"), "field 'signature'"),
    (lambda d: d["points"][0].pop("calls"), "missing field 'calls'"),
    (lambda d: d["points"].append(dict(d["points"][0])), r"points\[0\] and points\[1\] are the same point \('gemm"),
    (lambda d: d["points"][0].update(calls=10**400), "'calls' must be an integer in .*, got an integer of 401 digits"),
    (lambda d: d["points"][0].update(signature="gemm|op=gemm|dt=half|N=99999999999999999999|K=512"),
     "N=99999999999999999999 must be a positive integer at most 2147483647"),
])
def test_validation_names_the_bad_field(mutate, message):
    data = to_json(census([Point(SIG, 16, 1.0, 1, True, 0.0)]))
    mutate(data)
    with pytest.raises(CensusError, match=message):
        from_json(data)


def test_unreadable_files(tmp_path):
    with pytest.raises(CensusError, match="cannot read census"):
        read_census(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CensusError, match="not JSON"):
        read_census(tmp_path / "bad.json")


def test_merge_adds_weights_and_calls_and_ors_must_tune():
    a = census([Point(SIG, 16, 0.5, 10, False, 1.0), Point(SIG2, 32, 0.5, 4, True, 0.0)])
    b = census([Point(SIG, 16, 0.25, 30, True, 0.0)], mode="streaming")
    m = merge(a, b)
    by = {(p.signature, p.m): p for p in m.points}
    p = by[(SIG, 16)]
    assert (p.weight, p.calls, p.must_tune) == (0.75, 40, True)
    assert p.eager_share == pytest.approx(10 / 40)
    assert by[(SIG2, 32)] == Point(SIG2, 32, 0.5, 4, True, 0.0)
    assert dict(m.meta)["mode"] == "offline+streaming"


def test_merge_adds_the_forwards_the_calls_came_from():
    a = ShapeSet((Point(SIG, 16, 1.0, 600),), "m", (("mode", "offline"), ("forwards", "100")))
    b = ShapeSet((Point(SIG, 32, 1.0, 120000),), "m", (("mode", "streaming"), ("forwards", "20000")))
    m = merge(a, b)
    assert dict(m.meta)["forwards"] == "20100"
    from tunedb.build.steps import working_sets

    # 6 layers of one 512x512 weight per forward, offline or streaming alike
    assert working_sets([("m", m)], families.get("gemm"))[SIG] == 6 * 512 * 512 * 2


def test_capture_record_read_and_merge(tmp_path):
    path = tmp_path / "cap.jsonl"
    assert record_call(SIG, 16) is False  # TUNEDB_CAPTURE unset: nothing recorded
    with settings.override(CAPTURE=str(path)):
        record_call(SIG, 16, calls=3)
        record_call(str(SIG), 16, calls=1, captured=True)
        record_call(SIG2, 1)
    with open(path, "a") as f:
        f.write('{"signature": "gemm|op=ge')  # a writer killed mid-line
    cap = read_capture(path)
    by = {(p.signature, p.m): p for p in cap.points}
    assert by[(SIG, 16)].calls == 4 and by[(SIG, 16)].must_tune and by[(SIG, 16)].eager_share == 0.75
    assert by[(SIG2, 1)].eager_share == 1.0 and not by[(SIG2, 1)].must_tune
    assert sum(p.weight for p in cap.points) == pytest.approx(1.0)
    merged = merge(census([Point(SIG, 16, 0.5, 6, False, 0.0)]), cap)
    assert {(p.signature, p.m) for p in merged.points} == {(SIG, 16), (SIG2, 1)}
    path.write_text('{"signature": "gemm|op=gemm|dt=half|N=1|K=1", "M": 0, "calls": 1}\n{}\n')
    with pytest.raises(CensusError, match=r"line 1: M must be an int in \[1, 2147483647\]"):
        read_capture(path)
    # a file holding nothing but one torn or foreign line, or nothing, is no capture (session 33's
    # CLI audit: `--capture garbage.json` was taken as an empty capture, rc 0)
    for text, why in (("garbage", "holds no captured call"), ("", "is empty"), ("\n\n", "is empty")):
        path.write_text(text)
        with pytest.raises(CensusError, match=why):
            read_capture(path)


def test_cli_census_with_manifest_and_capture(tmp_path, capsys):
    cap = tmp_path / "cap.jsonl"
    record_call(Signature.make("gemm", "gemm", "half", N=51865, K=512), 7, calls=5, path=cap)
    out = tmp_path / "census.json"
    rc = cli.main(["census", "whisper-base", "--max-batch-size", "2", "--manifest", str(MANIFEST),
                   "--impl", "mirror", "--capture", str(cap), "--out", str(out)])
    assert rc == 0
    assert "points of tuned ops" in capsys.readouterr().out
    c = read_census(out)
    sigs = {str(p.signature) for p in c.points}
    assert "gemm|op=gemm|dt=half|N=2048|K=512" in sigs and "gemm|op=gemm|dt=half|N=51865|K=512" in sigs
    rc = cli.main(["census", "whisper-base", "--mode", "decode", "--out", str(tmp_path / "x.json")])
    assert rc == 2
    assert "encoder-only" in capsys.readouterr().err


def test_a_key_with_its_fields_out_of_order_is_refused_with_the_canonical_form():
    """Keys are matched as text: `K=512|N=512` would load and never serve (a database entry) or
    plan a second signature of the same GEMM (a census)."""
    data = to_json(census([Point(SIG, 16, 1.0, 1, True, 0.0)]))
    data["points"][0]["signature"] = "gemm|op=gemm|dt=half|K=512|N=1536"
    with pytest.raises(CensusError, match=r"fields out of order; op=gemm keys read gemm\|op=gemm\|dt=half\|N=1536\|K=512"):
        from_json(data)
