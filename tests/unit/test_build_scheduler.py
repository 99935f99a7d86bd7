"""The multi-GPU build's scheduler without Ray: assignment order, re-queue of a dead worker's
signature, completion, busy accounting, and the same-SKU check."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest

from tunedb.build import distributed
from tunedb.build.scheduler import MAX_LOSSES, Outcome, Scheduler, drive
from tunedb.errors import BuildError


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_largest_first_and_one_task_per_worker() -> None:
    clock = Clock()
    s = Scheduler.of([("a", 1.0), ("b", 5.0), ("c", 3.0), ("d", 5.0)], clock)
    s.add_worker(0)
    s.add_worker(1)
    assert s.assign(0) == "b" and s.assign(1) == "d"  # ties keep the given order
    with pytest.raises(BuildError, match="already holds"):
        s.assign(0)
    clock.t = 2.0
    s.complete(1, "d")
    assert s.assign(1) == "c"
    with pytest.raises(BuildError, match="did not hold"):
        s.complete(0, "c")
    clock.t = 4.0
    s.complete(0, "b")
    s.complete(1, "c")
    assert s.assign(0) == "a"
    clock.t = 5.0
    s.complete(0, "a")
    assert s.done() and s.assign(1) is None
    assert s.finished == {"d": 1, "b": 0, "c": 1, "a": 0}
    assert s.busy_fractions() == {0: 1.0, 1: 0.8}
    assert s.workers[0].tasks == 2 and s.workers[1].busy_s == 4.0


def test_dead_worker_loses_only_its_task_which_goes_first() -> None:
    clock = Clock()
    s = Scheduler.of([("a", 3.0), ("b", 2.0), ("c", 1.0)], clock)
    for w in (0, 1):
        s.add_worker(w)
    assert (s.assign(0), s.assign(1)) == ("a", "b")
    clock.t = 1.0
    s.complete(1, "b")
    assert s.lose(0) == "a"
    assert s.alive() == [1] and s.workers[0].lost == "a" and s.workers[0].busy_s == 1.0
    assert s.assign(1) == "a"  # the lost task is re-queued ahead of the rest
    s.complete(1, "a")
    assert s.assign(1) == "c"
    s.complete(1, "c")
    assert s.done() and set(s.finished) == {"a", "b", "c"} and s.finished["a"] == 1
    with pytest.raises(BuildError, match="not alive"):
        s.assign(0)
    assert s.lose(1) is None  # an idle worker's death costs nothing


def test_a_task_that_keeps_killing_workers_stops_the_build() -> None:
    s = Scheduler.of([("poison", 1.0)])
    for w in range(MAX_LOSSES):
        s.add_worker(w)
    for w in range(MAX_LOSSES - 1):
        assert s.assign(w) == "poison" and s.lose(w) == "poison"
    s.assign(MAX_LOSSES - 1)
    with pytest.raises(BuildError, match="poison lost its worker 3 times"):
        s.lose(MAX_LOSSES - 1)


class FakeBackend:
    """Runs tasks instantly; `die` names (worker, task) pairs whose worker dies holding it."""

    def __init__(self, die: set[tuple[int, str]]) -> None:
        self.die, self.pending, self.submitted = die, deque(), []

    def submit(self, worker: int, task: str) -> None:
        self.submitted.append((worker, task))
        self.pending.append((worker, task))

    def wait(self) -> list[Outcome]:
        worker, task = self.pending.popleft()
        if (worker, task) in self.die:
            return [Outcome(worker, task, lost=True)]
        return [Outcome(worker, task, value=task.upper())]


def test_drive_requeues_to_a_live_worker_and_reports_each_result_once() -> None:
    s = Scheduler.of([(t, float(i)) for i, t in enumerate("abcde")])
    for w in (0, 1, 2):
        s.add_worker(w)
    backend = FakeBackend(die={(1, "d")})
    got, lost = [], []
    drive(s, backend, lambda w, t, v: got.append((t, v)), lost.append)
    assert sorted(got) == [(t, t.upper()) for t in "abcde"]
    assert [(o.worker, o.task) for o in lost] == [(1, "d")]
    assert [w for w, t in backend.submitted if t == "d"][1] != 1  # re-run elsewhere
    assert all(w != 1 for w, _ in backend.submitted[backend.submitted.index((1, "d")) + 1:])


def test_drive_refuses_to_hang_when_every_worker_died() -> None:
    s = Scheduler.of([("a", 2.0), ("b", 1.0)])
    s.add_worker(0)
    with pytest.raises(BuildError, match="every measuring worker died.*--run-id"):
        drive(s, FakeBackend(die={(0, "a")}), lambda *a: None)


def test_mixed_gpus_are_refused_naming_both() -> None:
    assert distributed.check_same_gpus({0: ("sm90", "NVIDIA H200"), 1: ("sm90", "NVIDIA H200")}) == (
        "sm90", "NVIDIA H200")
    with pytest.raises(BuildError, match=r"worker 0 has NVIDIA H200 \(sm90\), worker 1 has "
                                         r"NVIDIA H100 80GB HBM3 \(sm90\)"):
        distributed.check_same_gpus({0: ("sm90", "NVIDIA H200"), 1: ("sm90", "NVIDIA H100 80GB HBM3")})
    with pytest.raises(BuildError, match="NVIDIA A100.*sm80"):
        distributed.check_same_gpus({0: ("sm90", "NVIDIA H200"), 1: ("sm80", "NVIDIA A100")})


CENSUS = Path(__file__).resolve().parents[2] / "bench" / "census" / "llama-3-8b_decode.json"


def test_plain_build_does_not_import_ray(tmp_path) -> None:
    code = f"""
import sys
from tunedb import cli
rc = cli.main(['build', '--census', {str(CENSUS)!r}, '--simulate', '--thin', '--max-points', '2',
               '--out', {str(tmp_path / 'db')!r}, '--json'])
sys.exit(rc or (3 if 'ray' in sys.modules else 0))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TUNEDB_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "db" / "sm90" / "gemm.json").exists()


def test_flag_errors() -> None:
    from tunedb.pipeline import BuildOptions

    with pytest.raises(BuildError, match="--in-process"):
        distributed.check_options(BuildOptions(workers=2, isolate=False))
    with pytest.raises(BuildError, match="--simulate-delay needs"):
        distributed.check_options(BuildOptions(simulate_delay_ms=5.0))
    with pytest.raises(BuildError, match="--workers=-1"):
        distributed.check_options(BuildOptions(workers=-1))
    assert not distributed.wanted(BuildOptions()) and distributed.wanted(BuildOptions(ray="auto"))


def test_pinned_tasks_wait_for_their_worker_until_it_dies() -> None:
    s = Scheduler.of([("a", 2.0), ("b", 1.0)])
    for w in (0, 1):
        s.add_worker(w)
    assert s.assign(0) == "a"
    s.add("a2", 1.0, front=True, pin=0)  # ready while 0 still runs: only 0 may take it
    assert s.assign(1) == "b"
    s.complete(1, "b")
    assert s.assign(1) is None and list(s.queue) == ["a2"]
    s.complete(0, "a")
    assert s.assign(0) == "a2"
    s.add("a3", pin=0)
    assert s.lose(0) == "a2"  # a dead worker's pins go to anyone, its lost task first
    assert s.assign(1) == "a2"
    s.complete(1, "a2")
    assert s.assign(1) == "a3"
    with pytest.raises(BuildError, match="given twice"):
        s.add("a3")


def test_a_group_stays_with_its_first_worker_until_the_tail_is_stolen() -> None:
    # two signatures x (3, 2) points, the bigger first
    s = Scheduler.of([("a1", 3.0), ("a2", 3.0), ("a3", 3.0), ("b1", 2.0), ("b2", 2.0)],
                     group=lambda t: t[0])
    for w in (0, 1):
        s.add_worker(w)
    assert (s.assign(0), s.assign(1)) == ("a1", "b1")  # 1 skips a's points: 0 owns a
    s.complete(1, "b1")
    assert s.assign(1) == "b2" and s.stolen == 0
    s.complete(1, "b2")
    assert s.assign(1) == "a3" and s.stolen == 1  # nothing of its own or unowned: the last of a
    s.complete(0, "a1")
    assert s.assign(0) == "a2"
    assert s.owners == {"a": 0, "b": 1}
    assert s.lose(0) == "a2"  # a dead owner's group is anyone's
    s.complete(1, "a3")
    assert s.assign(1) == "a2" and s.owners["a"] == 1


def test_a_task_pinned_to_a_worker_comes_before_its_other_work() -> None:
    # 1 stole a point of a (0 owns a); a's cross-evaluation of that point is pinned to 1 and is
    # all a lacks: 1 takes it before its own group's tasks, before an unowned group, and it is
    # not a steal (the pin, not the group, says who measures it)
    s = Scheduler.of([("a1", 3.0), ("a2", 3.0), ("b1", 2.0), ("b2", 2.0), ("c1", 1.0)], group=lambda t: t[0])
    for w in (0, 1):
        s.add_worker(w)
    assert (s.assign(0), s.assign(1)) == ("a1", "b1")
    s.add("ax", front=True, pin=1)
    s.complete(1, "b1")
    assert s.assign(1) == "ax" and s.stolen == 0  # not b2 (its own group's)
    s.complete(1, "ax")
    assert s.assign(1) == "b2"
    s.complete(1, "b2")
    s.add("ay", pin=1)  # at the back, behind the unowned group c
    assert s.assign(1) == "ay" and s.stolen == 0 and s.owners == {"a": 0, "b": 1}
