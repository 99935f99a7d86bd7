"""What `tunedb tune` tells a first-time user without a GPU (issue 17): the model implementation
it censused, what a stale shipped tier means, what to run on a GPU, what `unserved` means, and a
plan table that fits 80 columns without wrapping or cutting a signature."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedb import cli, database, pipeline, settings, signature_text
from tunedb.records import Point, ShapeSet, Signature

QKV = Signature.make("gemm", "gemm", "half", N=512, K=512)
FFN = Signature.make("gemm", "gemm_act", "half", N=2048, K=512, act="gelu", bias=1)
BMM = Signature.make("gemm", "bmm", "half", B=64, N=1500, K=64)
TIER = Path(__file__).resolve().parents[1] / "data" / "db" / "tier"


@pytest.fixture
def cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    shapes = ShapeSet(tuple(Point(s, m, 0.1, 4, True) for s in (QKV, FFN, BMM) for m in (1500, 12000)),
                      "whisper-base", (("mode", "offline"), ("impl", "mirror")))
    monkeypatch.setattr(pipeline, "take_census", lambda *a, **k: shapes)
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def system_tier(root: Path, torch_version: str) -> Path:
    raw = {"schema": 1, "kernel_family": "gemm", "arch_family": "sm90",
           "validators": {"torch": torch_version}, "configs": {},
           "entries": {QKV.format(): {"regions": [[None, "torch"]], "source": "build"}}}
    (root / "sm90").mkdir(parents=True)
    (root / "sm90" / "gemm.json").write_text(json.dumps(raw))
    return root


def tune(capsys, monkeypatch, columns: int, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert cli.main(["tune", "whisper-base", *argv]) == 0
    return capsys.readouterr().out


def test_the_plan_fits_80_columns_with_short_signatures_and_a_legend(cpu, capsys, monkeypatch):
    with database.system_root_override(system_tier(cpu / "sys", "0.0.1")):
        out = tune(capsys, monkeypatch, 80)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for short in ("512x512", "2048x512 gelu+b", "bmm 64x1500x64"):
        rows = [line for line in lines if line.strip().startswith(short + " ")]
        assert len(rows) == 2, (short, out)  # one row per M, never wrapped onto a second line
    assert signature_text.legend().split(";")[0] in out.replace("\n", " ")
    assert "…" not in out


def test_a_wide_terminal_keeps_the_full_keys(cpu, capsys, monkeypatch):
    with database.system_root_override(system_tier(cpu / "sys", "0.0.1")):
        out = tune(capsys, monkeypatch, 200)
    assert sum(FFN.format() + " " in line for line in out.splitlines()) == 2
    assert "signature: NxK" not in out


def test_unserved_is_explained(cpu, capsys, monkeypatch):
    with database.system_root_override(system_tier(cpu / "sys", "0.0.1")):
        out = " ".join(tune(capsys, monkeypatch, 200).split())
    assert "2 unserved" in out
    assert "unserved: 2 point(s) of op(s) bmm that no tunedb kernel family tunes; they always run on torch" in out


def test_what_to_run_on_a_gpu_follows_no_gpu(cpu, capsys, monkeypatch):
    with database.system_root_override(system_tier(cpu / "sys", "0.0.1")):
        lines = tune(capsys, monkeypatch, 200, "--mode", "streaming").splitlines()
    at = lines.index("No GPU: nothing was measured.")
    assert lines[at + 1].startswith("On a GPU machine run `tunedb tune whisper-base --mode streaming`: "
                                    "it measures these 2 signature(s)")


def test_a_stale_shipped_tier_is_explained(cpu, capsys, monkeypatch):
    with database.system_root_override(system_tier(cpu / "sys", "0.0.1")):
        out = " ".join(tune(capsys, monkeypatch, 200).split())
    assert "the shipped sm90 tier: 1 of 1 entries are stale (torch 0.0.1 (now " in out
    assert "They still serve" in out and "run `tunedb tune whisper-base` on a GPU" in out


def test_a_current_shipped_tier_says_nothing_about_staleness(cpu, capsys, monkeypatch):
    now = database.current_validators()["torch"]
    with database.system_root_override(system_tier(cpu / "sys", now)):
        out = tune(capsys, monkeypatch, 200)
    assert "stale" not in out


def test_the_census_implementation_is_printed(cpu, capsys, monkeypatch):
    with database.system_root_override(system_tier(cpu / "sys", "0.0.1")):
        out = tune(capsys, monkeypatch, 200)
    assert "model implementation: mirror (tunedb's built-in copy, the same tuned keys; --impl picks another)" in out


def test_census_command_prints_the_implementation(tmp_path, capsys):
    assert cli.main(["census", "whisper-base", "--impl", "mirror", "--out", str(tmp_path / "c.json")]) == 0
    assert "tunedb census: model implementation: mirror" in capsys.readouterr().out


def test_the_whisper_mirror_has_the_real_models_keys():
    """Without transformers the mirror is censused; its keys must be the HF model's (act=gelu)."""
    pytest.importorskip("transformers")
    from tunedb.census import presets, probe

    def keys(impl):
        shapes = probe.take_census(presets.workload("whisper-base"), "offline", 2, None, None, "meta", impl, 0,
                                   fused=True)
        return {(p.signature, p.m) for p in shapes.points}

    mirror = keys("mirror")
    assert mirror == keys("hf")
    assert any(s.get("act") == "gelu" for s, _ in mirror)


def test_the_regret_table_keeps_whole_worst_signatures_at_80_columns():
    import io

    from rich.console import Console

    from tunedb import evaluate

    data = Path(__file__).resolve().parents[1] / "data" / "eval"
    ev, _ = pipeline.evaluate_logs([data / "log.jsonl"], [("new", data / "new.json")], [])
    for width, expect in ((80, "worst for default: 512x256 ("), (200, "gemm|op=gemm|dt=half|N=512|K=256 (")):
        buf = io.StringIO()
        evaluate.render_table(ev, Console(file=buf, width=width))
        text = buf.getvalue()
        assert max(len(line) for line in text.splitlines()) <= width
        assert expect in text and "…" not in text


CONV = Signature.make("conv", "conv1d", "half", Cin=512, Cout=1024, k=31, s=1, p=15, d=1, g=512, bias=1,
                      act="silu", lay="ntc")


def test_a_terminal_too_narrow_for_short_keys_folds_them_and_keeps_every_column(tmp_path, capsys, monkeypatch):
    """The plan of a conv census at 60 columns: rich cut the tier and config columns away."""
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    shapes = ShapeSet(tuple(Point(s, m, 0.1, 4, True) for s in (CONV, QKV) for m in (49, 7992)),
                      "conformer", (("mode", "offline"), ("impl", "mirror")))
    monkeypatch.setattr(pipeline, "take_census", lambda *a, **k: shapes)
    monkeypatch.setenv("COLUMNS", "60")
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        assert cli.main(["tune", "conformer", "--family", "conv"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "signature" in line and "M" in line)
    assert "tier" in header and "config" in header and "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 60
    flat = " ".join(out.split())
    assert "`tunedb tune conformer --family conv`" in flat  # the GPU command keeps the family
    assert "other families: 2 point(s) of gemm; this `tune` measures the conv family" in flat


@pytest.mark.parametrize("grouped", [True, False])
def test_at_40_columns_no_column_is_cut_even_folded(tmp_path, capsys, monkeypatch, grouped):
    """At 40 columns even the folded table was too wide: rich cut the config column to one letter
    ("t" for torch) and dropped the signature column. The rows print as column=value lines then."""
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    sigs = [Signature.make("gemm", "gemm", "half", N=n, K=k) for n, k in ((1024, 256), (256, 1024), (768, 256))]
    ms = range(8, 8 * (20 if grouped else 4), 8)
    shapes = ShapeSet(tuple(Point(s, m, 0.01, 4, True) for s in sigs for m in ms), "w", (("mode", "offline"),))
    monkeypatch.setattr(pipeline, "take_census", lambda *a, **k: shapes)
    monkeypatch.setenv("COLUMNS", "40")
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        assert cli.main(["tune", "whisper-base"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 40 and "…" not in out
    flat = " ".join(out.split())
    assert flat.count("config=") == (3 if grouped else 3 * len(ms))
    assert "signature=1024x256" in flat and "tier=" in flat


def test_what_to_run_on_a_gpu_keeps_the_flags_that_change_the_measurement(cpu, capsys, monkeypatch, tmp_path):
    """--out, --top-k, --exhaustive and the like stay in the command suggested for a GPU, and the
    sentence names where it writes; after --dry-run it does not suggest --dry-run (CLI audit)."""
    with database.system_root_override(system_tier(cpu / "sys", "0.0.1")):
        # a terminal wide enough for the sentence whatever the temporary path (pytest -n's are longer)
        lines = tune(capsys, monkeypatch, 1000, "--out", str(tmp_path / "db"), "--top-k", "4", "--exhaustive",
                     "--dry-run").splitlines()
    (line,) = [ln for ln in lines if ln.startswith("On a GPU machine run")]
    assert f"--out {tmp_path / 'db'} --top-k 4 --exhaustive`" in line
    assert f"into {tmp_path / 'db'}." in line and "add --dry-run" not in line


def test_the_gpu_advice_says_when_its_target_would_stop_it(cpu, capsys, monkeypatch):
    # session 55: the advice named a command whose build would refuse its target on this machine
    (cpu / "user" / "sm90").mkdir(parents=True)
    (cpu / "user" / "sm90" / "gemm.json").write_text("{bad")
    out = " ".join(tune(capsys, monkeypatch, 200).split())
    assert "run `tunedb tune whisper-base`" in out and "On this machine it would stop before measuring:" in out
    (cpu / "user" / "sm90" / "gemm.json").unlink()
    assert "would stop" not in " ".join(tune(capsys, monkeypatch, 200).split())


def test_the_gpu_advice_checks_the_file_an_out_directory_gets(cpu, capsys, monkeypatch):
    out = cpu / "db"
    out.mkdir()
    text = " ".join(tune(capsys, monkeypatch, 200, "--out", str(out)).split())
    assert "would stop" not in text  # --out DIR writes DIR/sm90/gemm.json: a directory is its place
    (out / "sm90").mkdir()
    (out / "sm90" / "gemm.json").write_text("[")
    assert "On this machine it would stop before measuring:" in " ".join(
        tune(capsys, monkeypatch, 200, "--out", str(out)).split())


def test_the_plan_resolves_half_keys_in_the_models_dtype(tmp_path):
    # session 55: a user-tier entry written under the call's own dtype (autotune's) served the run
    # but not the plan, which asked the census's generic `half` key
    user = tmp_path / "user"
    (user / "sm90").mkdir(parents=True)
    raw = {"schema": 1, "kernel_family": "gemm", "arch_family": "sm90", "validators": {},
           "configs": {"b64x64x64_w4_s3_g8": {"lane": "triton_mma", "block": [64, 64, 64], "warps": 4, "stages": 3}},
           "entries": {QKV.with_dt("bf16").format(): {"regions": [[None, "b64x64x64_w4_s3_g8"]]}}}
    (user / "sm90" / "gemm.json").write_text(json.dumps(raw))
    points = (Point(QKV, 1500, 1.0, 4, True),)
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(user)):
        for dtype, want in (("bf16", ("user", "b64x64x64_w4_s3_g8")), ("fp16", None)):
            shapes = ShapeSet(points, "w", (("mode", "offline"), ("dtype", dtype)))
            (served,) = pipeline.plan_served(shapes)
            if want:
                assert (served.tier, served.config_id) == want
            else:
                assert served.tier != "user"


def test_a_presets_census_records_its_half_dtype(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache")):
        shapes = pipeline.take_census("whisper-base")
    assert dict(shapes.meta)["dtype"] == "bf16"
