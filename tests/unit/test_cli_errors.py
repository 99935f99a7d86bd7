"""Bad input on the command line: one clear line on stderr and a non-zero exit, never a traceback
(issue 17). Each case names the bad value and what is allowed or what to do."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tunedb import cli, settings
from tunedb.records import Point, ShapeSet, Signature

DATA = Path(__file__).resolve().parents[1] / "data" / "db"
QKV = Signature.make("gemm", "gemm", "half", N=512, K=512)


def one_line_error(capsys, argv, rc=2) -> str:
    assert cli.main(list(argv)) == rc
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def home(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def write_census(path: Path, sig: str) -> Path:
    from tunedb.census import write_census as write

    write(path, ShapeSet((Point(QKV, 16, 1.0, 4),), "toy", (("mode", "offline"),)))
    data = json.loads(path.read_text())
    data["points"][0]["signature"] = sig
    path.write_text(json.dumps(data))
    return path


def test_an_unwritable_user_tier_is_one_line_before_anything_is_measured(home, capsys, monkeypatch):
    """The user tier under a file (what an unwritable tier looks like to the writer, even as root):
    a real build (a GPU, faked here) stops before it measures anything."""
    from tunedb import arch, pipeline
    from tunedb.build import run as build_run

    (home / "afile").write_text("")
    census = write_census(home / "c.json", QKV.format())
    measurers = []
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(build_run, "arch_profile", lambda family, real: arch.shipped_profile("sm90"))
    monkeypatch.setattr(build_run.buildsteps, "start_worker", lambda opts, gpu: None)
    monkeypatch.setattr(build_run.buildsteps, "Measurer", lambda *a, **k: measurers.append(a))
    with settings.override(USER_DB=str(home / "afile" / "tier")):
        line = one_line_error(capsys, ["build", "--census", str(census), "--out", "user", "--in-process"])
    # refused as a setting now (a directory under a file can never be made), before any measuring
    assert line.startswith("tunedb build: error: TUNEDB_USER_DB=") and "which is a file, not a directory" in line
    assert "afile" in line
    assert measurers == []


def test_a_permission_error_maps_to_one_line_with_what_to_do(capsys, monkeypatch):
    from tunedb.commands import diff

    def denied(args):
        raise PermissionError(13, "Permission denied", "/ro/tunedb/v1/sm90/gemm.json.lock")

    monkeypatch.setattr(diff, "run", denied)
    line = one_line_error(capsys, ["diff", "a", "b"])
    assert line == ("tunedb diff: error: /ro/tunedb/v1/sm90/gemm.json.lock: Permission denied; choose a writable "
                    "place: another path for this command's output file or directory, or TUNEDB_USER_DB=DIR for "
                    "the user tier and TUNEDB_CACHE_DIR=DIR for caches")


def test_a_failed_atomic_write_names_the_file_asked_for_not_its_temp_file(tmp_path, monkeypatch):
    import tempfile

    from tunedb.database.store import write_atomic

    def denied(dir, prefix, suffix):
        raise PermissionError(13, "Permission denied", f"{dir}/{prefix}abc{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(PermissionError) as err:
        write_atomic(tmp_path / "out.json", "{}")
    assert err.value.filename == str(tmp_path / "out.json")


def test_census_out_an_existing_directory_is_refused_before_the_census(tmp_path, capsys, monkeypatch):
    from tunedb.census import probe

    monkeypatch.setattr(probe, "take_census", lambda *a, **k: pytest.fail("census taken"))
    line = one_line_error(capsys, ["census", "whisper-base", "--out", str(tmp_path)])
    assert f"--out {tmp_path} is a directory" in line and "census.json" in line


def test_census_out_under_a_file_or_unwritable_dir_is_refused(tmp_path, capsys, monkeypatch):
    from tunedb.census import probe

    monkeypatch.setattr(probe, "take_census", lambda *a, **k: pytest.fail("census taken"))
    (tmp_path / "afile").write_text("")
    line = one_line_error(capsys, ["census", "whisper-base", "--out", str(tmp_path / "afile" / "c.json")])
    assert "afile is not a directory" in line
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only file system (root ignores modes)
    line = one_line_error(capsys, ["census", "whisper-base", "--out", str(tmp_path / "c.json")])
    assert "is not writable" in line


@pytest.mark.parametrize("make, message", [
    (lambda d: f"x={d / 'missing.json'}", "no such file"),
    (lambda d: f"x={d}", "is a directory; --db takes a database file"),
])
def test_evaluate_db_missing_or_a_directory(tmp_path, capsys, make, message):
    log = tmp_path / "m.jsonl"
    log.write_text("")
    line = one_line_error(capsys, ["evaluate", "--log", str(log), "--db", make(tmp_path)])
    assert message in line and line.startswith("tunedb evaluate: error: --db x=")


def test_evaluate_log_missing(tmp_path, capsys):
    line = one_line_error(capsys, ["evaluate", "--log", str(tmp_path / "nope.jsonl")])
    assert "--log" in line and "no such file" in line


@pytest.mark.parametrize("argv", [["plot", "--out", "{d}/fig.txt", "src/tunedb/db/sm90/gemm.json"],
                                  ["evaluate", "--log", "{d}/m.jsonl", "--png", "{d}/fig.txt"]])
def test_a_figure_path_without_a_figure_suffix_is_refused_before_any_work(tmp_path, capsys, argv):
    # matplotlib refused the suffix only after the work, with a traceback
    (tmp_path / "m.jsonl").write_text("")
    root = Path(__file__).resolve().parents[2]
    argv = [a.format(d=tmp_path) if "{d}" in a else str(root / a) if a.endswith(".json") else a for a in argv]
    line = one_line_error(capsys, argv)
    assert "fig.txt" in line and ".png, .pdf, .svg" in line and not (tmp_path / "fig.txt").exists()


def test_a_workload_callable_without_device_says_what_it_must_be(tmp_path, capsys, monkeypatch):
    (tmp_path / "mymod_bad.py").write_text("def make():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = one_line_error(capsys, ["tune", "mymod_bad:make"])
    assert "workload 'mymod_bad:make' takes () but must accept device=" in line
    assert "returning (model, input_factory[, decode_factory])" in line


USER_MODELS = """
import torch

def raises(device):
    raise RuntimeError("boom in the user's factory")

def too_long(device):
    with torch.device(device):
        model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 8))
        pos = torch.arange(64, device=device)  # a position table of 64: longer inputs fail
    def inputs(batch, length):
        return (torch.zeros(batch, length, dtype=torch.long, device=device) + pos[:length] * 0,)
    return model, inputs
"""


@pytest.mark.parametrize("cmd", ["tune", "census"])
@pytest.mark.parametrize("fn, needle", [
    ("raises", "failed in building the model: RuntimeError: boom in the user's factory"),
    ("too_long", "failed in its forward at batch=1, length="),
])
def test_a_user_workload_that_raises_is_one_line_naming_the_step(home, capsys, monkeypatch, cmd, fn, needle):
    (home / "mymod_raises.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(home))
    argv = [cmd, f"mymod_raises:{fn}"] + (["--out", str(home / "c.json")] if cmd == "census" else [])
    line = one_line_error(capsys, argv)
    assert f"workload 'mymod_raises:{fn}' {needle}" in line


def test_the_callable_contract_is_in_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["tune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "f(device=torch.device(...)) returning (model, input_factory[, decode_factory])" in out


def test_diff_into_a_closed_pipe_exits_quietly(tmp_path, monkeypatch, capsys):
    """`tunedb diff A B | head`: the reader is gone; no BrokenPipeError traceback."""
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    stream = os.fdopen(write_fd, "w", buffering=1)
    monkeypatch.setattr("sys.stdout", stream)
    rc = cli.main(["diff", str(DATA / "a.json"), str(DATA / "b.json")])
    assert rc == cli.EXIT_BROKEN_PIPE
    assert "Traceback" not in capsys.readouterr().err
    stream.close()


def test_a_bad_setting_stops_every_command_at_start(capsys, monkeypatch):
    """TUNEDB_JIT_LAUNCH=true used to be silently off; diff never read it at all."""
    monkeypatch.setenv("TUNEDB_JIT_LAUNCH", "true")
    line = one_line_error(capsys, ["diff", str(DATA / "a.json"), str(DATA / "a.json")])
    assert line == "tunedb diff: error: TUNEDB_JIT_LAUNCH='true' is not allowed; use one of 0, 1"


def test_compile_set_is_refused_before_the_census(capsys, monkeypatch):
    from tunedb import pipeline

    monkeypatch.setenv("TUNEDB_COMPILE_SET", "bogus")
    monkeypatch.setattr(pipeline, "take_census", lambda *a, **k: pytest.fail("census taken"))
    line = one_line_error(capsys, ["tune", "whisper-base"])
    assert "TUNEDB_COMPILE_SET='bogus'" in line and "tuned, all" in line


def test_user_db_naming_a_file_is_refused_at_start(tmp_path, capsys, monkeypatch):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("TUNEDB_USER_DB", str(tmp_path / "afile"))
    line = one_line_error(capsys, ["diff", str(DATA / "a.json"), str(DATA / "a.json")])
    assert "TUNEDB_USER_DB=" in line and "is not a directory" in line


def test_status_marks_invalid_settings_and_still_reports(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setenv("TUNEDB_MODEL_FALLBACK", "maybe")
    monkeypatch.setenv("TUNEDB_USER_DB", str(tmp_path))
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if "TUNEDB_MODEL_FALLBACK" in line]
    assert row and "maybe (INVALID)" in row[0] and "use one of auto, 0, 1" in row[0]
    assert "1 invalid setting(s)" in out
    assert cli.main(["status", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert list(rep["invalid_settings"]) == ["TUNEDB_MODEL_FALLBACK"]


@pytest.mark.parametrize("cmd", ["tune", "build"])
@pytest.mark.parametrize("flags, needle", [
    (["--arch", "bogus"], "--arch 'bogus' is not an arch family: expected sm<digits>"),
    (["--family", "nosuch"], "unknown kernel family 'nosuch'; registered: "),
])
def test_a_bad_arch_or_family_is_refused_before_the_census(home, capsys, monkeypatch, cmd, flags, needle):
    """Not a plan for an arch nobody has (every shape 'default', exit 0), nor a census first."""
    from tunedb import pipeline

    monkeypatch.setattr(pipeline, "take_census", lambda *a, **k: pytest.fail("the census ran"))
    argv = ["tune", "whisper-base"] if cmd == "tune" else ["build", "--census", str(home / "c.json"), "--out", "user"]
    line = one_line_error(capsys, argv + flags)
    assert needle in line


@pytest.mark.parametrize("device, needle", [
    ("bogus", "--device 'bogus' is not a torch device"),
    ("cuda", "--device 'cuda': no CUDA GPU here; use meta"),
])
def test_census_device_that_cannot_be_used_is_one_line(home, capsys, monkeypatch, device, needle):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = one_line_error(capsys, ["census", "whisper-base", "--impl", "mirror", "--device", device,
                                   "--out", str(home / "c.json")])
    assert needle in line


def test_census_device_index_beyond_the_machine_is_one_line(home, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    line = one_line_error(capsys, ["census", "whisper-base", "--impl", "mirror", "--device", "cuda:3",
                                   "--out", str(home / "c.json")])
    assert "'cuda:3'" in line and "1 CUDA device(s) (cuda:0 to cuda:0)" in line


@pytest.mark.parametrize("cmd", ["census", "tune"])
@pytest.mark.parametrize("flags, needle", [
    (["--max-length", "0"], "--max-length=0 must be a positive int (the offline capture limit, in frames)"),
    (["--max-length", "-5", "--unit", "tokens"], "--max-length=-5 must be a positive int (the offline capture limit, in tokens)"),
    (["--length-step", "-5"], "--length-step=-5 must be an int >= 0 (0: the M-bucket ladder)"),
])
def test_census_length_flags_of_a_user_workload_are_checked(home, capsys, monkeypatch, cmd, flags, needle):
    """`tunedb tune` takes the census's length flags and refuses the same bad values, before the census."""
    from tunedb import pipeline

    (home / "mymod_lengths.py").write_text(USER_MODELS)
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.setattr(pipeline, "take_census", lambda *a, **k: pytest.fail("the census ran"))
    out = ["--out", str(home / "c.json")] if cmd == "census" else []
    line = one_line_error(capsys, [cmd, "mymod_lengths:too_long", *out, *flags])
    assert line == f"tunedb {cmd}: error: {needle}"


@pytest.mark.parametrize("cmd", ["census", "tune"])
def test_a_length_unit_outside_frames_and_tokens_is_refused(home, capsys, cmd):
    out = ["--out", str(home / "c.json")] if cmd == "census" else []
    with pytest.raises(SystemExit) as exc:
        cli.main([cmd, "mymod:make", *out, "--unit", "words"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --unit: invalid choice: 'words'" in err and "frames" in err and "tokens" in err


@pytest.mark.parametrize("cmd", ["census", "tune"])
def test_an_absurd_manifest_duration_is_one_line_not_a_torch_overflow(home, capsys, cmd):
    """conformer with a 1e9 s utterance: torch's 'Storage size calculation overflowed' traceback."""
    manifest = home / "m.jsonl"
    manifest.write_text('{"duration": 4.5}\n{"duration": 1e9}\n')
    out = ["--out", str(home / "c.json")] if cmd == "census" else []
    line = one_line_error(capsys, [cmd, "conformer", "--impl", "mirror", "--manifest", str(manifest), *out])
    assert line == (f"tunedb {cmd}: error: manifest {manifest} line 2: 'duration' must be a positive number "
                    f"at most 86400 s (24 h), got 1000000000.0")


def test_a_corrupt_tier_file_is_one_line_under_a_command(home):
    """`tunedb tune` reading a corrupt user-tier file printed the skip twice (tunedb's log line and
    Python's DatabaseWarning with its file:line and source line): now tunedb's line, once."""
    import subprocess
    import sys

    bad = home / "user" / "sm90" / "gemm.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": 1, "kernel_')
    import tunedb

    src = str(Path(tunedb.__file__).resolve().parents[1])  # the tree under test
    env = {**os.environ, "TUNEDB_CACHE_DIR": str(home / "cache"), "TUNEDB_USER_DB": str(home / "user"),
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "tunedb", "tune", "whisper-base", "--impl", "mirror"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if str(bad) in line]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tunedb: skipping user-tier database file (corrupt): ") and "not valid JSON" in lines[0]
    assert "DatabaseWarning" not in proc.stderr


def test_a_closed_pipe_under_a_rich_table_exits_141(capsys, monkeypatch, tmp_path):
    """`tunedb status | head -1` exited 1: rich's Console met the closed pipe first and exited
    with its own status from inside the BrokenPipeError's handler."""
    monkeypatch.setenv("TUNEDB_CACHE_DIR", str(tmp_path))
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    stream = os.fdopen(write_fd, "w", buffering=1)
    monkeypatch.setattr("sys.stdout", stream)
    rc = cli.main(["status"])
    assert rc == cli.EXIT_BROKEN_PIPE
    assert "Traceback" not in capsys.readouterr().err
    stream.close()


def test_a_directory_that_takes_no_new_file_stops_the_build_before_measuring(home, capsys, monkeypatch):
    """The target's directory exists (with the lock file an earlier write left) but takes no new
    file: the atomic write's temporary file would fail after the whole measurement (session 33's
    CLI audit). os.access is faked for that directory: as root a chmod would not stop anything."""
    import os

    from tunedb import arch, pipeline
    from tunedb.build import run as build_run
    from tunedb.database import target as target_mod

    out = home / "ro"
    (out / "sm90").mkdir(parents=True)
    (out / "sm90" / "gemm.json.lock").write_text("")
    census = write_census(home / "c.json", QKV.format())
    measurers = []
    real_access = os.access
    monkeypatch.setattr(target_mod.os, "access",
                        lambda p, mode: False if Path(p) == out / "sm90" else real_access(p, mode))
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(build_run, "arch_profile", lambda family, real: arch.shipped_profile("sm90"))
    monkeypatch.setattr(build_run.buildsteps, "start_worker", lambda opts, gpu: None)
    monkeypatch.setattr(build_run.buildsteps, "Measurer", lambda *a, **k: measurers.append(a))
    line = one_line_error(capsys, ["build", "--census", str(census), "--out", str(out), "--in-process"])
    assert line.startswith("tunedb build: error: cannot write the target") and "a new file cannot be made" in line
    assert "nothing was measured" in line and measurers == []


def test_one_census_named_twice_is_planned_once(capsys, tmp_path, monkeypatch):
    census = Path(__file__).resolve().parents[2] / "bench" / "census" / "conformer_streaming.json"
    monkeypatch.chdir(census.parent)
    outs = []
    for names in ([str(census)], [str(census), "conformer_streaming.json"]):
        argv = ["build", *(a for n in names for a in ("--census", n)), "--out", str(tmp_path / "db"),
                "--arch", "sm90", "--dry-run"]
        assert cli.main(argv) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "est. s" in outs[0]


def test_an_empty_out_names_what_is_allowed(capsys):
    census = Path(__file__).resolve().parents[2] / "bench" / "census" / "conformer_streaming.json"
    line = one_line_error(capsys, ["build", "--census", str(census), "--out", "", "--arch", "sm90", "--dry-run"])
    assert "--out '' names no directory; use 'user', 'system' or a directory path" in line


def test_cutoff_fit_of_a_json_list_says_it_is_no_probe(capsys, tmp_path):
    path = tmp_path / "probe.json"
    path.write_text("[1, 2]")
    line = one_line_error(capsys, ["cutoff", "fit", str(path)])
    assert "not a probe file: a JSON list" in line
