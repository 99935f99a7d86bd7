"""`tunedb diff` after a resumed build (issue 17): a refitted cost model used to make the files
differ (exit 1) with only `~ file: model present -> present`. It is a measurement, like
evidence: reported with what moved, not counted."""
from __future__ import annotations

import json
from pathlib import Path

from tunedb import cli, database

DATA = Path(__file__).resolve().parents[1] / "data" / "db"
MODEL = {"schema": 1, "scale": 1.25, "setup_us": 0.4, "per_config": {"a": [1.0, 0.1], "b": [2.0, 0.2]},
         "fitted_on": 100}


def with_model(tmp_path: Path, name: str, model: dict, source: Path = DATA / "a.json") -> Path:
    raw = json.loads(source.read_text())
    raw["model"] = model
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


def test_a_refitted_model_is_reported_but_not_a_difference(tmp_path, capsys):
    refit = dict(MODEL, scale=1.5, per_config={"a": [1.1, 0.1], "b": [2.0, 0.2], "c": [3.0, 0.3]}, fitted_on=180)
    a, b = with_model(tmp_path, "a.json", MODEL), with_model(tmp_path, "b.json", refit)
    assert cli.main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("  file: model refit: fitted_on 100 -> 180; per_config: 1 changed, 1 added (2 -> 3); "
                      "scale 1.25 -> 1.5 (a refit from measurements; not counted as a difference)")
    assert out[1].endswith("agree")
    assert cli.main(["diff", "--json", str(a), str(b)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["same"] is True and data["changes"][0]["counted"] is False


def test_a_model_refit_beside_a_region_change_still_differs(tmp_path, capsys):
    a = with_model(tmp_path, "a.json", MODEL)
    b = with_model(tmp_path, "b.json", dict(MODEL, scale=2.0), DATA / "b.json")
    assert cli.main(["diff", str(a), str(b)]) == 1
    changes = database.diff(database.load(a), database.load(b))
    assert sum(not c.counted for c in changes) == 1 and sum(c.counted for c in changes) == 5


def test_a_model_the_run_time_would_skip_is_a_difference_in_one_short_line(tmp_path, capsys):
    a = with_model(tmp_path, "a.json", MODEL)
    b = with_model(tmp_path, "b.json", {"garbage": 1})
    assert cli.main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("~ file: model usable -> unusable: cost-model params") and len(out[0]) < 200
