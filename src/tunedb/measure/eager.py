"""The eager timer: wall-clock time of N calls per arm on any device (CPU included).

It runs the protocol's own pieces -- the numerical gate and the input policies of inputs.py,
the ring restored before every timed batch, outside the timed region -- without CUDA graphs,
events or a separator, so a family's arms can be measured where there is no GPU (tests, the
interpreter, a CPU family) and the input policies can be checked on CPU. Its numbers include
host issue time: it is not the timer the build uses on a GPU (cudagraph.py is).
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from tunedb.measure import inputs as input_sets
from tunedb.measure.arms import Problem, empty_like_reference
from tunedb.measure.gate import classify_exception, describe, gate_arms
from tunedb.measure.gpuenv import GpuEnv, NullEnv
from tunedb.measure.timers import Prepared
from tunedb.records import Status


class EagerTimer:
    """Times each arm as `calls` eager launches (one per input set of the policy), by wall clock."""

    name = "eager"

    def __init__(self, device: Any = "cpu", *, calls: int = 8, gate: bool = True, copies: int = 2) -> None:
        if calls < 1:
            raise ValueError(f"calls={calls} must be >= 1")
        self.device, self.calls, self.gate, self.copies = device, calls, gate, copies

    def gpu_env(self) -> GpuEnv:
        return NullEnv()

    def open(self, problem: Problem, *, seed: int, working_set_bytes: int | None) -> "EagerSession":
        return EagerSession(self, problem, seed)


class EagerSession:
    def __init__(self, timer: EagerTimer, problem: Problem, seed: int) -> None:
        self.timer, self.problem = timer, problem
        args, kwargs = problem.make_inputs(timer.device, seed)
        ring = problem.policy == "ring"
        make_out = None if ring else (problem.make_out or empty_like_reference)
        ref = problem.reference(input_sets.fresh_copy(args) if ring else args, kwargs)
        gates = gate_arms(problem, args, kwargs, make_out, lambda: None, ref) if timer.gate else {}
        if ring:
            self.inputs = input_sets.ring(problem.make_inputs, timer.device, seed, timer.calls)
            out = None
        elif problem.policy == "rotate":
            positions = problem.weight_positions(args)
            self.inputs = input_sets.rotate(tuple(args), kwargs, positions, timer.copies)
            out = make_out(args, kwargs, ref)
        else:
            self.inputs = input_sets.none(tuple(args), kwargs)
            out = make_out(args, kwargs, ref)
        self.fns: dict[str, list[Any]] = {}
        prepared: dict[str, Prepared] = {}
        info = (("inputs", self.inputs.policy), ("copies", self.inputs.depth), ("calls", timer.calls))
        for arm in problem.arms:
            g = gates.get(arm.config_id)
            gate_info = (("gate_error", g.error), ("gate_bound", g.bound)) if g is not None else ()
            if g is not None and not g.status.ok:
                prepared[arm.config_id] = Prepared(g.status, g.detail, "warm", None, gate_info + info)
                continue
            try:
                self.fns[arm.config_id] = [arm.make(a, kw, out) for a, kw in self.inputs.sets]
                self._batch(arm.config_id)  # warm-up: first launches, compiles
                prepared[arm.config_id] = Prepared(Status.OK, "", "warm", None, gate_info + info)
            except Exception as exc:  # this arm only
                prepared[arm.config_id] = Prepared(classify_exception(exc), f"launch failed: {describe(exc)}",
                                                   "warm", None, gate_info + info)
                self.fns.pop(arm.config_id, None)
        self.prepared = prepared

    def _batch(self, cid: str) -> float:
        """ms per call of one batch of `calls` launches; the ring is restored before the clock starts."""
        fns, inputs = self.fns[cid], self.inputs
        inputs.restore()
        t0 = time.perf_counter()
        for i in range(self.timer.calls):
            fns[inputs.slot_of(i)]()
        return (time.perf_counter() - t0) * 1e3 / self.timer.calls

    def sample(self, order: Sequence[str]) -> dict[str, float | Status]:
        out: dict[str, float | Status] = {}
        for cid in order:
            try:
                out[cid] = self._batch(cid)
            except Exception as exc:  # noqa: BLE001 -- a failure in a round is that arm's status
                out[cid] = classify_exception(exc)
        return out

    def close(self) -> None:
        self.fns.clear()
