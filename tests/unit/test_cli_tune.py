"""`tunedb tune`: without a GPU it prints the plan and measures nothing; with --simulate it runs
the whole chain (census -> build into the user tier -> evaluate) on the CPU."""
from __future__ import annotations

import pytest

from tunedb import database, pipeline, settings
from tunedb.cli import main
from tunedb.errors import DatabaseError
from tunedb.records import Point, ShapeSet, Signature

QKV = Signature.make("gemm", "gemm", "half", N=512, K=512)
FFN = Signature.make("gemm", "gemm", "half", N=2048, K=512)
# what `tunedb tune` censuses by default: the calls tunedb.optimize(model) makes (fc1 + GELU fused)
FFN_FUSED = Signature.make("gemm", "gemm_act", "half", N=2048, K=512, act="gelu", bias=1)
BMM = Signature.make("gemm", "bmm", "half", B=8, N=64, K=1500)


@pytest.fixture
def tiers(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def test_tune_whisper_base_without_a_gpu_prints_the_plan(tiers, monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    (tiers / "empty-system").mkdir()
    with database.system_root_override(tiers / "empty-system"):  # no entry: the model answers
        assert main(["tune", "whisper-base"]) == 0
    out = capsys.readouterr().out
    assert "No GPU: nothing was measured." in out
    assert "census of whisper-base" in out and "what tunedb would serve on sm90" in out
    assert "points per tier:" in out
    ffn = [line for line in out.splitlines() if FFN_FUSED.format() + " " in line]
    assert len(ffn) == 4 and all(" model " in line for line in ffn)  # the FFN up-projection at 4 Ms
    assert not (tiers / "user").exists()  # nothing measured, nothing written
    assert not (tiers / "cache" / "runs").exists()


def test_the_shipped_system_tier_serves_whisper_base_on_sm90(tiers, monkeypatch, capsys):
    monkeypatch.setattr(pipeline, "has_gpu", lambda: False)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["tune", "whisper-base", "--arch", "sm90"]) == 0
    out = capsys.readouterr().out
    for sig in (QKV, FFN_FUSED):
        rows = [line for line in out.splitlines() if sig.format() + " " in line]
        assert len(rows) == 4 and all(" system " in line for line in rows)
    assert "No GPU: nothing was measured." in out


def test_served_plan_names_each_points_tier(tiers):
    system = tiers / "system"
    entry = {"regions": [[None, "torch"]], "source": "build"}
    (system / "sm90").mkdir(parents=True)
    (system / "sm90" / "gemm.json").write_text(
        '{"schema": 1, "kernel_family": "gemm", "arch_family": "sm90", "validators": {}, "configs": {}, '
        '"entries": {"%s": %s}}' % (QKV.format(), str(entry).replace("'", '"').replace("None", "null")))
    shapes = ShapeSet((Point(QKV, 1500), Point(FFN, 1500), Point(BMM, 1500)))
    with database.system_root_override(system), settings.override(MODEL_FALLBACK="auto"):
        served = {(s.point.signature, s.tier): s.config_id for s in pipeline.plan_served(shapes, "sm90")}
        assert served[(QKV, "system")] == "torch"
        assert (FFN, "model") in served and served[(FFN, "model")] != "default"
        assert served[(BMM, "unserved")] == "-"
        with settings.override(MODEL_FALLBACK="0"):
            served = {(s.point.signature, s.tier) for s in pipeline.plan_served(shapes, "sm90")}
        assert (FFN, "default") in served


def test_simulated_tune_runs_the_chain_into_the_user_tier(tiers):
    shapes = ShapeSet((Point(QKV, 16, 0.5, 10), Point(QKV, 40, 0.5, 10), Point(BMM, 16, 0.0, 1)))
    opts = pipeline.BuildOptions(out="user", simulate=True, top_k=4)
    res = pipeline.tune("toy", opts, shapes=shapes)
    assert res.measured and res.build is not None
    path = tiers / "user" / "sm90" / "gemm.json"
    assert res.build.path == path
    db = database.load(path)
    assert set(db.entries) == {QKV}  # bmm is not an op of the gemm family: skipped, said so
    assert res.build.skipped == (BMM.format(),)
    ev = res.evaluation
    assert ev is not None and {s.name for s in ev.summaries} == {"default", "torch", "cost model", "tuned"}
    # the tuned file's pick was measured at every point, and never loses to torch by the gate
    tuned, torch = ev.summary("tuned"), ev.summary("torch")
    assert tuned.unmeasured == 0 and tuned.geomean <= torch.geomean + 1e-9
    # the log lives in the run directory for --out user
    assert res.build.log_path.parent.parent == tiers / "cache" / "runs"


def test_tune_with_user_tier_off_explains(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path), USER_DB="off"):
        shapes = ShapeSet((Point(QKV, 16),))
        with pytest.raises(DatabaseError, match="user tier is disabled"):
            pipeline.tune("toy", pipeline.BuildOptions(out="user", simulate=True, top_k=2), shapes=shapes)


def test_tune_measures_a_smaller_top_k_than_a_system_build():
    """On-demand tuning trades the last 0.1% of regret for ~40% fewer arms (BENCHMARKS.md,
    bench/topk_regret.py); a system-tier build keeps 16. An explicit --top-k wins in both."""
    from tunedb.cli import build_parser
    from tunedb.commands.build import options_from

    tune = build_parser().parse_args(["tune", "whisper-base"])
    build = build_parser().parse_args(["build", "--census", "c.json", "--out", "user"])
    assert (options_from(tune).top_k, options_from(build).top_k) == (8, 16)
    assert options_from(build_parser().parse_args(["tune", "whisper-base", "--top-k", "12"])).top_k == 12


class PrestartSpy:
    def __init__(self):
        self.closed = 0

    def close(self, wait=True):
        self.closed += 1


def test_on_a_gpu_the_worker_starts_before_the_census_and_the_build_takes_it(tiers, monkeypatch):
    from tunedb.build import steps as buildsteps
    order, spy = [], PrestartSpy()
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(buildsteps, "start_worker", lambda opts, gpu: order.append(("start", gpu)) or spy)
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: order.append("census") or
                        ShapeSet((Point(QKV, 16, 1.0, 10),)))
    monkeypatch.setattr(pipeline, "build", lambda censuses, opts, reporter=None, worker=None:
                        order.append(("build", worker)) or pipeline.BuildResult(()))
    pipeline.tune("toy", pipeline.BuildOptions(out="user"))
    assert order == [("start", True), "census", ("build", spy)]
    assert spy.closed == 1  # closed when the build is done (idempotent after the build's own close)

    def refused(censuses, opts, reporter=None, worker=None):
        raise DatabaseError("user tier is off")

    monkeypatch.setattr(pipeline, "build", refused)
    with pytest.raises(DatabaseError):
        pipeline.tune("toy", pipeline.BuildOptions(out="user"))
    assert spy.closed == 2  # a build that fails before measuring leaves no worker running


@pytest.mark.parametrize("opts, gpu", [
    (pipeline.BuildOptions(out="user"), False),
    (pipeline.BuildOptions(out="user", dry_run=True), True),
    (pipeline.BuildOptions(out="user", simulate=True), True),
    (pipeline.BuildOptions(out="user", isolate=False), True),
])
def test_no_worker_is_started_where_nothing_is_measured_in_one(opts, gpu):
    from tunedb.build import steps as buildsteps
    assert buildsteps.start_worker(opts, gpu) is None


def test_the_cli_starts_the_worker_before_its_census_and_hands_it_to_the_tune(tiers, monkeypatch, capsys):
    from tunedb.build import steps as buildsteps
    order, spy = [], PrestartSpy()
    monkeypatch.setattr(pipeline, "has_gpu", lambda: True)
    monkeypatch.setattr(buildsteps, "start_worker", lambda opts, gpu: order.append("start") or spy)
    monkeypatch.setattr(pipeline, "take_census", lambda w, **kw: order.append("census") or
                        ShapeSet((Point(QKV, 16, 1.0, 10),)))

    def fake_tune(workload, opts, shapes=None, reporter=None, worker=None):
        order.append(("tune", worker))
        return pipeline.TuneResult(shapes)

    monkeypatch.setattr(pipeline, "tune", fake_tune)
    assert main(["tune", "whisper-base"]) == 0
    assert order == ["start", "census", ("tune", spy)]
