"""The build's compile pool: sizing, the overlap of compiling with measuring, and that a pool
process fills Triton's cache under the same keys as compiling one after another."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tunedb import families, pipeline, settings
from tunedb.build import compile_pool
from tunedb.measure.timers import FakeTimer
from tunedb.records import SENTINELS, Point, ShapeSet, Signature

SIG_A = Signature.make("gemm", "gemm", "half", N=512, K=256)
SIG_B = Signature.make("gemm", "gemm", "half", N=1024, K=1024)


# ---------------------------------------------------------------- sizing

def test_pool_takes_the_cores_less_one_when_memory_allows():
    size = compile_pool.pool_size(cores=16, available=128 * 2**30, per_compile_mb=1024, override=None)
    assert size.jobs == 15 and "16 core(s)" in size.reason


def test_pool_shrinks_to_what_memory_holds():
    size = compile_pool.pool_size(cores=64, available=5 * 2**30 + 10, per_compile_mb=1024, override=None)
    assert size.jobs == 5 and "MemAvailable" in size.reason


def test_pool_never_drops_below_one_process():
    assert compile_pool.pool_size(cores=1, available=10, per_compile_mb=1024, override=None).jobs == 1


def test_environment_override_wins_and_zero_turns_the_pool_off(monkeypatch):
    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", "3")
    assert compile_pool.pool_size(cores=64, available=2**40).jobs == 3
    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", "0")
    assert compile_pool.for_build(families.get("gemm"), "sm90", [(SIG_A, ("b64x64x32_w4_s3_g8",))]) is None


def test_bad_pool_settings_name_the_value(monkeypatch):
    from tunedb.errors import SettingsError

    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", "many")
    with pytest.raises(SettingsError, match="TUNEDB_COMPILE_JOBS='many'"):
        compile_pool.pool_size()
    monkeypatch.delenv("TUNEDB_COMPILE_JOBS")
    monkeypatch.setenv("TUNEDB_COMPILE_MEM_MB", "0")
    with pytest.raises(SettingsError, match="TUNEDB_COMPILE_MEM_MB='0'"):
        compile_pool.pool_size()


def test_meminfo_is_read_in_bytes(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:  100 kB\nMemAvailable:   2048 kB\n")
    assert compile_pool.mem_available(info) == 2048 * 1024
    assert compile_pool.mem_available(tmp_path / "absent") is None


# ---------------------------------------------------------------- the pool and the build

@dataclass(frozen=True, order=True)
class MarkerJob:
    """A fake compile: sleeps, then leaves a marker the measuring side checks for."""

    root: str
    name: str
    delay: float = 0.05
    fail: bool = False

    def run(self) -> dict:
        time.sleep(self.delay)
        if self.fail:
            return {"ok": False, "error": "planted failure"}
        Path(self.root, self.name).write_text("compiled")
        return {"ok": True}


def marker(sig: Signature, cid: str) -> str:
    return f"{abs(hash(sig.format())) % 10**8}-{cid}"


def test_wait_blocks_only_for_the_points_own_jobs(tmp_path):
    slow = {("b", "x")}

    def make(sig, ids):
        return [MarkerJob(str(tmp_path), f"{sig}-{cid}".replace("|", "_"), 2.0 if (str(sig), cid) in slow else 0.0)
                for cid in ids]

    import concurrent.futures as cf

    work = [("a", ("x", "y")), ("b", ("x",)), ("a", ("x",))]  # a repeat is one job
    with cf.ThreadPoolExecutor(2) as ex:
        pool = compile_pool.CompilePool(make, work, 2, executor=ex)
        assert pool.stats.jobs == 3
        assert pool.wait("a", ["x", "y"]) < 1.0  # not held up by b's slow job
        assert (tmp_path / "a-x").exists() and (tmp_path / "a-y").exists()
        assert pool.wait("b", ["x"]) > 0.5 and (tmp_path / "b-x").exists()
        assert pool.wait("c", ["z"]) == 0.0  # nothing planned: nothing to wait for


def test_a_failed_compile_is_reported_not_raised(tmp_path):
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(1) as ex:
        pool = compile_pool.CompilePool(lambda sig, ids: [MarkerJob(str(tmp_path), "f", 0.0, fail=True)],
                                        [("s", ("c",))], 1, executor=ex)
        pool.wait("s", ["c"])
        time.sleep(0.05)  # the done callback runs in the executor's thread
    assert pool.stats.ok == 0 and pool.stats.failed and "planted failure" in pool.stats.failed[0]


def test_a_build_measures_each_point_after_its_configs_compiled_in_the_pool(tmp_path, monkeypatch):
    """The tune path with a real process pool and fake compile jobs: every Triton config a point
    measures was compiled before its measurement began, each (signature, config) once."""
    family = families.get("gemm")
    root = tmp_path / "compiled"
    root.mkdir()

    def compile_jobs(arch_family, sig, ids):
        return [MarkerJob(str(root), marker(sig, cid)) for cid in ids if cid not in SENTINELS]

    monkeypatch.setattr(family, "compile_jobs", compile_jobs, raising=False)
    early: list[tuple[str, str]] = []
    measured: set[tuple[str, str]] = set()

    def cost(sig, m, cid):
        if cid not in SENTINELS:
            measured.add((sig.format(), cid))
            if not (root / marker(sig, cid)).exists():
                early.append((sig.format(), cid))
        return 0.010 if cid == "torch" else 0.011 + (sum(map(ord, cid)) % 7) * 1e-5

    shapes = ShapeSet(tuple(Point(s, m, weight=1.0, calls=10) for s, ms in ((SIG_A, (16, 64)), (SIG_B, (8,)))
                            for m in ms))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user"), COMPILE_JOBS="2"):
        res = pipeline.build([("c", shapes)], pipeline.BuildOptions(out=str(tmp_path / "out"), top_k=4),
                             timer=FakeTimer(cost, noise_sigma=0.001, seed=1))
    assert measured and not early
    assert res.compile["processes"] == 2 and res.compile["ok"] == res.compile["jobs"] > 0
    planned = {(p.signature.format(), c) for p in res.plans for ids in p.arms.values() for c in ids
               if c not in SENTINELS}
    assert res.compile["jobs"] == len(planned)
    assert "compile wait" in res.phase_seconds


def test_a_build_with_a_timer_runs_no_pool_unless_asked(tmp_path, monkeypatch):
    family = families.get("gemm")
    monkeypatch.setattr(family, "compile_jobs", lambda *a: pytest.fail("compiled without a pool asked for"),
                        raising=False)
    shapes = ShapeSet((Point(SIG_A, 16, weight=1.0, calls=10),))
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        res = pipeline.build([("c", shapes)], pipeline.BuildOptions(out=str(tmp_path / "out"), top_k=2),
                             timer=FakeTimer(lambda s, m, c: 0.01, noise_sigma=0.001))
    assert res.compile == {}


# ---------------------------------------------------------------- the real compile (Triton, no GPU)

SERIAL = """
import json, sys
from tunedb.families.gemm import compile_jobs as cj
from tunedb.records import Signature
sig = Signature.parse(sys.argv[1])
out = [cj.jobs("sm90", sig, [cid], sys.argv[2])[0].run() for cid in sys.argv[3:]]
print(json.dumps([r["ok"] for r in out]))
"""


def _keys(cache: Path) -> set[str]:
    """Triton's cache entries: one directory per key, named by its hash; the files in it."""
    return {f"{d.name}/{f.name}" for d in cache.iterdir() if d.is_dir() for f in d.iterdir()}


@pytest.mark.slow
def test_the_pool_fills_the_cache_under_the_keys_a_serial_compile_uses(tmp_path):
    pytest.importorskip("triton")
    from tunedb.families.gemm import prebuild

    if prebuild.ptxas_problem(90):
        pytest.skip(prebuild.ptxas_problem(90))
    sig = Signature.make("gemm", "gemm", "bf16", N=256, K=264)  # K not a multiple of 16: the other class
    ids = ["b64x64x32_w4_s3_g8", "sk2_b16x32x64_w4_s4"]
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=os.pathsep.join(sys.path))
    serial = tmp_path / "serial"
    out = subprocess.run([sys.executable, "-c", SERIAL, sig.format(), str(serial), *ids], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and json.loads(out.stdout.strip().splitlines()[-1]) == [True, True], out.stderr[-2000:]
    pooled = tmp_path / "pooled"
    # the build's own path: the family's pool (compile_warm in each process), the cache from the environment
    code = ("import sys, json; from tunedb.build import compile_pool as cp; from tunedb import families;"
            "from tunedb.records import Signature;"
            "sig = Signature.parse(sys.argv[1]); ids = sys.argv[3:];"
            "pool = cp.for_build(families.get('gemm'), 'sm90', [(sig, ids[:1]), (sig, ids)]);"
            "pool.wait(sig, ids); pool.close(wait=True);"
            "print(json.dumps([pool.stats.ok, pool.stats.failed]))")
    out = subprocess.run([sys.executable, "-c", code, sig.format(), str(pooled), *ids],
                         env=dict(env, TRITON_CACHE_DIR=str(pooled), TUNEDB_COMPILE_JOBS="2"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ok, failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert ok == 2 and not failed
    assert _keys(serial) and _keys(pooled) == _keys(serial)
    assert any(k.endswith(".cubin") for k in _keys(pooled))


def test_prestarted_processes_are_taken_over_by_the_build(tmp_path, monkeypatch):
    family = families.get("gemm")
    monkeypatch.setattr(family, "compile_jobs", lambda arch, sig, ids: [MarkerJob(str(tmp_path), c, 0.0) for c in ids],
                        raising=False)
    monkeypatch.setattr(family, "compile_warm", lambda: None, raising=False)
    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", "0")
    assert not compile_pool.prestart(family)  # the pool is off
    monkeypatch.setenv("TUNEDB_COMPILE_JOBS", "2")
    assert compile_pool.prestart(family) and not compile_pool.prestart(family)
    started = compile_pool._PRESTARTED[family.name][0]
    pool = compile_pool.for_build(family, "sm90", [(SIG_A, ("p", "q"))])
    try:
        assert pool._pool is started and family.name not in compile_pool._PRESTARTED
        pool.wait(SIG_A, ["p", "q"])
        assert (tmp_path / "p").exists() and (tmp_path / "q").exists()
    finally:
        pool.close(wait=True)


@dataclass(frozen=True, order=True)
class CrashJob:
    """A compile that kills its process (as a compiler crash would)."""

    name: str

    def run(self) -> dict:
        os._exit(3)


def test_a_crashed_pool_process_fails_its_jobs_and_the_pool_stops_taking_work():
    pool = compile_pool.CompilePool(lambda sig, ids: [CrashJob(c) for c in ids], [("s", ("a",))], 1)
    try:
        pool.wait("s", ["a"])
        time.sleep(0.2)
        assert pool.stats.ok == 0 and pool.stats.failed
        pool.add([("s", ("b",))])  # refused quietly: the measuring worker compiles it at its probe
        assert pool.broken and pool.wait("s", ["b"]) == 0.0
    finally:
        pool.close()


def test_release_stops_prestarted_processes_no_build_takes(monkeypatch):
    family = families.get("gemm")

    class Executor:
        stopped = None

        def shutdown(self, wait=True, cancel_futures=False):
            Executor.stopped = (wait, cancel_futures)

    monkeypatch.setitem(compile_pool._PRESTARTED, family.name, (Executor(), 3))
    compile_pool.release(family)
    assert Executor.stopped == (False, True) and family.name not in compile_pool._PRESTARTED
    compile_pool.release(family)  # nothing prestarted: nothing to do


def test_a_pool_process_skips_the_interpreter_teardown_at_exit(tmp_path):
    """After compiling, a pool process's teardown took 0.6-1.1 s, which the build's exit waits
    for: its initializer makes its exit immediate. A handler registered before it would run
    after it at exit, so it never runs."""
    marker = tmp_path / "teardown-ran"
    code = ("import atexit, pathlib, sys\n"
            f"atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('ran'))\n"
            "from tunedb.build import compile_pool\n"
            "compile_pool._warm_process(sys.argv[1])\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(compile_pool.__file__).parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code, "linalg"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    done = subprocess.run([sys.executable, "-c", code.replace("compile_pool._warm_process(sys.argv[1])", "pass"),
                           "linalg"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and marker.exists()  # the control: without it the handler runs
