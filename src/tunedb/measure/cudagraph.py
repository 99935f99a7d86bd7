"""The CUDA-graph timer: each arm is a graph of N >= 8 calls, replayed and timed with events.

Why each piece is there:
- A graph of N calls, not one: one call per replay is dominated by the replay's own latency
  and ranks kernels worse than eager timing does.
- A tiny unrelated kernel (the separator) after every call: back-to-back copies of one kernel
  can overlap (programmatic dependent launch), which they cannot do inside a model. The
  separator's cost where it stands, after a kernel that hides its launch latency, is measured
  separately (N x (busy kernel + separator) minus N x busy kernel) and subtracted, as is the
  replay's fixed overhead (2 t(one tiny kernel) - t(two)). On an H200 a separator alone costs
  about 1.3 us, but only a fraction of that after a GEMM; subtracting the former would credit
  every arm with about a microsecond it does not get.
- The single-replay gate: one call + one separator per replay. An arm whose N-call time per
  call falls well below that still overlaps itself, and is timed one call per replay instead.
  "Well below" is judged against the point's other arms (ratio < tol x their median ratio):
  for kernels of a few microseconds the single-replay estimate itself runs high (its overhead
  subtraction is as large as the kernel), so every arm's ratio sinks together; an absolute
  threshold then flipped one of two identical arms to single-replay timing (a 27% A/A gap at
  416x512x256 on the H200). Peers cancel that bias; an arm overlapping more than they do is
  still caught. A point with one arm is judged against the absolute threshold.
- Rotating weight copies when the served working set exceeds L2, so each call reads cold
  weights as it would in the model; one copy (warm) otherwise (input policy ROTATE).
- For an op that overwrites its input (input policy RING), a ring of fresh valid inputs, one
  slot per call of the graph, restored from pristine copies by a captured copy graph replayed
  before each timed replay, outside its events: no timed launch sees its own output.
- A GPU sleep kernel before each round, so the host enqueues every replay of the round while
  the GPU is busy and no host gap lands between a start and an end event.
This is inherently a torch module; it is imported only when a CUDA timer is made.
"""
from __future__ import annotations

import itertools
import random
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

from tunedb.measure import stats
from tunedb.measure.arms import Problem, empty_like_reference
from tunedb.measure.gate import classify_exception, describe, gate_arms
from tunedb.measure import inputs as input_sets
from tunedb.measure.gpuenv import NvmlEnv
from tunedb.measure.timers import Prepared, rotation_copies
from tunedb.errors import MeasurementError
from tunedb.records import Status

MIN_CALLS = 8
OVERLAP_TOL = 0.8  # N-call per-call time below this share of the single-replay time: overlap
HOST_ROUNDS = 5  # interleaved rounds of host-issue timing per arm
_ENQUEUE_US = 40.0  # host time to enqueue one timed replay, generously


def capture(body: Callable[[], Any], pool: Any = None, *, warmup: int = 0, keep: list | None = None) -> Any:
    """A CUDA graph of whatever `body` launches on the current device. `warmup` calls run first
    on a side stream (first launches, selection, lazy allocations stay out of the capture); the
    captured call's return value is appended to `keep` when given (its output buffers)."""
    if warmup:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                body()
        torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = body()
    if keep is not None:
        keep.append(out)
    return graph


class CudaGraphTimer:
    """Times arms as replayed CUDA graphs on one device (default: the current one)."""

    name = "cudagraph"

    def __init__(self, device: int | None = None, *, min_calls: int = MIN_CALLS,
                 separator: bool = True, gate: bool = True, overlap_tol: float = OVERLAP_TOL,
                 l2_bytes: int | None = None) -> None:
        if min_calls < 1:
            raise ValueError(f"min_calls={min_calls} must be >= 1 (the protocol uses >= 8)")
        if not torch.cuda.is_available():
            raise MeasurementError("the CUDA-graph timer needs a CUDA GPU; use FakeTimer "
                                   "(--simulate) or ReplayTimer (a recorded log) without one")
        self.index = torch.cuda.current_device() if device is None else int(device)
        self.device = torch.device("cuda", self.index)
        self.min_calls, self.separator, self.gate = min_calls, separator, gate
        self.overlap_tol = overlap_tol
        props = torch.cuda.get_device_properties(self.index)
        self.l2_bytes = int(l2_bytes if l2_bytes is not None else props.L2_cache_size)
        self._uuid = str(getattr(props, "uuid", "") or "")
        self._env: NvmlEnv | None = None
        self._cycles_per_us: float | None = None

    def gpu_env(self) -> NvmlEnv:
        if self._env is None:
            self._env = NvmlEnv(uuid=self._uuid or None, index=self.index)
        return self._env

    def sleep_cycles_per_us(self) -> float:
        """GPU clock cycles per microsecond of torch.cuda._sleep, measured once."""
        if self._cycles_per_us is None:
            with torch.cuda.device(self.index):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(1000)
                start.record()
                torch.cuda._sleep(2_000_000)
                end.record()
                end.synchronize()
                self._cycles_per_us = 2_000_000 / max(start.elapsed_time(end) * 1000.0, 1.0)
        return self._cycles_per_us

    def time_graphs(self, graphs: Sequence[Any], before: Any = None) -> list[float]:
        """Milliseconds of one replay of each graph, back to back, behind a sleep kernel.
        `before` (a graph: the input ring's restore) replays ahead of each one, outside its events."""
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in graphs]
        factor = 2 if before is not None else 1
        torch.cuda._sleep(int(self.sleep_cycles_per_us() * (50 + factor * _ENQUEUE_US * len(graphs))))
        for g, (s, e) in zip(graphs, pairs):
            if before is not None:
                before.replay()
            s.record()
            g.replay()
            e.record()
        pairs[-1][1].synchronize()
        return [s.elapsed_time(e) for s, e in pairs]

    def open(self, problem: Problem, *, seed: int, working_set_bytes: int | None) -> "GraphSession":
        if problem.make_inputs is None or problem.reference is None:
            raise MeasurementError(
                f"the CUDA-graph timer needs real arms (make_inputs and reference) for "
                f"{problem.signature} at M={problem.m}; this problem only has arm ids"
            )
        with torch.cuda.device(self.index):
            return GraphSession(self, problem, seed, working_set_bytes)


class GraphSession:
    restore_graph: Any = None  # RING: the captured restore of every slot, replayed before each replay
    inputs: Any = None  # the input sets of the timed calls (measure/inputs.py)

    def __init__(self, timer: CudaGraphTimer, problem: Problem, seed: int,
                 working_set_bytes: int | None) -> None:
        self.timer = timer
        dev = timer.device
        args, kwargs = problem.make_inputs(dev, seed)
        ring = problem.policy == "ring"
        make_out = None if ring else (problem.make_out or empty_like_reference)
        ref = problem.reference(input_sets.fresh_copy(args) if ring else args, kwargs)
        gates = gate_arms(problem, args, kwargs, make_out, torch.cuda.synchronize, ref) if timer.gate else {}
        self.restore_graph = None
        if ring:  # an in-place op: one fresh slot per call of the graph, restored between replays
            out, copies = None, timer.min_calls
            inputs = input_sets.ring(problem.make_inputs, dev, seed, copies)
            self.l2 = "warm"  # the restore copies just wrote every slot
        else:
            positions = [i for i in problem.weight_positions(args) if isinstance(args[i], torch.Tensor)]
            weight_bytes = sum(args[i].numel() * args[i].element_size() for i in positions)
            served = weight_bytes if working_set_bytes is None else working_set_bytes
            out = make_out(args, kwargs, ref)
            other_bytes = out.numel() * out.element_size() + sum(
                a.numel() * a.element_size() for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in positions)
            copies = rotation_copies(served, timer.l2_bytes, weight_bytes, other_bytes)
            self.l2 = "cold" if served > timer.l2_bytes and weight_bytes > 0 else "warm"
            inputs = (input_sets.rotate(tuple(args), kwargs, positions, copies) if problem.policy == "rotate"
                      else input_sets.none(tuple(args), kwargs))
            copies = inputs.depth
        calls = max(timer.min_calls, copies)
        sep_buf = torch.ones(64, device=dev, dtype=torch.float32)

        def sep() -> None:
            if timer.separator:
                sep_buf.add_(1.0)

        self._baselines(sep, sep_buf, calls)
        self.timed: dict[str, tuple[Any, int]] = {}  # id -> (graph, calls in it)
        self._modes: dict[str, tuple[float, tuple[Any, int], tuple[Any, int]]] = {}
        if ring:
            self.restore_graph = capture(inputs.restore)
        self.inputs = inputs
        self._keep: list[Any] = [inputs.tensors(), out, sep_buf, ref]
        prepared: dict[str, Prepared] = {}
        gpu_ms: dict[str, float] = {}  # id -> per-call GPU estimate, sizing the host timing
        for arm in problem.arms:
            g = gates.get(arm.config_id)
            gate_info: tuple[tuple[str, Any], ...] = ()
            if g is not None:
                gate_info = (("gate_error", g.error), ("gate_bound", g.bound))
                if not g.status.ok:
                    prepared[arm.config_id] = Prepared(g.status, g.detail, self.l2, None, gate_info)
                    continue
            try:
                prepared[arm.config_id], gpu_ms[arm.config_id] = self._prepare(
                    arm, inputs, out, sep, calls, gate_info)
            except Exception as exc:  # capture or launch failure: this arm only
                prepared[arm.config_id] = self._failed(Prepared(Status.OK, "", self.l2, None, gate_info),
                                                       "graph capture or launch failed", exc)
        self.prepared = self._host_times(self._choose_modes(prepared), problem, inputs.sets[0][0],
                                         inputs.sets[0][1], out, gpu_ms)

    def _baselines(self, sep: Callable[[], None], sep_buf: Any, calls: int) -> None:
        """The replay's fixed overhead and the separator's cost in context, in ms.

        A replay of k tiny kernels takes overhead + k x tiny, so overhead = 2 t(1) - t(2). The
        separator alone costs mostly its launch latency, which a kernel running before it hides:
        its cost in context is measured after a busy (sleep) kernel, N times in one graph.
        """
        tick = torch.ones(64, device=sep_buf.device, dtype=torch.float32)
        one, two = capture(lambda: tick.add_(1.0)), capture(lambda: (tick.add_(1.0), tick.add_(1.0)))
        pairs = [self.timer.time_graphs([one, two]) for _ in range(9)]
        t1, t2 = stats.median([p[0] for p in pairs]), stats.median([p[1] for p in pairs])
        # never more than one tiny kernel's whole replay: were one replay timed slow (t2 < t1),
        # 2 t1 - t2 would exceed it and every arm's per-call time come out 0 (the suspected cause
        # of session 41's zero arms on an H100, not reproduced there: hence tiny_replays_us)
        self.overhead_ms = min(max(2 * t1 - t2, 0.0), t1)
        self.tiny_replays_ms = (t1, t2)
        self.sep_alone_ms = max(t2 - t1, 0.0)
        self.sep_ms = 0.0
        self._keep_graphs = [one, two]
        if self.timer.separator:
            busy = max(1, int(self.timer.sleep_cycles_per_us() * 4))
            bare = capture(lambda: [torch.cuda._sleep(busy) for _ in range(calls)])
            both = capture(lambda: [(torch.cuda._sleep(busy), sep()) for _ in range(calls)])
            pairs = [self.timer.time_graphs([bare, both]) for _ in range(9)]
            diff = stats.median([p[1] for p in pairs]) - stats.median([p[0] for p in pairs])
            self.sep_ms = max(diff / calls, 0.0)
            self._keep_graphs += [bare, both]

    def _per_call(self, replay_ms: float, calls: int) -> float:
        """One call's time from one replay of a graph of `calls` x (call + separator)."""
        return max((replay_ms - self.overhead_ms) / calls - self.sep_ms, 0.0)

    def _repeat(self, graph: Any, n: int) -> list[float]:
        return [self.timer.time_graphs([graph], self.restore_graph)[0] for _ in range(n)]

    def _restore(self) -> None:
        if self.restore_graph is not None:
            self.restore_graph.replay()

    def _prepare(self, arm: Any, inputs: input_sets.InputSets, out: Any, sep: Callable[[], None],
                 calls: int, gate_info: tuple) -> tuple[Prepared, float]:
        """The arm captured and checked for self-overlap, and its per-call GPU estimate (ms)."""
        fns = [arm.make(a, kw, out) for a, kw in inputs.sets]
        for fn in fns:
            fn()
        self._restore()
        torch.cuda.synchronize()

        def body() -> None:
            for i in range(calls):
                fns[inputs.slot_of(i)]()
                sep()

        def body1() -> None:
            fns[0]()
            sep()

        graph, graph1 = capture(body), capture(body1)
        graph.replay()
        self._restore()
        torch.cuda.synchronize()
        per_call = self._per_call(stats.median(self._repeat(graph, 5)), calls)
        single = self._per_call(stats.median(self._repeat(graph1, 5)), 1)
        ratio = per_call / single if single > 0 else 1.0
        info = list(gate_info) + [
            ("copies", inputs.depth), ("inputs", inputs.policy), ("calls_per_graph", calls),
            ("separator_us", round(self.sep_ms * 1000, 3)),
            ("separator_alone_us", round(self.sep_alone_ms * 1000, 3)),
            ("replay_overhead_us", round(self.overhead_ms * 1000, 3)),
            ("tiny_replays_us", "/".join(f"{t * 1000:.3f}" for t in self.tiny_replays_ms)),  # one, two kernels
            ("overlap_ratio", round(ratio, 4))]
        self._modes[arm.config_id] = (ratio, (graph, calls), (graph1, 1))
        return Prepared(Status.OK, "", self.l2, None, tuple(info)), max(per_call, single)

    @staticmethod
    def _failed(p: Prepared, what: str, exc: Exception) -> Prepared:
        """`p` failed with `exc` (its status from the exception); a sticky CUDA error raises
        from the synchronize instead and ends the point."""
        torch.cuda.synchronize()
        return replace(p, status=classify_exception(exc), host_us=None, detail=f"{what}: {describe(exc)}")

    def _choose_modes(self, prepared: dict[str, Prepared]) -> dict[str, Prepared]:
        """Time each arm N calls per replay, or one per replay where it overlaps itself more
        than its peers do (see the module docstring)."""
        ratios = [r for r, _, _ in self._modes.values()]
        peer = stats.median(ratios) if len(ratios) > 1 else 1.0
        for cid, (ratio, many, one) in self._modes.items():
            overlaps = ratio < self.timer.overlap_tol * min(peer, 1.0)
            self.timed[cid] = one if overlaps else many
            if overlaps:
                p = prepared[cid]
                prepared[cid] = Prepared(p.status, p.detail, p.l2, p.host_us,
                                         p.info + (("self_overlap", True), ("peer_ratio", round(peer, 4))))
        self._modes.clear()
        return prepared

    def _host_times(self, prepared: dict[str, Prepared], problem: Problem, args: tuple, kwargs: dict,
                    out: Any, gpu_ms: dict[str, float]) -> dict[str, Prepared]:
        """Each ok arm's eager host issue time per call, in shuffled interleaved rounds.

        Timed on the call as a model issues it, `make(args, kwargs, None)`: the output is
        allocated per call, as F.linear and the runtime's launchers do. The out= call the GPU
        timing needs is not what a model pays: on the H200 the torch arm's addmm(out=) read
        30-33 us against 19-23 us for Triton's plain arms with out=, while in the model F.linear
        costs about 4 us less than the bound launcher; that inverted gap made `tunedb tune`
        serve Triton configs slower than cuBLAS on the GPU. Each round runs the arms in a new
        seeded order, so host drift spreads over all of them. An arm whose host timing raises
        fails alone, with that status, and the point's other arms keep theirs -- unless the error
        is a sticky CUDA one (an illegal address poisons the context), which ends the point as it
        would in a capture; the worker then re-measures each arm alone."""
        def failed(cid: str, exc: Exception) -> None:  # this arm only, as a failed capture is
            prepared[cid] = self._failed(prepared[cid], "host timing failed", exc)

        fns: dict[str, Callable[[], Any]] = {}
        for cid, p in list(prepared.items()):
            if p.status.ok:
                try:
                    if self.restore_graph is not None:  # in place: each launch on its own ring slot
                        fns[cid], why_out = self._ring_call(problem.arm(cid)), ""
                    else:
                        fns[cid], why_out = self._issued_call(problem.arm(cid), args, kwargs, out)
                except Exception as exc:  # noqa: BLE001 -- not even the out= call can be made
                    failed(cid, exc)
                    continue
                if why_out:
                    prepared[cid] = replace(p, info=p.info + (("host_timed_with_out", why_out),))
        reps: dict[str, list[float]] = {cid: [] for cid in fns}
        rng = random.Random(f"host:{problem.signature}:{problem.m}")
        for _ in range(HOST_ROUNDS):
            for cid in stats.round_order([c for c in reps if prepared[c].status.ok], rng):
                try:
                    reps[cid].append(self._host_once(fns[cid], gpu_ms.get(cid, 0.0), self._ring_limit()))
                except Exception as exc:  # noqa: BLE001
                    failed(cid, exc)
        return {cid: replace(p, host_us=round(stats.median(reps[cid]), 3)) if p.status.ok and reps.get(cid) else p
                for cid, p in prepared.items()}

    @staticmethod
    def _issued_call(arm: Any, args: tuple, kwargs: dict, out: Any) -> tuple[Callable[[], Any], str]:
        """(fn issuing the arm without an out buffer, ""), or, for an arm that cannot run without
        one (a test arm writing into `out`), (its out= fn, why the call without failed)."""
        try:
            fn = arm.make(args, kwargs, None)
            fn()
            torch.cuda.synchronize()
            return fn, ""
        except Exception as exc:  # noqa: BLE001 -- recorded with the measurement, not hidden
            torch.cuda.synchronize()
            return arm.make(args, kwargs, out), describe(exc, 200)

    def _ring_call(self, arm: Any) -> Callable[[], Any]:
        """An in-place arm's eager call, walking the ring's slots (restored before each batch)."""
        slot_fns = [arm.make(a, kw, None) for a, kw in self.inputs.sets]
        turn = itertools.count()
        return lambda: slot_fns[next(turn) % len(slot_fns)]()

    def _ring_limit(self) -> int | None:
        """Launches per host-timing batch: at most one per ring slot, the ring restored first."""
        if self.restore_graph is None:
            return None
        self._restore()
        return self.inputs.depth

    @staticmethod
    def _host_once(fn: Callable[[], Any], gpu_ms: float, limit: int | None = None) -> float:
        """Host microseconds per call over n launches (at most `limit`), the queue drained first."""
        n = int(min(20, max(3, 2.0 / max(gpu_ms, 1e-3))))
        if limit is not None:
            n = min(n, limit)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        return dt

    def sample(self, order: Sequence[str]) -> dict[str, float | Status]:
        with torch.cuda.device(self.timer.index):
            times = self.timer.time_graphs([self.timed[c][0] for c in order], self.restore_graph)
        out: dict[str, float | Status] = {}
        for cid, t in zip(order, times):
            out[cid] = self._per_call(t, self.timed[cid][1])
        return out

    def close(self) -> None:
        self.timed.clear()
        self._keep.clear()
        self._keep_graphs.clear()
