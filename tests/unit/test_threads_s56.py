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
