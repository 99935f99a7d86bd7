"""The ladder's GPU timer: CUDA graphs over a ring of fresh inputs, CUDA events, the gate.

Per cell a ring of R input sets (R = enough to exceed twice L2 with the bytes a call moves,
from 1 to 8) is made once, pristine, and copied into working sets. Each capturable arm is
captured once as a CUDA graph of R calls, call k on working set k, all graphs of a cell sharing
one memory pool (nothing is read across replays, so the order of replays does not matter). A
sample of an arm is `reps` replays, each timed alone with CUDA events; before each replay of a
solver op (input policy RING) the working sets are restored from the pristine ones, outside the
timed region, so every timed launch consumes a fresh valid system, never its own output. The
eager-only library arm is timed as R eager calls between events. ns per problem = time /
(R x batch). A spin kernel before each timed window keeps the host's launch out of it; an op
with nothing to restore times a sample's replays back to back in one window, unless a replay is
shorter than BACK_TO_BACK_MIN_US (then the host's launches would set the pace). `refresh(cell)`
starts a new capture (new graphs, pool and working copies) for a further block of rounds.

The gate runs each arm once on working set 0 with its output poisoned (NaN), computes the worst
residual of the first GATE_PROBLEMS problems in fp64, and passes it when it is within the
verify factor of torch's on the same inputs (and, for potrf/posv, every info is 0: the inputs
are SPD). The poisoned output is a fresh contiguous tensor of the result's shape: launch's out=
takes only contiguous tensors, and torch's potrf result (cholesky_ex's L) is column-major, so a
poison made `like` it would be refused and every Triton potrf arm would fail the gate. A failed
arm's reason (the exception, or the residual over its bound) is kept: `failure(cell, arm)`.
GPU only: constructing it imports torch and needs CUDA.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from tunedb.errors import MeasurementError
from tunedb.families.linalg import configs, problems, signatures
from tunedb.families.linalg.ladder import Cell, Ring
from tunedb.records import Config, Status

MAX_RING = 8
WHY_CHARS = 300  # a failed arm's reason is cut to this many characters
GATE_PROBLEMS = 4096
TARGET_US = 200.0  # a sample spans at least this much GPU time (in separately timed replays)
# ~40 us at the H200's boost clock: longer than the host takes to record an event and launch a graph
LEAD_CYCLES = 80_000
# Back-to-back replays in one window only when a replay outlasts the host's launch of the next
# (a few us) twice over; shorter ones are timed one window each, each behind its own spin
BACK_TO_BACK_MIN_US = 10.0
# refresh keeps an old capture alive (its inputs and an output a graph, roughly) up to this size
KEEP_OLD_CAPTURE_BYTES = 4 << 30


def _gpu_env() -> Any:
    try:
        from tunedb.measure.gpuenv import NvmlEnv  # the seam's layout
    except ImportError:
        from tunedb.bench.gpuenv import NvmlEnv
    return NvmlEnv()


class GraphTimer:
    def __init__(self, family: Any, *, seed: int = 0, factor: float = 4.0) -> None:
        import torch

        if not torch.cuda.is_available():
            raise MeasurementError("tunedb linalg tune measures this GPU's table and needs a CUDA GPU; "
                                   "none is visible (recommend and plot need none)")
        self.torch, self.family, self.seed, self.factor = torch, family, seed, factor
        self.env = _gpu_env()
        self.l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20))
        self._cell: Cell | None = None
        self._state: dict[str, Any] = {}
        self._why: dict[str, str] = {}  # arm -> why it failed, for the open cell

    def failure(self, cell: Cell, arm: str) -> str | None:
        """Why `arm` failed on `cell` (the gate or a sample), or None."""
        return self._why.get(arm) if self._cell == cell else None

    def foreign_pids(self) -> frozenset[int]:
        return self.env.foreign_pids()

    def snapshot(self) -> dict[str, Any]:
        """The GPU's SM clock, throttle reasons, temperature and power now (NVML; empty without
        it): the ladder keeps them per round, so a slow stretch can be told from a clock drop."""
        if not getattr(self.env, "available", False):
            return {}
        snap = self.env.snapshot()
        return {k: snap[k] for k in ("sm_clock_mhz", "throttle", "temp_c", "power_w") if k in snap}

    def identity(self) -> dict[str, str]:
        return self.env.identity() if getattr(self.env, "available", False) else {}

    # --- per-cell state ----------------------------------------------------------------------
    def _open(self, cell: Cell) -> dict[str, Any]:
        if self._cell == cell:
            return self._state
        self.close()
        torch, sig = self.torch, cell.signature
        _flops, nbytes = signatures.work(sig, cell.batch)
        ring = max(1, min(MAX_RING, math.ceil(2 * self.l2 / max(nbytes, 1.0))))
        inputs = Ring(lambda k: problems.make_inputs(sig, cell.batch, "cuda", self.seed + k)[0], ring)
        torch_out = problems.torch_arm(sig.op, *inputs.working[0])
        head = self._head(inputs.pristine[0], torch_out)
        self._cell = cell
        self._state = {"sig": sig, "ring": ring, "inputs": inputs, "pristine": inputs.pristine,
                       "working": inputs.working, "graphs": {},
                       "pool": torch.cuda.graph_pool_handle(), "reps": {}, "short": {},
                       "torch_residual": problems.residual(sig, head[0], {}, head[1]),
                       "restore": sig.op in signatures.SOLVER_OPS}
        return self._state

    @staticmethod
    def _head(args: tuple[Any, ...], out: Any) -> tuple[tuple[Any, ...], Any]:
        """The first GATE_PROBLEMS problems of inputs and output (the gate's sample)."""
        k = GATE_PROBLEMS
        cut = tuple(t[:k] for t in args)
        return cut, (tuple(o[:k] for o in out) if isinstance(out, tuple) else out[:k])

    def refresh(self, cell: Cell) -> None:
        """A new capture for the cell's next block of rounds: new working copies of the ring, new
        CUDA graphs in a new memory pool, each arm's replay count probed again. The old graphs and
        buffers stay alive until the cell closes, so the new ones get other addresses (the
        caching allocator would hand the freed blocks back) while a capture's inputs and outputs
        fit KEEP_OLD_CAPTURE_BYTES; a larger cell frees its old capture first. A shift of an arm's
        time between captures is then seen inside one run (the blocks' spread) instead of only
        between runs."""
        st = self._open(cell)
        self.torch.cuda.synchronize()
        inputs = st["inputs"]
        ring_bytes = sum(t.numel() * t.element_size() for args in inputs.working for t in args)
        if ring_bytes * (len(st["graphs"]) + 1) <= KEEP_OLD_CAPTURE_BYTES:
            st.setdefault("retired", []).append((st["graphs"], inputs.working))
        else:  # a large cell (n=128 at batch 65536: 8.6 GB an input set): free it first, same addresses maybe
            st["graphs"], st["working"], inputs.working = {}, [], []
            self.torch.cuda.empty_cache()
        inputs.working = [tuple(t.clone() for t in args) for args in inputs.pristine]
        st["working"] = inputs.working
        st["graphs"], st["pool"], st["reps"], st["short"] = {}, self.torch.cuda.graph_pool_handle(), {}, {}

    def close(self) -> None:
        self._state, self._cell, self._why = {}, None, {}
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def _restore(self, st: dict[str, Any]) -> None:
        st["inputs"].restore()

    def _call(self, st: dict[str, Any], arm: str, args: tuple[Any, ...], out: Any = None) -> Any:
        if arm == configs.EAGER_ONLY:
            return configs.kernels().launch(st["sig"].op, arm, *args)
        config = Config.sentinel("torch") if arm == "torch" else configs.parse(arm)
        return self.family.launch(config, st["sig"], *args, out=out)

    # --- the gate ----------------------------------------------------------------------------
    def gate(self, cell: Cell, arm: str) -> tuple[Status, float | None]:
        torch = self.torch
        st = self._open(cell)
        self._restore(st)
        args = st["working"][0]
        poison = None
        if arm not in (configs.LIBRARY, configs.EAGER_ONLY):
            ref = problems.torch_arm(cell.op, *args)
            ref = ref[0] if isinstance(ref, tuple) else ref
            poison = torch.full(tuple(ref.shape), float("nan"), dtype=ref.dtype, device=ref.device)
        try:
            out = self._call(st, arm, args, poison)
            torch.cuda.synchronize()
        except Exception as exc:  # a config that cannot compile or launch costs its arm only
            self._why[arm] = describe(exc)
            kind = Status.COMPILE_ERROR if "ompil" in type(exc).__name__ else Status.LAUNCH_ERROR
            return kind, None
        cut, head = self._head(st["pristine"][0], out)
        if isinstance(out, tuple) and bool((head[1] != 0).any()):
            bad = int((head[1] != 0).sum())
            self._why[arm] = f"info != 0 on {bad} SPD problem(s) of the gate's {len(head[1])}"
            return Status.INCORRECT, None
        res = problems.residual(st["sig"], cut, {}, head)
        ratio = res / max(st["torch_residual"], 1e-300)
        bound = problems.residual_bound(st["sig"], st["torch_residual"], self.factor)
        if not res <= bound:
            self._why[arm] = f"residual {res:.3g} over the bound {bound:.3g} (torch {st['torch_residual']:.3g})"
        return (Status.OK if res <= bound else Status.INCORRECT), (ratio if math.isfinite(ratio) else None)

    # --- timing ------------------------------------------------------------------------------
    def _graph(self, st: dict[str, Any], arm: str) -> Any:
        graph = st["graphs"].get(arm)
        if graph is None:
            torch = self.torch
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._call(st, arm, st["working"][0])  # warm: compiled, allocator primed
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=st["pool"]):
                for args in st["working"]:
                    self._call(st, arm, args)
            st["graphs"][arm] = graph
        return graph

    def _once_ms(self, st: dict[str, Any], arm: str, replays: int = 1) -> float:
        """GPU ms of `replays` back-to-back replays of the arm's graph (one, with the inputs
        restored before it, for a solver op). A spin kernel runs before the start event, so the
        window opens on a GPU already fed: the host's event record and graph launch (several us,
        with jitter of as much, against a 10-20 us replay at batch 256) fall outside it."""
        torch = self.torch
        if st["restore"]:
            self._restore(st)
            replays = 1
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if arm == configs.EAGER_ONLY:
            torch.cuda.synchronize()
            start.record()
            for args in st["working"]:
                self._call(st, arm, args)
        else:
            graph = self._graph(st, arm)
            torch.cuda._sleep(LEAD_CYCLES)
            start.record()
            for _ in range(replays):
                graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / replays

    def sample(self, cell: Cell, order: Sequence[str]) -> Mapping[str, float | Status]:
        st = self._open(cell)
        out: dict[str, float | Status] = {}
        per_problem = st["ring"] * cell.batch
        for arm in order:
            try:
                reps = st["reps"].get(arm)
                if reps is None:  # first sample: one probe replay sizes the rest
                    probe = self._once_ms(st, arm)
                    reps = st["reps"][arm] = max(1, min(50, math.ceil(TARGET_US / 1000.0 / max(probe, 1e-6))))
                    st["short"][arm] = probe * 1000.0 < BACK_TO_BACK_MIN_US
                if st["restore"] or arm == configs.EAGER_ONLY or st["short"][arm]:
                    total = sum(self._once_ms(st, arm) for _ in range(reps))
                else:  # nothing to restore: one window over every replay of the sample
                    total = self._once_ms(st, arm, reps) * reps
                out[arm] = total * 1e6 / (reps * per_problem)
            except Exception as exc:  # a capture or replay failure costs this arm
                self._why[arm] = "timing: " + describe(exc)
                out[arm] = Status.LAUNCH_ERROR
        return out


def describe(exc: BaseException) -> str:
    """'ExcType: message' on one line, cut to WHY_CHARS; a message of many lines (a Triton
    compile error: the place, pages of source, then the problem) keeps its first and last."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    body = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}" if lines else ""
    text = f"{type(exc).__name__}: {body}" if body else type(exc).__name__
    return text if len(text) <= WHY_CHARS else text[:WHY_CHARS - 3] + "..."

