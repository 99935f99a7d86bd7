"""Simulated results (cost model plus noise) never serve (issue 17): `--simulate` writes to a
directory the user names or a temporary one, never a tier; a tier file holding simulated entries
is skipped with a warning, like a hard mismatch, and `tunedb status` says why."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedb import cli, database, pipeline, settings
from tunedb.runtime import selector
from tunedb.errors import BuildError, DatabaseWarning
from tunedb.records import Point, ShapeSet, Signature

DATA = Path(__file__).resolve().parents[1] / "data" / "db"
QKV = Signature.make("gemm", "gemm", "half", N=512, K=256)


@pytest.fixture
def tiers(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def simulated_user_file(user: Path) -> Path:
    raw = json.loads((DATA / "a.json").read_text())
    for entry in raw["entries"].values():
        entry["source"] = "simulated"
    path = user / "sm90" / "gemm.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(raw))
    return path


def test_a_tier_file_with_simulated_entries_is_skipped_with_a_warning(tiers):
    path = simulated_user_file(tiers / "user")
    database.reload()
    with pytest.warns(DatabaseWarning, match="simulated, not measured"):
        usable = database.lookup("sm90", "gemm")
    assert all(res.tier != "user" for res in usable)
    res = database.load_file("user", path, "gemm", "sm90")
    assert res.state == "simulated" and not res.usable and "--simulate" in res.problem
    with pytest.warns(DatabaseWarning):
        database.reload()
        assert selector.peek("gemm", QKV, 16).tier != "user"


def test_status_shows_the_simulated_file_skipped(tiers, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    simulated_user_file(tiers / "user")
    assert cli.main(["status", "--json", "--arch", "sm90"]) == 0
    rep = json.loads(capsys.readouterr().out)
    (user,) = [t for t in rep["tiers"] if t["tier"] == "user"]
    (f,) = user["files"]
    assert f["state"] == "simulated" and "source 'simulated'" in f["problem"]


@pytest.mark.parametrize("out", ["user", "system"])
def test_a_simulated_build_refuses_a_tier(tiers, out):
    with pytest.raises(BuildError, match=f"--simulate refuses --out {out}: a tier serves measured results only"):
        pipeline.build([("c", ShapeSet((Point(QKV, 16, 1.0, 4),)))],
                       pipeline.BuildOptions(out=out, simulate=True, top_k=2))


def test_tune_simulate_writes_to_a_temporary_directory_not_the_user_tier(tiers, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(pipeline, "take_census",
                        lambda *a, **k: ShapeSet((Point(QKV, 16, 0.5, 4), Point(QKV, 40, 0.5, 4)), "toy",
                                                 (("mode", "offline"),)))
    monkeypatch.setattr("tempfile.tempdir", str(tiers))
    assert cli.main(["tune", "toy:model", "--simulate", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "--simulate: writing to the new temporary directory" in out and "it stays after this run" in " ".join(out.split()) and "not the user tier" in out
    assert not (tiers / "user").exists()
    (written,) = tiers.glob("tunedb-simulate-*/sm90/gemm.json")
    db = database.load(written)
    assert {e.source for e in db.entries.values()} == {"simulated"}


@pytest.mark.parametrize("where", ["user dir", "user file", "system file"])
def test_a_simulated_build_refuses_a_tier_named_by_path(tiers, where):
    """--out as a path inside a tier's directory is that tier: refused before anything is measured,
    and the tier's file keeps its bytes (session 33's CLI audit merged simulated entries into it)."""
    measured = tiers / "user" / "sm90" / "gemm.json"
    measured.parent.mkdir(parents=True)
    measured.write_text((DATA / "a.json").read_text())
    before = measured.read_bytes()
    out = {"user dir": str(tiers / "user"), "user file": str(measured),
           "system file": str(database.system_root() / "sm90" / "gemm.json")}[where]
    with pytest.raises(BuildError, match=r"--simulate refuses --out .* lies in the (user|system) tier"):
        pipeline.build([("c", ShapeSet((Point(QKV, 16, 1.0, 4),)))],
                       pipeline.BuildOptions(out=out, simulate=True, top_k=2, arch_family="sm90"))
    assert measured.read_bytes() == before


def test_a_simulated_build_never_merges_into_measured_entries(tiers):
    target = tiers / "elsewhere" / "sm90" / "gemm.json"
    target.parent.mkdir(parents=True)
    target.write_text((DATA / "a.json").read_text())
    before = target.read_bytes()
    census = [("c", ShapeSet((Point(QKV, 16, 1.0, 4),)))]
    with pytest.raises(BuildError, match="--simulate refuses to merge into .* measured entr"):
        pipeline.build(census, pipeline.BuildOptions(out=str(tiers / "elsewhere"), simulate=True, top_k=2,
                                                     arch_family="sm90"))
    assert target.read_bytes() == before
    # a new place takes it, and so does the same place with --fresh (the user asked to replace it)
    pipeline.build(census, pipeline.BuildOptions(out=str(tiers / "new"), simulate=True, top_k=2, arch_family="sm90"))
    assert {e.source for e in database.load(tiers / "new" / "sm90" / "gemm.json").entries.values()} == {"simulated"}
