"""The worker subprocess: a hung, raising or crashing request costs itself, never the run."""
import ctypes
import os
import time

import pytest

from tunedb.measure.worker import Worker
from tunedb.records import Status


class Echo:
    def __init__(self, value):
        self.value = value

    def __call__(self):
        return (self.value, os.getpid())


class Sleep:
    def __call__(self):
        time.sleep(60)


class Raise:
    def __call__(self):
        raise RuntimeError("kernel launch failed: too many resources requested")


class Exit:
    def __call__(self):
        os._exit(3)


class Segfault:
    def __call__(self):
        ctypes.string_at(0)


@pytest.fixture
def worker():
    w = Worker(timeout_s=30)
    yield w
    w.close()


def test_requests_run_in_one_subprocess(worker):
    a = worker.run(Echo(1))
    b = worker.run(Echo(2))
    assert a.status is Status.OK and a.value[0] == 1 and b.value[0] == 2
    assert a.value[1] == b.value[1] == worker.pid != os.getpid()
    assert worker.restarts == 0


def test_raise_costs_the_request_and_the_worker_lives_on(worker):
    first = worker.run(Echo(0)).value[1]
    res = worker.run(Raise())
    assert res.status is Status.LAUNCH_ERROR and "too many resources" in res.detail
    assert worker.run(Echo(1)).value[1] == first
    assert worker.restarts == 0


def test_timeout_kills_and_restarts(worker):
    first = worker.run(Echo(0)).value[1]
    res = worker.run(Sleep(), timeout_s=1.0)
    assert res.status is Status.TIMEOUT and "1 s" in res.detail
    after = worker.run(Echo(1))
    assert after.status is Status.OK and after.value[1] != first
    assert worker.restarts == 1


@pytest.mark.parametrize("request_, why", [(Exit(), "exited with code 3"),
                                           (Segfault(), "signal SIGSEGV")])
def test_crash_costs_the_request_and_the_worker_restarts(worker, request_, why):
    res = worker.run(request_)
    assert res.status is Status.LAUNCH_ERROR and why in res.detail
    assert worker.run(Echo(5)).value[0] == 5
    assert worker.restarts == 1


def test_bad_timeout_is_named():
    with pytest.raises(ValueError, match="timeout_s=0"):
        Worker(timeout_s=0)


def test_a_prestarted_worker_serves_the_next_request_in_the_same_process(worker):
    worker.prestart(Echo("start"))
    assert worker.starting and worker.alive()
    res = worker.run(Echo(1))  # collects the start's reply first, then runs
    assert not worker.starting and res.value[0] == 1
    assert res.value[1] == worker.pid and worker.restarts == 0
    worker.prestart(Echo("again"))  # a live worker is left alone
    assert not worker.starting and worker.run(Echo(2)).value[1] == res.value[1]


def test_wait_started_returns_the_start_reply_and_a_failed_start_is_its_status(worker):
    worker.prestart(Echo("start"))
    got = worker.wait_started()
    assert got.status is Status.OK and got.value[0] == "start"
    assert worker.wait_started().status is Status.OK  # nothing pending: OK, no wait
    worker.close()
    worker.prestart(Exit())
    died = worker.wait_started()
    assert died.status is Status.LAUNCH_ERROR and "exited with code 3" in died.detail
    assert worker.run(Echo(3)).value[0] == 3  # the next request gets a fresh worker
    worker.close()
    worker.prestart(Sleep(), timeout_s=1.0)
    hung = worker.wait_started()
    assert hung.status is Status.TIMEOUT and not worker.alive()


def test_closing_a_worker_still_starting_kills_it_at_once(worker):
    worker.prestart(Sleep())  # a start that would take a minute
    t0 = time.perf_counter()
    worker.close()
    assert time.perf_counter() - t0 < 5 and not worker.alive() and not worker.starting


def test_close_without_waiting_returns_at_once_and_the_worker_exits_in_the_background(worker):
    from tunedb.measure import gpuenv

    pid = worker.run(Echo(0)).value[1]
    assert pid in gpuenv._WORKERS
    t0 = time.perf_counter()
    worker.close(wait=False)
    assert time.perf_counter() - t0 < 0.5 and worker.pid is None and not worker.alive()
    from tunedb.measure.worker import wait_reaped

    wait_reaped()  # ours until it is gone
    assert pid not in gpuenv._WORKERS
    with pytest.raises(OSError):
        os.kill(pid, 0)  # reaped: no such process
    assert worker.run(Echo(1)).value[1] != pid  # a later request starts a fresh worker


def test_a_new_worker_starts_only_after_the_one_closed_without_waiting_is_gone(worker):
    from tunedb.measure import gpuenv

    old = worker.run(Echo(0)).value[1]
    worker.close(wait=False)
    new = worker.run(Echo(1)).value[1]  # starts a fresh worker: the old one's teardown is over
    assert new != old and old not in gpuenv._WORKERS and new in gpuenv._WORKERS
    with pytest.raises(OSError):
        os.kill(old, 0)
