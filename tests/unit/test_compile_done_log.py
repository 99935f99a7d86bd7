"""The compile pool's done log: a job an earlier pool compiled into this cache is not sent to a
process again; a log of another fingerprint, or an unreadable one, knows nothing."""
from __future__ import annotations

import concurrent.futures as cf
import json

from tunedb.build import compile_pool
from tunedb.records import Signature

SIG = Signature.make("gemm", "gemm", "bf16", N=64, K=64)


class _Job:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Job({self.name})"

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, _Job) and other.name == self.name

    def run(self):
        return {"ok": True, "seconds": 0.01}


def _pool(done, ids):
    return compile_pool.CompilePool(lambda sig, cids: [_Job(c) for c in cids], [(SIG, ids)], 1,
                                    executor=cf.ThreadPoolExecutor(1), own=True, done=done)


def test_a_warm_pool_skips_what_the_last_one_compiled(tmp_path):
    path = tmp_path / "tunedb-compiled-gemm.json"
    pool = _pool(compile_pool.DoneLog(path, "fp1"), ("a", "b"))
    pool.wait(SIG, ("a", "b"))
    pool.close(wait=True)
    assert pool.stats.ok == 2 and pool.stats.skipped == 0
    assert json.loads(path.read_text()) == {"fingerprint": "fp1", "jobs": ["Job(a)", "Job(b)"]}
    warm = _pool(compile_pool.DoneLog(path, "fp1"), ("a", "b", "c"))
    warm.wait(SIG, ("a", "b", "c"))
    warm.close(wait=True)
    assert warm.stats.skipped == 2 and warm.stats.ok == 1 and warm.stats.jobs == 1
    assert "2 compiled by an earlier build" in compile_pool.describe(compile_pool.report(warm))
    # another kernel source or compiler: the log knows nothing
    other = _pool(compile_pool.DoneLog(path, "fp2"), ("a",))
    other.wait(SIG, ("a",))
    other.close(wait=True)
    assert other.stats.skipped == 0 and other.stats.ok == 1


def test_an_unreadable_log_knows_nothing_and_is_replaced(tmp_path):
    path = tmp_path / "log.json"
    path.write_text("{not json")
    log = compile_pool.DoneLog(path, "fp")
    assert not log.has(_Job("a"))
    log.add(_Job("a"))
    log.save()
    assert compile_pool.DoneLog(path, "fp").has(_Job("a"))


def test_pool_processes_start_at_a_lower_priority():
    import multiprocessing
    import os

    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(1, mp_context=ctx, initializer=compile_pool._warm_process,
                                initargs=("gemm",)) as ex:
        assert ex.submit(os.nice, 0).result() >= os.nice(0) + compile_pool.NICE
