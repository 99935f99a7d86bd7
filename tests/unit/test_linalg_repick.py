"""`tunedb linalg repick`: a measured table re-decided under the current pick rule from the
statistic each point recorded, without a GPU (session 25: the rule changed after the table's
tune; re-deciding from the same numbers moved exactly the cells the change concerns)."""
from __future__ import annotations

import json
from pathlib import Path

from tunedb import cli
from tunedb.database import schema
from tunedb.families.linalg import pick, repick, table

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "src/tunedb/db/sm90/linalg.json"
TUNED = ROOT / "bench/results/s25_4/logs/a/sm90/linalg.json"  # session 25 call 4, run a, as tuned


def _moves(path: Path, rule=pick.LINALG_RULE) -> list[str]:
    db = schema.load(path, "linalg", "sm90")
    return table.moved_cells(db, repick.repick(db, rule), rule.tie_band)


def test_the_shipped_table_is_what_the_current_rule_decides_on_its_own_evidence():
    """A rule change without a repick (or a re-tune) of the shipped table fails here."""
    assert _moves(SHIPPED) == []


def test_the_rule_change_after_the_tune_moves_only_the_cells_it_concerns():
    """Call 4's table was tuned before the tier's arms had to clear the margin to compete: under
    the final rule exactly potrf fp32 n = 4 at 256 and 4096 move, to a CUDA arm 6-8% faster."""
    moved = _moves(TUNED)
    assert [m.split(":")[0] for m in moved] == ["linalg|op=potrf|dt=fp32|n=4 batch=256",
                                                "linalg|op=potrf|dt=fp32|n=4 batch=4096"]
    assert all("-> cudas_p16_w2" in m for m in moved)


def test_a_point_without_the_statistic_keeps_its_winner_and_repick_is_idempotent():
    db = schema.load(TUNED, "linalg", "sm90")
    sig = next(s for s in db.entries if str(s) == "linalg|op=potrf|dt=fp32|n=4")
    entry = db.entries[sig]
    bare = {k: {a: v for a, v in p.items() if not a.startswith("_stat")} for k, p in entry.evidence.items()}
    kept = repick.repick_entry(type(entry)(**{**entry.__dict__, "evidence": bare}))
    assert kept.regions == entry.regions
    once = repick.repick(db)
    twice = repick.repick(once)
    assert table.moved_cells(once, twice, pick.TIE_BAND) == []
    assert {s: e.regions for s, e in once.entries.items()} == {s: e.regions for s, e in twice.entries.items()}


def test_the_command_reviews_writes_and_refuses_bad_input(tmp_path, capsys):
    work = tmp_path / "linalg.json"
    work.write_text(TUNED.read_text())
    before = work.read_bytes()
    assert cli.main(["linalg", "repick", "--table", str(work), "--dry-run"]) == 0
    assert "2 cell(s) move" in capsys.readouterr().out and work.read_bytes() == before
    out = tmp_path / "new" / "linalg.json"
    assert cli.main(["linalg", "repick", "--table", str(work), "--out", str(out)]) == 0
    assert work.read_bytes() == before and _moves(out) == []
    assert json.loads(out.read_text())["model"]["repick"]["dep_tie_band"] == pick.DEP_MARGIN
    for argv, why in ((["--table", str(tmp_path / "none.json")], "is not a file"),
                      (["--table", str(work), "--margin", "2"], "must be a fraction")):
        assert cli.main(["linalg", "repick", *argv]) == 2
        assert why in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    assert cli.main(["linalg", "repick", "--table", str(bad)]) == 2  # named, never overwritten
    err = capsys.readouterr().err
    assert "bad.json" in err and "not valid JSON" in err and bad.read_text() == "{ not json"


def test_repick_never_overwrites_a_file_that_is_not_a_linalg_table(tmp_path, capsys):
    work = tmp_path / "linalg.json"
    work.write_text(TUNED.read_text())
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    assert cli.main(["linalg", "repick", "--table", str(work), "--out", str(notes)]) == 2
    assert "not a readable linalg table" in capsys.readouterr().err and notes.read_text() == "my notes"
    again = tmp_path / "again.json"
    again.write_text(TUNED.read_text())  # an existing linalg table is replaced, as --out says
    assert cli.main(["linalg", "repick", "--table", str(work), "--out", str(again)]) == 0
    assert _moves(again) == []


def test_a_launch_jitter_longer_than_every_call_ties_instead_of_crashing(tmp_path, capsys):
    work = tmp_path / "linalg.json"
    work.write_text(TUNED.read_text())
    assert cli.main(["linalg", "repick", "--table", str(work), "--launch-jitter-ns", "1e9", "--dry-run"]) == 0
    assert "move under the current rule" in capsys.readouterr().out
    assert pick.noise_band(10.0, 0.02, 1e9) < 1.0


def test_a_repick_that_moves_nothing_leaves_the_file_byte_for_byte(tmp_path, capsys):
    # session 52's probe: every run rewrote the table with a new timestamp only
    import shutil

    from tunedb.cli import main

    path = tmp_path / "linalg.json"
    shutil.copy(Path(__file__).parents[2] / "src" / "tunedb" / "db" / "sm90" / "linalg.json", path)
    before = path.read_bytes()
    assert main(["linalg", "repick", "--table", str(path)]) == 0
    assert "unchanged: no cell moves" in capsys.readouterr().out
    assert path.read_bytes() == before
