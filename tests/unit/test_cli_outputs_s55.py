"""Command-line outputs a user gets wrong (session 55 probe): `cutoff probe --out` overwrote any
file (a tuning database, the decision file --persist then failed to read: every decision lost),
`cutoff show --json` / `probe --json --out` printed text around the JSON."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tunedb.cli import main
from tunedb.cutoff import store

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "tunedb" / "db" / "sm90" / "gemm.json"
WORKLOAD = ("from tunedb.cutoff import layout\n"
            "def run(solver):\n"
            "    strip, b = layout.random_system(2, 3, 2, seed=0)\n"
            "    x = None\n"
            "    for k in range(8):\n"
            "        x = solver(strip, b, x, signal=float(k))\n")


@pytest.fixture
def workload(tmp_path):
    wl = tmp_path / "wl.py"
    wl.write_text(WORKLOAD)
    return f"{wl}:run"


def _probe(workload, *extra):
    return main(["cutoff", "probe", "--workload", workload, "--device", "cpu", "--stat", "mean", *extra])


def test_probe_out_refuses_a_file_that_is_not_its_traces(tmp_path, workload, capsys):
    victim = tmp_path / "gemm.json"
    shutil.copy(SHIPPED, victim)
    before = victim.read_bytes()
    assert _probe(workload, "--problem", "p1", "--out", str(victim)) == 2
    assert "not a probe's traces file" in capsys.readouterr().err
    assert victim.read_bytes() == before
    traces = tmp_path / "t.json"
    assert _probe(workload, "--problem", "p1", "--out", str(traces)) == 0
    assert _probe(workload, "--problem", "p1", "--out", str(traces)) == 0  # its own traces: overwritten


def test_probe_out_is_never_the_decision_file(tmp_path, workload, capsys):
    decisions = tmp_path / "dec.json"
    assert _probe(workload, "--problem", "p1", "--persist", "--config", str(decisions)) == 0
    before = decisions.read_bytes()
    capsys.readouterr()
    assert _probe(workload, "--problem", "p2", "--persist", "--config", str(decisions), "--out", str(decisions)) == 2
    assert "is the decision file" in capsys.readouterr().err
    assert decisions.read_bytes() == before and "p1@cpu" in store.load(decisions)


def test_json_outputs_are_one_json_document(tmp_path, workload, capsys):
    decisions, traces = tmp_path / "dec.json", tmp_path / "t.json"
    assert _probe(workload, "--problem", "p1", "--persist", "--config", str(decisions), "--out", str(traces),
                  "--json") == 0
    assert json.loads(capsys.readouterr().out)["persisted"] is True
    assert main(["cutoff", "show", "--config", str(decisions), "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["p1@cpu"]


def test_show_names_a_config_that_does_not_exist(tmp_path, capsys):
    assert main(["cutoff", "show", "--config", str(tmp_path / "nothere.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_prebuild_json_is_one_json_document(capsys):
    assert main(["prebuild", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["sm90"]["binaries"] > 0 and plan["sm90"]["compiled"] == 0


def test_build_never_replaces_a_census_given_as_its_target(tmp_path, capsys):
    census = tmp_path / "w.json"
    census.write_text(json.dumps({"schema": 1, "workload": "w", "mode": "decode", "meta": {}, "points": []}))
    before = census.read_bytes()
    for fresh in ([], ["--fresh"]):  # the advice a corrupt target gets (--fresh) must not reach a census
        assert main(["build", "--census", str(census), "--out", str(census), "--arch", "sm90", "--simulate",
                     *fresh]) == 2
        assert "holds a census" in capsys.readouterr().err
    assert census.read_bytes() == before


def test_a_mistyped_flag_gets_the_commands_usage_and_the_nearest_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["tune", "whisper-base", "--max-lenght", "5"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "usage: tunedb tune" in err
    assert "tunedb tune: error: unrecognized arguments: --max-lenght 5 (--max-lenght: did you mean --max-length?)" in err
    with pytest.raises(SystemExit):
        main(["cutoff", "show", "--jsn"])
    assert "tunedb cutoff show: error: unrecognized arguments: --jsn (--jsn: did you mean --json?)" in capsys.readouterr().err


def test_a_subcommands_flag_before_the_subcommand_is_said_to_belong_after_it(capsys):
    with pytest.raises(SystemExit):
        main(["--json", "status"])
    assert "tunedb: error: unrecognized arguments: --json (--json is an option of `status`: put it after that word)" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cutoff", "--jsn", "show"])
    assert "tunedb cutoff: error: unrecognized arguments: --jsn" in capsys.readouterr().err


def test_probe_out_naming_a_decision_file_not_yet_made_is_refused_before_probing(tmp_path, workload, capsys):
    decisions = tmp_path / "new.json"
    assert _probe(workload, "--problem", "p1", "--persist", "--config", str(decisions), "--out", str(decisions)) == 2
    assert "is the decision file" in capsys.readouterr().err and not decisions.exists()


def test_the_census_check_of_a_target_reads_only_what_a_table_may_be(tmp_path):
    import os
    import threading

    from tunedb import database
    from tunedb.errors import CorruptDatabaseError

    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    done = []
    worker = threading.Thread(target=lambda: done.append(database.check_target(fifo, "gemm", "sm90", fresh=True)),
                              daemon=True)
    worker.start()
    worker.join(10)
    assert done == [None]  # --fresh writes through a FIFO, as before; nothing waits on a reader
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000)
    with pytest.raises(CorruptDatabaseError):
        database.check_target(deep, "gemm", "sm90")
    database.check_target(deep, "gemm", "sm90", fresh=True)  # the corrupt-target cure still works


def test_a_figure_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    assert main(["plot", str(SHIPPED), "--out", str(tmp_path / "r.png")]) == 2
    assert "a figure needs matplotlib" in capsys.readouterr().err and not (tmp_path / "r.png").exists()
