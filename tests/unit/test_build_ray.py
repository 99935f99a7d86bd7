"""The multi-GPU build on a local Ray cluster of two logical GPUs with the fake timer: an actor
SIGKILLed mid-build costs only the point it held, re-run elsewhere; a killed driver resumes
with --run-id; both end in the regions of an uninterrupted one-GPU build; mixed SKUs are refused.
One cluster for the module (Ray starts in seconds, and CI has two cores)."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from tunedb import database, pipeline  # noqa: E402
from tunedb.build import distributed  # noqa: E402
from tunedb.errors import BuildError  # noqa: E402

CENSUS = Path(__file__).resolve().parents[2] / "bench" / "census" / "llama-3-8b_decode.json"
THIN = dict(thin=True, max_points=2)  # 5 signatures, ~40 arms each


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def regions(path: Path) -> dict[str, tuple]:
    f = database.load(path)
    return {sig.format(): e.regions for sig, e in f.entries.items()}


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> tuple[dict[str, tuple], int, Path]:
    """The uninterrupted one-GPU build (no Ray) every fault test must reproduce."""
    out = tmp_path_factory.mktemp("serial")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDB_CACHE_DIR", str(out / "cache"))
        res = pipeline.build([("llama", pipeline.read_census(CENSUS))],
                             pipeline.BuildOptions(out=str(out), simulate=True, **THIN))
    return regions(res.path), res.arms_measured, res.path


def test_killed_actor_costs_only_its_point(cluster, cache, serial, monkeypatch) -> None:
    killed: dict[str, object] = {}
    submit = distributed.RayBackend.submit

    def submit_then_kill(self, worker, task):
        if worker == 0 and "pid" not in killed:  # idle now: ask its pid before it gets work
            killed["pid"] = ray.get(self.actors[0].identity.remote())[1]
        submit(self, worker, task)
        if worker == 0 and "task" not in killed:
            killed["task"] = task.format()
            threading.Timer(0.4, os.kill, (killed["pid"], signal.SIGKILL)).start()

    monkeypatch.setattr(distributed.RayBackend, "submit", submit_then_kill)
    opts = pipeline.BuildOptions(out=str(cache / "db"), simulate=True, workers=2, simulate_delay_ms=25, **THIN)
    res = pipeline.build([("llama", pipeline.read_census(CENSUS))], opts)
    assert res.workers["0"]["dead"] and not res.workers["1"]["dead"]
    assert len(res.lost) == 1 and killed["task"] in res.lost[0] and str(killed["pid"]) in res.lost[0]
    # each point's arms went out once, plus its cross-evaluation; the live worker did the rest
    assert res.workers["1"]["points"] + res.workers["0"]["points"] >= sum(len(p.points) for p in res.plans)
    assert res.workers["1"]["points"] > res.workers["0"]["points"]
    assert regions(res.path) == serial[0]
    assert res.census_seconds["llama"] > 0  # the actors' GPU seconds (was 0.0: timed after they finished)
    # the killed attempt's measurements never reached the log: it holds the serial build's arms
    lines = (cache / "db" / "measurements.jsonl").read_text().splitlines()
    assert len(lines) == serial[1] <= res.arms_measured  # a whole re-measured point counts its discarded half too


def _build_cmd(out: Path, address: str, run_id: str, delay: float) -> list[str]:
    return [sys.executable, "-m", "tunedb", "build", "--census", str(CENSUS), "--simulate", "--thin",
            "--max-points", "2", "--out", str(out), "--ray", address, "--workers", "2", "--run-id", run_id,
            "--simulate-delay", str(delay), "--json"]


def test_killed_driver_resumes_with_run_id(cluster, cache, serial) -> None:
    env = {**os.environ, "TUNEDB_CACHE_DIR": str(cache / "cache")}
    out = cache / "db"
    finished = cache / "cache" / "runs" / "r1" / "finished"
    proc = subprocess.Popen(_build_cmd(out, cluster, "r1", 40), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if finished.is_dir() and len(list(finished.glob("*.json"))) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the build ended before it could be killed: {proc.communicate()[1][-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(list(finished.glob("*.json")))
    assert 2 <= done_before < 5 and not (out / "sm90" / "gemm.json").exists()
    again = subprocess.run(_build_cmd(out, cluster, "r1", 0), env=env, capture_output=True, text=True,
                           timeout=180)
    assert again.returncode == 0, again.stderr[-2000:]
    result = json.loads(again.stdout)
    assert len(result["resumed"]) == done_before
    assert len(result["workers"]) == 2 and sum(w["points"] for w in result["workers"].values()) > 0
    assert regions(out / "sm90" / "gemm.json") == serial[0]
    diff = subprocess.run([sys.executable, "-m", "tunedb", "diff", str(serial[2]), str(out / "sm90" / "gemm.json")],
                          env=env, capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout


def test_mixed_skus_are_refused(cluster, cache) -> None:
    opts = pipeline.BuildOptions(out=str(cache / "db"), simulate=True, workers=2)
    arch = pipeline.arch_profile("sm90", real=False)
    skus = ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    with pytest.raises(BuildError, match="NVIDIA H200 .sm90.*NVIDIA H100 80GB HBM3 .sm90"):
        distributed.measure_all([], opts, arch, {}, None, None, None, None, gpu=False,
                                identify=lambda i: ("sm90", skus[i]))


def test_remote_compiles_only_for_a_real_cluster_build() -> None:
    from tunedb import families
    from tunedb.build import remote_compile

    gemm = families.get("gemm")
    real = pipeline.BuildOptions(out="/x", ray="auto")
    assert remote_compile.wanted(real, gemm, gpu=True)
    assert not remote_compile.wanted(pipeline.BuildOptions(out="/x", workers=2), gemm, gpu=True)  # one host: the pool
    assert not remote_compile.wanted(real, gemm, gpu=False)
    assert not remote_compile.wanted(pipeline.BuildOptions(out="/x", ray="auto", simulate=True), gemm, gpu=True)


def test_install_writes_new_files_whole_and_never_overwrites(tmp_path) -> None:
    from tunedb.build import remote_compile

    (tmp_path / "k1").mkdir()
    (tmp_path / "k1" / "a.cubin").write_bytes(b"mine")
    n = remote_compile.install({"k1/a.cubin": b"theirs", "k2/b.json": b"{}"}, tmp_path)
    assert n == 1 and (tmp_path / "k1" / "a.cubin").read_bytes() == b"mine"
    assert (tmp_path / "k2" / "b.json").read_bytes() == b"{}"
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temp file left behind
    with pytest.raises(ValueError, match="outside the cache"):
        remote_compile.install({"../evil": b"x"}, tmp_path / "k1")


def test_an_actor_installs_its_signatures_binaries_once(cluster, cache, monkeypatch) -> None:
    from tunedb import settings
    from tunedb.records import Signature

    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache / "triton"))
    target = settings.triton_cache_dir()
    sig = Signature.make("gemm", "gemm", "bf16", N=256, K=256)
    ref = ray.put({"files": {"h1/k.cubin": b"bin", "h1/k.json": b"{}"}, "ok": 1, "failed": []})
    opts = pipeline.BuildOptions(out=str(cache / "db"), simulate=True)
    actor = distributed.MeasuringActor(0, opts, pipeline.arch_profile("sm90", real=False), {}, None, gpu=False)
    actor._install(sig, ref)
    assert (Path(target) / "h1" / "k.cubin").read_bytes() == b"bin"
    assert actor.compile_report() == {"signatures": 1, "files": 2, "install_s": pytest.approx(0.0, abs=5.0)}


SERIAL = """
import json, sys
from tunedb.families.gemm import compile_jobs as cj
from tunedb.records import Signature
sig = Signature.parse(sys.argv[1])
out = [cj.jobs("sm90", sig, [cid], sys.argv[2])[0].run() for cid in sys.argv[3:]]
print(json.dumps([r["ok"] for r in out]))
"""


@pytest.mark.slow
def test_a_cluster_compile_task_yields_the_binaries_a_local_compile_does(cluster, tmp_path) -> None:
    pytest.importorskip("triton")
    from tunedb.build import remote_compile
    from tunedb.families.gemm import prebuild
    from tunedb.records import Signature

    if prebuild.ptxas_problem(90):
        pytest.skip(prebuild.ptxas_problem(90))
    sig = Signature.make("gemm", "gemm", "bf16", N=256, K=256)
    ids = ["b64x64x32_w4_s3_g8"]
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=os.pathsep.join(sys.path))
    local = tmp_path / "local"
    out = subprocess.run([sys.executable, "-c", SERIAL, sig.format(), str(local), *ids], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and json.loads(out.stdout.strip().splitlines()[-1]) == [True], out.stderr[-2000:]
    task = ray.remote(num_cpus=1, num_gpus=0, max_calls=1)(remote_compile.compile_files)
    got = ray.get(task.options(runtime_env={"env_vars": {"TRITON_DEFAULT_FP_FUSION": "1"}})
                  .remote("gemm", "sm90", sig, ids), timeout=300)
    assert got["ok"] == 1 and not got["failed"]
    remote = tmp_path / "remote"
    assert remote_compile.install(got["files"], remote) == len(got["files"]) > 0

    def keys(d: Path) -> set[str]:
        return {f"{k.name}/{f.name}" for k in d.iterdir() if k.is_dir() for f in k.iterdir()}
    assert keys(remote) == keys(local) and any(k.endswith(".cubin") for k in keys(remote))



def test_backend_wait_returns_every_ended_task(cluster) -> None:
    # scheduler.Backend.wait: every task that ended, not only the first: a GPU whose result
    # waited behind another's would idle a whole driver turn, counted busy meanwhile
    from tunedb.build import point_tasks

    opts = pipeline.BuildOptions(out="/nonexistent", simulate=True, **THIN)
    plans = pipeline.build([("llama", pipeline.read_census(CENSUS))], dataclasses.replace(opts, dry_run=True)).plans
    arch = pipeline.arch_profile("sm90", real=False)
    remote = ray.remote(num_gpus=0, num_cpus=0)(distributed.MeasuringActor)
    actors = {i: remote.remote(i, opts, arch, {}, None, False) for i in range(3)}
    tasks = point_tasks.PointTasks(plans[:1], opts, None)
    backend = distributed.RayBackend(actors, tasks)
    try:
        first = [t for t, _ in tasks.tasks()]
        assert len(first) >= 2
        for i, task in enumerate(first[:3]):
            backend.submit(i, task)
        ray.wait(list(backend.pending), num_returns=len(backend.pending), timeout=60)
        got = backend.wait()
        assert sorted((o.worker, o.task) for o in got) == list(enumerate(first[:3]))
        assert all(not o.lost and o.value[0] for o in got) and not backend.pending
    finally:
        for a in actors.values():
            ray.kill(a)
