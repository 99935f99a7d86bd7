"""Timers behind one small protocol, and the two that need no GPU: FakeTimer and ReplayTimer.

A timer ``open``s a Problem and returns a Session: per arm, whether it may be timed (its gate
status), its L2 state and host issue time; then ``sample(order)`` times one interleaved round
and answers one per-call time in ms per arm (or a Status when the arm failed in that round).
The protocol loop (protocol.py) decides rounds, order, halving and stopping; timers only time.
The CUDA-graph timer lives in cudagraph.py (it imports torch).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from tunedb.measure.arms import Problem
from tunedb.measure.gpuenv import GpuEnv, NullEnv
from tunedb.errors import MeasurementError
from tunedb.records import Measurement, Signature, Status

DEFAULT_L2_BYTES = 60 * 2**20  # the H200's; real timers query the device


@dataclass(frozen=True)
class Prepared:
    """What a timer learned about one arm before timing it."""

    status: Status
    detail: str = ""
    l2: str = "warm"
    host_us: float | None = None
    info: tuple[tuple[str, Any], ...] = ()  # gate error, calls per graph, copies, ...


class Session(Protocol):
    prepared: Mapping[str, Prepared]

    def sample(self, order: Sequence[str]) -> dict[str, float | Status]:
        """Time one round, arms in the given order: per-call ms (or a Status) per arm."""

    def close(self) -> None: ...


class Timer(Protocol):
    name: str

    def gpu_env(self) -> GpuEnv: ...

    def open(self, problem: Problem, *, seed: int, working_set_bytes: int | None) -> Session: ...


def rotation_copies(working_set_bytes: int, l2_bytes: int, weight_bytes: int, other_bytes: int = 0) -> int:
    """Weight copies to rotate through: one (warm) when the served working set fits L2; else
    enough that 2 x L2 distinct bytes pass between two uses of one copy, which evicts it.
    Those bytes are the calls in between: their copies of the weights, plus what every call
    touches beside them (its input activation and output, `other_bytes`, the same buffers each
    call, so counted once): ceil((2 L2 - other) / weight bytes) + 1, and never fewer than two,
    since with one copy the next call rereads a weight the last one just read.

    Counting the activations matters at large M: whisper-large-v3's 1280x1280 GEMM at
    M=12000 (60 MiB L2) touches 61 MB of activations per call, so 21 copies (not 40) already
    evict each weight, and a call that touches 2 x L2 by itself needs two."""
    if weight_bytes <= 0 or working_set_bytes <= l2_bytes:
        return 1
    return max(2, math.ceil(max(2 * l2_bytes - other_bytes, 0) / weight_bytes) + 1)


Cost = Callable[[Signature, int, str], "float | Status"]


class FakeTimer:
    """A cost function plus seeded noise, drift and outliers: for CPU tests and --simulate.

    cost(sig, m, config_id) gives the true per-call ms (or a Status for an arm that fails);
    each sample is cost x (1 + drift x k) x (1 + noise_sigma x N(0,1)), k counting samples of
    the session, and with probability outlier_rate it is multiplied by outlier_scale.
    """

    name = "fake"

    def __init__(self, cost: Cost, *, noise_sigma: float = 0.01, drift: float = 0.0,
                 outlier_rate: float = 0.0, outlier_scale: float = 3.0, seed: int = 0,
                 host_us: float | Callable[[Signature, int, str], float] = 5.0,
                 l2_bytes: int = DEFAULT_L2_BYTES, env: GpuEnv | None = None) -> None:
        if noise_sigma < 0 or not 0 <= outlier_rate <= 1:
            raise ValueError(f"noise_sigma={noise_sigma} must be >= 0 and outlier_rate="
                             f"{outlier_rate} within [0, 1]")
        self.cost, self.noise_sigma, self.drift = cost, noise_sigma, drift
        self.outlier_rate, self.outlier_scale = outlier_rate, outlier_scale
        self.seed, self.host_us, self.l2_bytes = seed, host_us, l2_bytes
        self._env = env or NullEnv()
        self.calls: list[str] = []  # every sampled arm id, in order (tests read the interleaving)

    def gpu_env(self) -> GpuEnv:
        return self._env

    def open(self, problem: Problem, *, seed: int, working_set_bytes: int | None) -> "_FakeSession":
        return _FakeSession(self, problem, seed, working_set_bytes or 0)


class _FakeSession:
    def __init__(self, timer: FakeTimer, problem: Problem, seed: int, working_set: int) -> None:
        self.timer, self.problem = timer, problem
        self.rng = random.Random(f"{timer.seed}:{seed}:{problem.signature}:{problem.m}")
        self.k = 0
        # a ring's slots were just restored (written) before each timed batch: they are warm
        ring = problem.policy == "ring"
        l2 = "cold" if working_set > timer.l2_bytes and not ring else "warm"
        info = (("inputs", problem.policy),)
        self.truth: dict[str, float] = {}
        prepared = {}
        for cid in problem.config_ids:
            value = timer.cost(problem.signature, problem.m, cid)
            if isinstance(value, Status):
                prepared[cid] = Prepared(value, f"fake cost: {value.value}", l2, None, info)
                continue
            host = timer.host_us(problem.signature, problem.m, cid) if callable(timer.host_us) \
                else timer.host_us
            self.truth[cid] = float(value)
            prepared[cid] = Prepared(Status.OK, "", l2, host, info)
        self.prepared = prepared

    def sample(self, order: Sequence[str]) -> dict[str, float | Status]:
        t, out = self.timer, {}
        for cid in order:
            t.calls.append(cid)
            v = self.truth[cid] * (1 + t.drift * self.k) * (1 + t.noise_sigma * self.rng.gauss(0, 1))
            if self.rng.random() < t.outlier_rate:
                v *= t.outlier_scale
            self.k += 1
            out[cid] = max(v, 0.0)
        return out

    def close(self) -> None:
        pass


class ReplayTimer:
    """Answers from a recorded measurement log: the recorded samples, in order, round by round
    (cycling when the protocol asks for more rounds than were recorded).

    An arm recorded with a failure status replays that status; an arm the log lacks is an
    error naming the key (replay never invents a number). The latest record of a key wins.
    """

    name = "replay"

    def __init__(self, log: str | Path | Sequence[Measurement]) -> None:
        if isinstance(log, (str, Path)):
            from tunedb.measure.log import read_measurements

            records = read_measurements(log)
            self.source = str(log)
        else:
            records, self.source = list(log), "<measurements>"
        self.index: dict[tuple[str, int, str], Measurement] = {}
        for m in records:
            self.index[(m.signature.format(), m.m, m.config_id)] = m

    def gpu_env(self) -> GpuEnv:
        return NullEnv()

    def lookup(self, sig: Signature, m: int, config_id: str) -> Measurement:
        key = (sig.format(), m, config_id)
        if key not in self.index:
            raise MeasurementError(
                f"replay log {self.source} has no measurement of config {config_id!r} for "
                f"{sig.format()} at M={m}; recorded configs there: "
                f"{', '.join(sorted(c for s, mm, c in self.index if s == key[0] and mm == m)) or 'none'}"
            )
        return self.index[key]

    def open(self, problem: Problem, *, seed: int, working_set_bytes: int | None) -> "_ReplaySession":
        return _ReplaySession(self, problem)


class _ReplaySession:
    def __init__(self, timer: ReplayTimer, problem: Problem) -> None:
        self.records = {c: timer.lookup(problem.signature, problem.m, c) for c in problem.config_ids}
        self.round = 0
        self.prepared = {
            c: Prepared(m.status, m.detail, m.l2, m.host_us, m.env) for c, m in self.records.items()
        }

    def sample(self, order: Sequence[str]) -> dict[str, float | Status]:
        out: dict[str, float | Status] = {}
        for cid in order:
            m = self.records[cid]
            samples = m.samples or ((m.median_ms,) if m.median_ms is not None else ())
            out[cid] = samples[self.round % len(samples)] if samples else m.status
        self.round += 1
        return out

    def close(self) -> None:
        pass
