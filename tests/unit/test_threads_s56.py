"""optimize() in a serving process's threads (session 56 probe): the families="all" switch was a
module global that two threads saved and restored out of order (left on for the rest of the
process), and the report's registries changed while another thread iterated them."""
from __future__ import annotations

import threading

import torch
from torch import nn

import tunedb
from tunedb.runtime import patching, report


def test_the_patch_everything_switch_is_per_thread():
    inside, release, seen = threading.Event(), threading.Event(), {}
    original = patching.hook

    def slow_hook(fam, name):
        fn = original(fam, name)

        def wrapped(model, **kw):
            if getattr(model, "_slow", False):
                inside.set()
                release.wait(30)
            return fn(model, **kw)
        return wrapped

    patching.hook = slow_hook
    try:
        slow = nn.Sequential(nn.Linear(8, 8))
        slow._slow = True
        t = threading.Thread(target=lambda: tunedb.optimize(slow, families="all"))
        t.start()
        assert inside.wait(30)
        seen["other thread"] = patching.patching_everything()  # thread A is inside "all"; this one is not
        tunedb.optimize(nn.Sequential(nn.Linear(8, 8)))
        release.set()
        t.join(30)
    finally:
        patching.hook = original
        release.set()
    assert seen["other thread"] is False and patching.patching_everything() is False


def test_registrations_in_many_threads_keep_the_registries_whole():
    errors, keep = [], []

    def work():
        try:
            for _ in range(300):
                m = nn.Linear(2, 2)
                keep.append(m)  # live: every registration iterates over all of them
                report.register_model(m, [], left=[(m, ("k",), False)], why="torch serves every size")
                report.register_unpatched(m, "gemm", {"hooked": 1})
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)

    import sys

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert all(report.registered(m) for m in keep)
    assert len(report.unpatched_lines()) >= len(keep)


def test_optimize_in_many_threads_registers_every_model():
    errors, models = [], []

    def work():
        try:
            for _ in range(30):
                models.append(tunedb.optimize(nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)))
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert all(report.registered(m) for m in models)


def _slow_measurer(calls, started=None, sleep=0.3):
    import time

    from tunedb.records import Measurement, Status

    def measure(family, sig, m, ids, incumbent):
        calls.append((str(sig), m))
        if started is not None:
            started.set()
        time.sleep(sleep)  # a measurement takes a while, as a real one does
        best = [c for c in ids if c not in ("torch", "default", "fused")][0]
        return [Measurement(sig, m, c, Status.OK, 1.0 if c == best else 2.0, 0.01, 9,
                            ((1.0 if c == best else 2.0),) * 9) for c in ids]
    return measure


def test_concurrent_requests_measure_a_shape_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDB_USER_DB", str(tmp_path / "user"))
    calls = []
    model = tunedb.optimize(nn.Sequential(nn.Linear(64, 96)).to(torch.bfloat16).eval())

    def serve():
        with torch.inference_mode():
            model(torch.randn(16, 64, dtype=torch.bfloat16))

    with tunedb.autotune(cache=None, measurer=_slow_measurer(calls), arch_family="sm90") as tuner:
        threads = [threading.Thread(target=serve) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(calls) == 1 and len(tuner.measured) == 1


def test_an_exit_waits_for_the_measurement_in_flight(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDB_USER_DB", str(tmp_path / "user"))
    calls, started = [], threading.Event()
    model = tunedb.optimize(nn.Sequential(nn.Linear(64, 112)).to(torch.bfloat16).eval())
    cache = tmp_path / "tune.json"
    tuner = tunedb.autotune(cache=str(cache), measurer=_slow_measurer(calls, started, 1.0), arch_family="sm90")
    tuner.__enter__()

    def serve():
        with torch.inference_mode():
            model(torch.randn(16, 64, dtype=torch.bfloat16))

    t = threading.Thread(target=serve)
    t.start()
    assert started.wait(30)
    tuner.__exit__(None, None, None)  # while the thread measures
    t.join(60)
    assert len(calls) == 1 and tuner.measured == [] and cache.exists()  # flushed: published and saved
