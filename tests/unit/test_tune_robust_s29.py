"""A bad --run-id is refused before anything is written (session 29): `tunedb tune --simulate
--run-id 'bad id!' --out DIR` took the census and left DIR/sm90/gemm.json.lock behind before
naming the run id."""
import pytest

from tunedb import cli
from tunedb.build import steps
from tunedb.commands import tune
from tunedb.errors import BuildError


def test_a_bad_run_id_is_refused_before_the_census_and_the_out_directory(tmp_path, monkeypatch):
    args = cli.build_parser().parse_args(["tune", "whisper-base", "--simulate", "--run-id", "bad id!",
                                          "--out", str(tmp_path / "out")])
    with pytest.raises(BuildError, match="bad run id 'bad id!'"):
        steps.check_options(tune.options_from(args), gpu=False)
    monkeypatch.setattr("tunedb.pipeline.take_census", lambda *a, **k: pytest.fail("the census ran"))
    with pytest.raises(BuildError, match="bad run id"):
        tune.run(args)
    assert not (tmp_path / "out").exists()
