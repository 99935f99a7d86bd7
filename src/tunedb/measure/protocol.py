"""The measurement protocol: gate, then time arms in shuffled interleaved rounds with halving.

``measure_point`` (a KernelFamily's configs) and ``measure_problem`` (any Problem, e.g. toy arms)
are what the build, ``autotune()`` and the cost-model calibration call; the timer is a parameter
(CUDA graph by default; FakeTimer for tests and --simulate; ReplayTimer for a recorded log), so
callers never know how a number was taken. ``measure_point_isolated`` (measure/isolated.py,
importable from here too) runs the same protocol in a worker subprocess so a hung or crashing
kernel costs one arm.
"""
from __future__ import annotations

import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tunedb.measure import stats
from tunedb.measure.arms import Problem, problem_for
from tunedb.measure.gpuenv import merge_snapshots
from tunedb.measure.timers import Prepared, Timer
from tunedb.errors import BusyGPUError, CaptureActiveError
from tunedb.records import Measurement, Signature, Status

MIN_ROUNDS = 5
MAX_ROUNDS = 40
REL_TOL = 0.005  # the median's standard error, relative to itself, at which an arm is settled
BUSY_WAIT_S = 10.0  # how long a newcomer process may take to leave before the run is refused


def refuse_capture() -> None:
    """Raise CaptureActiveError inside a CUDA-graph capture (without importing torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:
        capturing = False
    if capturing:
        raise CaptureActiveError(
            "refusing to measure inside a CUDA-graph capture: timing launches graphs and "
            "synchronises, which a capture forbids; measure before capturing (e.g. tunedb.prewarm)"
        )


# Where a build's wall time goes, in the order a report lists them (phase_seconds keys): setup
# (arch, plan, log, GPU identity) and write (fit, database) are the build's own, the rest its
# measurer's.
PHASES = ("setup", "worker start", "probes", "prepare", "rounds", "requests", "failed requests", "write")


def add_phase(phases: dict[str, float], key: str, seconds: float) -> None:
    phases[key] = phases.get(key, 0.0) + seconds


def default_timer() -> Timer:
    from tunedb.measure.cudagraph import CudaGraphTimer

    return CudaGraphTimer()


def _busy_message(pids: Sequence[int], what: str) -> str:
    return (f"GPU busy: foreign compute process(es) {', '.join(map(str, sorted(pids)))} {what}; "
            "measure on a quiet GPU, or pass allow_busy=True (--allow-busy) to measure anyway "
            "with every result marked contended")


@dataclass
class _Run:
    """Mutable state of one point's rounds."""

    samples: dict[str, list[float]]
    alive: list[str]
    failed: dict[str, tuple[Status, str]] = field(default_factory=dict)
    rounds: int = 0
    invalidated: int = 0
    stop: str = "cap"  # why the rounds ended: settled, fallback gate, or the round cap
    foreign: frozenset[int] = frozenset()  # foreign processes tolerated (allow_busy)

    @property
    def contended(self) -> bool:
        """Measured beside a foreign process (tolerated under allow_busy)."""
        return bool(self.foreign)


def _wait_quiet(env: Any, allowed: frozenset[int], wait_s: float) -> frozenset[int]:
    deadline = time.monotonic() + wait_s
    while True:
        extra = env.foreign_pids() - allowed
        if not extra or time.monotonic() >= deadline:
            return extra
        time.sleep(0.25)


def measure_problem(problem: Problem, *, timer: Timer | None = None, alpha: float = 0.0,
                    incumbent: str | None = None, default_id: str = "default",
                    keep: Sequence[str] = (), seed: int = 0, allow_busy: bool = False,
                    min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
                    rel_tol: float = REL_TOL, working_set_bytes: int | None = None,
                    busy_wait_s: float = BUSY_WAIT_S, log: Any = None,
                    phases: dict[str, float] | None = None,
                    settled: Callable[..., bool] = stats.settled,
                    fallback_gate: tuple[str, float] | None = None) -> tuple[Measurement, ...]:
    """Measure every arm of `problem`; one Measurement per arm, in the problem's arm order.

    alpha weighs host issue time into the ranking (the census's eager share); the default, the
    incumbent and `keep` survive successive halving to the end. Rounds stop when every live arm's
    median is pinned to rel_tol or clearly behind the leader (stats.settled), or at max_rounds.
    `log` (a MeasurementLog) gets every result; `phases`, when given, accumulates the wall
    seconds spent preparing the arms (inputs, gate, captures, host timing) and in timing rounds.
    `settled` is the stopping rule (bench/rounds_replay.py replays logs under another). `fallback_gate`,
    (fallback id, min speedup) as the build's partition applies them, also stops the rounds once
    no arm can beat the fallback by that factor (stats.gate_decided): the point's verdict is then
    the fallback whatever more rounds would show.
    """
    if not 1 <= min_rounds <= max_rounds:
        raise ValueError(f"need 1 <= min_rounds ({min_rounds}) <= max_rounds ({max_rounds})")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} is the eager share of calls and must be in [0, 1]")
    if rel_tol <= 0:
        raise ValueError(f"rel_tol={rel_tol} must be positive")
    if fallback_gate is not None and not (isinstance(fallback_gate, tuple) and len(fallback_gate) == 2
                                          and fallback_gate[1] >= 1.0):
        raise ValueError(f"fallback_gate={fallback_gate!r} must be (fallback config id, min speedup >= 1.0)")
    refuse_capture()
    timer = timer if timer is not None else default_timer()
    env = timer.gpu_env()
    present = env.foreign_pids()
    if present and not allow_busy:
        raise BusyGPUError(_busy_message(present, "hold the GPU"))
    before = env.snapshot()
    t0 = time.perf_counter()
    session = timer.open(problem, seed=seed, working_set_bytes=working_set_bytes)
    t1 = time.perf_counter()
    try:
        prepared: Mapping[str, Prepared] = session.prepared
        ok = [c for c in problem.config_ids if prepared[c].status.ok]
        run = _Run({c: [] for c in ok}, list(ok), foreign=frozenset(present))
        protected = {default_id, *keep} | ({incumbent} if incumbent else set())
        _rounds(run, session, env, prepared, protected, alpha, seed, allow_busy,
                min_rounds, max_rounds, rel_tol, busy_wait_s, settled, fallback_gate)
        after = env.snapshot()
    finally:
        session.close()
    if phases is not None:
        add_phase(phases, "prepare", t1 - t0)
        add_phase(phases, "rounds", time.perf_counter() - t1)
    # one id per call: arms of one call share their rounds, so partition.objective_table can
    # pair each arm's samples with the reference's of the same rounds
    out = _measurements(problem, prepared, run, merge_snapshots(before, after), timer, uuid.uuid4().hex[:12])
    if log is not None:
        log.append(out)
    return out


def _rounds(run: _Run, session: Any, env: Any,
            prepared: Mapping[str, Prepared], protected: set[str], alpha: float, seed: int,
            allow_busy: bool, min_rounds: int, max_rounds: int, rel_tol: float,
            busy_wait_s: float, settled: Callable[..., bool], fallback_gate: tuple[str, float] | None) -> None:
    rng = random.Random(seed)
    halve_at = stats.halving_rounds(min_rounds, max_rounds)
    while run.alive and run.rounds < max_rounds:
        order = stats.round_order(run.alive, rng)
        got = session.sample(order)
        newcomers = env.foreign_pids() - run.foreign
        if newcomers:
            # The round overlapped a process that was not there before: its samples are
            # discarded and the arms it touched are measured again.
            run.invalidated += 1
            if allow_busy:
                run.foreign |= newcomers
            else:
                still = _wait_quiet(env, run.foreign, busy_wait_s)
                if still:
                    raise BusyGPUError(_busy_message(still, "appeared during the measurement"))
            if run.invalidated > max_rounds:
                raise BusyGPUError(_busy_message(newcomers, "keep appearing"))
            continue
        for cid in order:
            value = got[cid]
            if isinstance(value, Status):
                run.failed[cid] = (value, f"failed in timing round {run.rounds + 1}")
                run.alive.remove(cid)
            else:
                run.samples[cid].append(float(value))
        run.rounds += 1
        if run.rounds < min_rounds:  # (the first halving is at min_rounds: stats.halving_rounds)
            continue
        scores = {c: stats.objective_score(run.samples[c], prepared[c].host_us, alpha) for c in run.alive}
        if run.rounds in halve_at:
            run.alive = list(stats.halve(scores, protected))
        live = {c: run.samples[c] for c in run.alive}
        live_scores = {c: scores[c] for c in run.alive}
        if live and settled(live, live_scores, rel_tol, min_rounds):
            run.stop = "settled"
            break
        if live and fallback_gate is not None and stats.gate_decided(live, live_scores, *fallback_gate, min_rounds):
            run.stop = "fallback gate"
            break


def _measurements(problem: Problem, prepared: Mapping[str, Prepared], run: _Run,
                  env: dict[str, Any], timer: Timer, call_id: str) -> tuple[Measurement, ...]:
    out = []
    for cid in problem.config_ids:
        p = prepared[cid]
        info = dict(env)
        info.update(dict(p.info))
        info["run"] = call_id  # after p.info: a replayed record's own id must not come back
        info["timer"] = getattr(timer, "name", type(timer).__name__)
        info["rounds"] = run.rounds
        info["stop"] = run.stop if run.alive else "no live arm"
        if run.invalidated:
            info["invalidated_rounds"] = run.invalidated
        if run.foreign:
            info["foreign_pids"] = ",".join(map(str, sorted(run.foreign)))
        status, detail = (p.status, p.detail) if not p.status.ok else run.failed.get(cid, (Status.OK, ""))
        samples = tuple(run.samples.get(cid, ()))
        if status.ok and not samples:
            status, detail = Status.TIMEOUT, "no valid timing round completed"
        kw: dict[str, Any] = dict(l2=p.l2, host_us=p.host_us, contended=run.contended,
                                  detail=detail, env=tuple(sorted(info.items())))
        if status.ok:
            med, sigma, n = stats.summarize(samples)
        if status.ok and not med > 0:
            # nothing left after the timer's baselines (replay overhead, separator) were
            # subtracted: no valid time, as with no round at all (session 41: an H100 read 0 ms
            # for every arm of two points once, and pick_rule raised inside prewarm)
            status = Status.TIMEOUT
            kw["detail"] = f"no valid timing: median {med} ms per call after the timer's baselines were subtracted"
        if status.ok:
            out.append(Measurement(problem.signature, problem.m, cid, status, med, sigma, n,
                                   samples, **kw))
        else:
            out.append(Measurement(problem.signature, problem.m, cid, status, None, None,
                                   len(samples), samples, **kw))
    return tuple(out)


def measure_point(family: Any, sig: Signature, m: int, config_ids: Sequence[str], *,
                  timer: Timer | None = None, **kwargs: Any) -> tuple[Measurement, ...]:
    """Measure `config_ids` of a KernelFamily (or its registered name; None for fake/replay
    timers) on `sig` at M.

    Keyword arguments are measure_problem's (alpha, incumbent, default_id, keep, seed,
    allow_busy, min_rounds, max_rounds, rel_tol, working_set_bytes, log).
    """
    if isinstance(family, str):
        from tunedb import families

        family = families.get(family)
    return measure_problem(problem_for(family, sig, m, config_ids), timer=timer, **kwargs)


def best(measurements: Sequence[Measurement], alpha: float = 0.0) -> Measurement | None:
    """The ok measurement with the lowest objective (GPU ms + alpha x host ms), or None."""
    scored = [(m.objective(alpha), m.config_id, m) for m in measurements if m.status.ok]
    return min(scored, key=lambda t: (t[0], t[1]))[2] if scored else None


# measure_point in a worker subprocess lives in measure/isolated.py, which imports this module;
# its names stay importable from here, resolved on first use (no import cycle).
_ISOLATED = ("PointRequest", "ProbeRequest", "StartRequest", "_Refused", "measure_point_isolated")


def __getattr__(name: str) -> Any:
    if name in _ISOLATED:
        from tunedb.measure import isolated

        return getattr(isolated, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
