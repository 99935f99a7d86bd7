"""Session 53's command-line probe: what a refused or odd command must not do (lose a file, run
minutes of work before refusing an option it could check first, ignore an option silently)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_errors import one_line_error

from tunedb import cli, settings


@pytest.fixture
def home(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


@pytest.mark.parametrize("held,words", [
    ('{"kernel_family": "gemm", "entries": {}}', "a tuning database (kernel_family 'gemm')"),
    ('{"duration": 3.2}\n{"duration": 1.0}\n', "something that is not JSON"),
    ('[1, 2]', "JSON that is not a census"),
])
def test_census_never_overwrites_a_file_that_is_not_a_census(capsys, home, held, words):
    out = home / "gemm.json"
    out.write_text(held)
    line = one_line_error(capsys, ["census", "whisper-base", "--out", str(out)])
    assert f"--out {out} exists and holds {words}" in line
    assert out.read_text() == held


def test_census_refuses_its_own_manifest_as_out_and_overwrites_a_census(capsys, home):
    manifest = home / "traffic.jsonl"
    manifest.write_text('{"duration": 3.2}\n')
    line = one_line_error(capsys, ["census", "whisper-base", "--manifest", str(manifest), "--out", str(manifest)])
    assert "is this run's --manifest input" in line and manifest.read_text() == '{"duration": 3.2}\n'
    out = home / "census.json"
    assert cli.main(["census", "whisper-base", "--out", str(out)]) == 0
    first = json.loads(out.read_text())
    assert cli.main(["census", "whisper-base", "--max-batch-size", "4", "--out", str(out)]) == 0  # a census: replaced
    assert json.loads(out.read_text()) != first


def _toy_workload(tmp_path: Path) -> str:
    wl = tmp_path / "wl.py"
    wl.write_text("from tunedb.cutoff import layout\n"
                  "def run(solver):\n"
                  f"    open({str(tmp_path / 'ran')!r}, 'a').write('x')\n"
                  "    strip, b = layout.random_system(2, 3, 2, seed=0)\n"
                  "    x = None\n"
                  "    for k in range(8):\n"
                  "        x = solver(strip, b, x, signal=float(k))\n")
    return f"{wl}:run"


PROBE = ("cutoff", "probe", "--problem", "toy", "--device", "cpu")


@pytest.mark.parametrize("case", ["out is a directory", "config not a decision file"])
def test_cutoff_probe_refuses_its_outputs_before_probing(capsys, home, case):
    wl = _toy_workload(home)
    notes = home / "notes.json"
    notes.write_text('{"mine": 1}')
    extra = (["--out", str(home)] if case == "out is a directory"
             else ["--persist", "--config", str(notes)])
    line = one_line_error(capsys, [*PROBE, "--workload", wl, *extra])
    assert ("nothing was probed" in line) if case == "out is a directory" else ("not a cutoff decision file" in line)
    assert not (home / "ran").exists()  # the workload never ran
    assert notes.read_text() == '{"mine": 1}'


def test_cutoff_probe_names_a_discard_that_drops_every_solve(capsys, home):
    line = one_line_error(capsys, [*PROBE, "--workload", _toy_workload(home), "--discard", "8"])
    assert "discard=8 drops every one of the 8 solves of policy" in line


def test_cutoff_probe_fits_nothing_on_iterative_solves_that_did_not_converge(capsys, home):
    cfg = home / "d.json"
    line = one_line_error(capsys, [*PROBE, "--workload", _toy_workload(home), "--max-iter", "0",
                                   "--persist", "--config", str(cfg)])
    assert "policy 'iterative'" in line and "unconverged" in line and "max_iter=0" in line
    assert not cfg.exists()


def test_linalg_repick_refuses_an_infinite_launch_jitter_before_any_work(capsys, home):
    table = Path(__file__).resolve().parents[2] / "src" / "tunedb" / "db" / "sm90" / "linalg.json"
    out = home / "la.json"
    line = one_line_error(capsys, ["linalg", "repick", "--table", str(table), "--out", str(out),
                                   "--launch-jitter-ns", "inf"])
    assert "--launch-jitter-ns inf must be a finite number >= 0" in line and not out.exists()


def _census(home: Path) -> Path:
    from tunedb.census import write_census
    from tunedb.records import Point, ShapeSet, Signature

    sig = Signature.make("gemm", "gemm", "half", N=512, K=512)
    path = home / "c.json"
    write_census(path, ShapeSet((Point(sig, 16, 1.0, 4), Point(sig, 64, 1.0, 4)), "toy", (("mode", "offline"),)))
    return path


def test_a_refused_build_leaves_no_directory_or_lock_file(capsys, home):
    out = home / "fresh" / "tree"
    one_line_error(capsys, ["build", "--census", str(_census(home)), "--out", str(out), "--simulate",
                            "--family", "rnn"])
    assert not (home / "fresh").exists()


def test_a_refused_simulated_tune_makes_no_temporary_directory(capsys, home, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(home / "tmp"))
    (home / "tmp").mkdir()
    one_line_error(capsys, ["tune", "whisper-base", "--simulate", "--top-k", "0"])
    assert list((home / "tmp").iterdir()) == []


@pytest.mark.parametrize("flag", [["--top-k", "2"], ["--exhaustive"], ["--allow-busy"], ["--in-process"]])
def test_replay_refuses_what_only_shapes_a_measurement(capsys, home, flag):
    line = one_line_error(capsys, ["build", "--census", str(_census(home)), "--out", str(home / "o"),
                                   "--replay", str(home / "log.jsonl"), *flag])
    assert f"--replay rebuilds from the log's plan and numbers: {flag[0]} would change nothing" in line


@pytest.mark.parametrize("flags", [["--thin"], ["--max-points", "3"], ["--every-valid"]])
def test_prebuild_refuses_census_options_without_a_census(capsys, home, flags):
    line = one_line_error(capsys, ["prebuild", "--arch", "sm90", "--dry-run", *flags])
    assert f"{flags[0]} shape(s) the plan of a census: give --census FILE" in line


def test_prebuild_dry_run_step_one_repeats_the_options_of_its_plan_and_referenced_joins_a_census(capsys, home):
    census = _census(home)
    shipped = Path(__file__).resolve().parents[2] / "src" / "tunedb" / "db" / "sm90" / "gemm.json"
    assert cli.main(["prebuild", "--arch", "sm90", "--dry-run", "--census", str(census)]) == 0
    plain = capsys.readouterr().out
    assert cli.main(["prebuild", "--arch", "sm90", "--dry-run", "--census", str(census), "--every-valid",
                     "--referenced", str(shipped)]) == 0
    shown = capsys.readouterr().out
    assert f"tunedb prebuild --arch sm90 --census {census} --every-valid --referenced {shipped} --jobs" in shown
    assert f"+ {shipped}'s configs" in shown

    def binaries(text: str) -> int:
        return int(text.split(" binaries (")[0].rsplit(" ", 1)[1])

    assert binaries(shown) > binaries(plain)


def test_a_run_id_resumed_into_another_out_is_refused(capsys, home):
    census = _census(home)
    assert cli.main(["build", "--census", str(census), "--out", str(home / "a"), "--simulate", "--run-id", "r53"]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["build", "--census", str(census), "--out", str(home / "b"), "--simulate",
                                   "--run-id", "r53"])
    assert "run r53" in line and "target differ" in line and not (home / "b").exists()
    assert cli.main(["build", "--census", str(census), "--out", str(home / "a"), "--simulate", "--run-id", "r53"]) == 0


def test_no_write_to_a_directory_that_takes_no_log_is_refused_before_measuring(capsys, home):
    (home / "afile").write_text("")  # a directory under a file: nothing can be made there, even as root
    line = one_line_error(capsys, ["build", "--census", str(_census(home)), "--out", str(home / "afile" / "o"),
                                   "--simulate", "--no-write"])
    assert "--no-write still appends the measurement log" in line and "nothing was measured" in line


def test_a_misspelled_setting_is_warned_with_the_name_it_likely_meant(capsys, home, monkeypatch):
    from tunedb.errors import SettingsWarning

    monkeypatch.setenv("TUNEDB_CACHEDIR", str(home / "elsewhere"))
    with pytest.warns(SettingsWarning, match="TUNEDB_CACHEDIR is not a tunedb setting .*did you mean TUNEDB_CACHE_DIR"):
        settings.check_all()
    assert cli.main(["status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert "TUNEDB_CACHE_DIR" in shown["unknown_settings"]["TUNEDB_CACHEDIR"]


def test_a_figure_path_that_cannot_be_written_is_refused_before_the_work(tmp_path):
    from tunedb.errors import EvaluationError
    from tunedb.evaluate.regret import check_figure_path

    (tmp_path / "afile").write_text("")
    with pytest.raises(EvaluationError, match="--png .*afile.*not a directory"):
        check_figure_path("--png", str(tmp_path / "afile" / "fig.png"))
    check_figure_path("--png", str(tmp_path / "new" / "fig.png"))  # a directory still to make: fine


@pytest.mark.parametrize("field,value,words", [
    ("contended_by", "abc", "'contended_by' must be a JSON list"),
    ("contended_by", ["a"], "'contended_by' must list process ids"),
    ("traces", [1], "'traces' must be a JSON object"),
    ("provenance", [1, 2], "'provenance' must be a JSON object"),
    ("device", None, "'device' must be a non-empty string"),
    ("version", 2, "probe file version 2"),
])
def test_cutoff_fit_names_the_bad_field_of_a_probe_file(capsys, home, field, value, words):
    from tunedb.cutoff.probing import FORMAT

    data = {"format": FORMAT, "version": 1, "problem": "mpc", "device": "cpu", "timer": "perf_counter",
            "provenance": {}, "contended_by": [], "traces": {}}
    data[field] = value
    path = home / "probe.json"
    path.write_text(json.dumps(data))
    assert words in one_line_error(capsys, ["cutoff", "fit", str(path)])


def test_cutoff_probe_refuses_an_empty_problem_name(capsys, home):
    line = one_line_error(capsys, [*PROBE[:2], "--problem", " ", "--device", "cpu", "--workload", _toy_workload(home)])
    assert "--problem '' names no problem class" in line and not (home / "ran").exists()


@pytest.mark.parametrize("command", ["census", "tune"])
def test_length_options_given_to_a_preset_are_refused_not_ignored(capsys, home, command):
    out = ["--out", str(home / "c.json")] if command == "census" else ["--dry-run"]
    line = one_line_error(capsys, [command, "whisper-base", "--max-length", "5", *out])
    assert "--max-length 5: preset 'whisper-base' fixes its own input lengths" in line
