"""Probe: run the caller's workload once per candidate policy and keep every solve's time.

The workload is the caller's real loop, a callable `workload(solver)`: it calls
`solver(strip, b, x0, signal=s)` wherever it would solve (s: the caller's switching signal, a
host number such as a warm-start error estimate or a disturbance flag) and uses the returned x.
A probe runs it once per policy ("direct", "iterative", or "auto" with a decision) and records
per solve the wall time and the signal: CUDA events around each solve on a GPU (read after the
run, so the probe adds no host sync), time.perf_counter on the CPU. Traces are kept whole, not
only their means: the tail is where the policies differ. On a GPU the measuring code's busy
check applies: a foreign compute process at the start refuses the probe (BusyGPUError); one that
appears during it is recorded in `contended_by` (allow_busy measures anyway and records them).
"""
from __future__ import annotations

import json
import math
import numbers
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tunedb.input_files import read_text
from tunedb.errors import BusyGPUError, CutoffError, TunedbError

FORMAT = "tunedb-cutoff-probe"


@dataclass(frozen=True)
class Trace:
    """One policy's run: per solve, in order, the wall time (ms) and the caller's signal."""

    policy: str
    times_ms: tuple[float, ...]
    signals: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times_ms) != len(self.signals):
            raise CutoffError(f"trace {self.policy!r}: {len(self.times_ms)} times but {len(self.signals)} signals")
        for what, values in (("time", self.times_ms), ("signal", self.signals)):
            for v in values:
                if isinstance(v, bool) or not isinstance(v, numbers.Real):
                    raise CutoffError(f"trace {self.policy!r}: {what} {v!r} ({type(v).__name__}) is not a number; "
                                      "every time and signal must be a finite number")
            bad = next((v for v in values if not math.isfinite(v)), None)
            if bad is not None:
                raise CutoffError(f"trace {self.policy!r}: {what} {bad} is not finite; every time and signal "
                                  "must be a finite number")
        if any(t < 0 for t in self.times_ms):
            raise CutoffError(f"trace {self.policy!r}: time {min(self.times_ms)} ms is negative; times are >= 0")

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "times_ms": list(self.times_ms), "signals": list(self.signals)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Trace":
        def num(v: Any) -> Any:  # a non-number stays as it was, for __post_init__ to name
            return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v

        return cls(str(data["policy"]), tuple(num(v) for v in data["times_ms"]),
                   tuple(num(v) for v in data["signals"]))


@dataclass(frozen=True)
class Probe:
    """Every policy's trace of one workload, with where and how it was measured."""

    problem: str
    device: str
    timer: str  # "cuda_events" or "perf_counter"
    traces: Mapping[str, Trace]
    provenance: Mapping[str, str] = field(default_factory=dict)
    contended_by: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": 1, "problem": self.problem, "device": self.device,
                "timer": self.timer, "provenance": dict(self.provenance),
                "contended_by": list(self.contended_by),
                "traces": {k: t.to_json() for k, t in self.traces.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Probe":
        if not isinstance(data, Mapping):
            raise CutoffError(f"not a probe file: a JSON {type(data).__name__} where a probe is an object "
                              f"with format {FORMAT!r} (what `tunedb cutoff probe --out` writes)")
        if data.get("format") != FORMAT:
            raise CutoffError(f"not a probe file: format {data.get('format')!r}, expected {FORMAT!r}")
        if data.get("version", 1) != 1:  # a newer tunedb's file: its fields may mean other things
            raise CutoffError(f"probe file version {data.get('version')!r}; this tunedb reads version 1")
        for name in ("problem", "device", "timer"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise CutoffError(f"probe file field {name!r} must be a non-empty string, got {data.get(name)!r}")
        for name, kind in (("traces", Mapping), ("provenance", Mapping), ("contended_by", list)):
            if (name in data or name == "traces") and not isinstance(data.get(name), kind):
                raise CutoffError(f"probe file field {name!r} must be a JSON "
                                  f"{'object' if kind is Mapping else 'list'}, got {type(data[name]).__name__}")
        pids = data.get("contended_by", [])
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in pids):
            raise CutoffError(f"probe file field 'contended_by' must list process ids (integers), got {pids!r}")
        return cls(data["problem"], data["device"], data["timer"],
                   {k: Trace.from_json(v) for k, v in data["traces"].items()},
                   {k: str(v) for k, v in data.get("provenance", {}).items()}, tuple(pids))

    def save(self, path: str | Path) -> Path:
        from tunedb.database.store import write_atomic

        path = Path(path)
        write_atomic(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Probe":
        try:
            return cls.from_json(json.loads(read_text(path)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, CutoffError):
                raise
            raise CutoffError(f"cannot read probe file {path}: {type(exc).__name__}: {exc}") from exc


class Recorder:
    """The solver a workload calls during a probe: solves by one policy and times each call."""

    def __init__(self, policy: str, device: Any, decision: Any = None, **solve_kwargs: Any) -> None:
        import torch

        self.policy, self.decision, self.kwargs = policy, decision, solve_kwargs
        self.cuda = torch.device(device).type == "cuda"
        self._events: list[tuple[Any, Any]] = []
        self._times: list[float] = []
        self._oks: list[Any] = []  # per solve, which systems converged (direct: positive definite)
        self.signals: list[float] = []

    def __call__(self, strip: Any, b: Any, x0: Any = None, *, signal: float, **kwargs: Any) -> Any:
        from tunedb.cutoff import solvers

        if solvers.is_bool(signal):  # recorded as 1.0 / 0.0, a trace the fit reads
            raise CutoffError(f"signal={signal!r} must be a number (the switching signal of this solve), not a bool")
        kw = {**self.kwargs, **kwargs}
        want_ok = kw.pop("return_ok", False)
        kw["return_ok"] = True  # kept, read once at the trace's end (no host sync per solve)
        if self.cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            x = solvers.solve(strip, b, x0, linsys=self.policy, signal=signal, decision=self.decision, **kw)
            end.record()
            self._events.append((start, end))
        else:
            t0 = time.perf_counter()
            x = solvers.solve(strip, b, x0, linsys=self.policy, signal=signal, decision=self.decision, **kw)
            self._times.append((time.perf_counter() - t0) * 1e3)
        x, ok = x
        self._oks.append(ok)
        self.signals.append(float(signal))
        return (x, ok) if want_ok else x

    def failed(self, discard: int = 0) -> tuple[int, int]:
        """(kept solves that left a system unconverged or not positive definite, kept solves)."""
        kept = self._oks[discard:]
        return sum(1 for ok in kept if not bool(ok.all())), len(kept)

    def trace(self, discard: int = 0) -> Trace:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in self._events]
        else:
            times = list(self._times)
        return Trace(self.policy, tuple(times[discard:]), tuple(self.signals[discard:]))


def _env() -> Any:
    from tunedb.measure.gpuenv import NvmlEnv

    return NvmlEnv()


def probe(workload: Callable[[Callable[..., Any]], Any], *, problem: str,
          policies: Sequence[str] = ("direct", "iterative"), device: Any = "cuda", decision: Any = None,
          discard: int = 3, allow_busy: bool = False, env: Any = None, **solve_kwargs: Any) -> Probe:
    """Run `workload(solver)` once per policy; every solve's time and signal kept (the first
    `discard` solves of each run dropped: compiles and first-call resolution). solve_kwargs
    (tol, max_iter, check_every, kernels) go to every solve."""
    import torch

    from tunedb.cutoff import store
    from tunedb.measure import provenance

    if not isinstance(problem, str) or not problem:  # else the run was spent on a file load() refuses
        raise CutoffError(f"problem={problem!r} must be a non-empty string (the problem class the cutoff is "
                          f"persisted under; tunedb.cutoff.store.problem_class(strip) names the default one)")
    if isinstance(discard, bool) or not isinstance(discard, int) or discard < 0:
        raise CutoffError(f"discard must be an integer >= 0 (solves dropped from each run's start); got {discard!r}")
    for p in policies:
        if p not in ("direct", "iterative", "auto"):
            raise CutoffError(f"policy {p!r} not supported; allowed: direct, iterative, auto")
        if p == "auto" and decision is None:
            raise CutoffError("probing policy 'auto' needs decision= (a fitted Decision)")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise CutoffError(f"device={device!r} is not a torch device ({exc}); allowed: 'cuda', 'cuda:N', 'cpu'") from None
    cuda = dev.type == "cuda"
    if cuda and env is None and not torch.cuda.is_available():  # (an env given: a test's stand-in GPU)
        raise CutoffError(f"device={device!r}: no CUDA GPU here (torch {torch.__version__}); probe on the GPU "
                          "that will run the solves (the cutoff is per device), or device='cpu' to try the recipe")
    gpu: dict[str, str] = {}
    seen: set[int] = set()
    if cuda:
        env = env if env is not None else _env()
        busy = env.foreign_pids()
        if busy and not allow_busy:
            raise BusyGPUError(f"the GPU is busy: foreign compute process(es) {sorted(busy)}; "
                               "probe on a quiet GPU or pass allow_busy=True (recorded)")
        seen |= set(busy)
        gpu = dict(env.identity()) if hasattr(env, "identity") else {}
    traces = {}
    for policy in policies:
        rec = Recorder(policy, dev, decision if policy == "auto" else None, **solve_kwargs)
        try:
            workload(rec)
        except TunedbError:
            raise
        except Exception as exc:  # the user's code: one line naming it, as tune and census do
            raise CutoffError(f"the workload failed under policy {policy!r}: {type(exc).__name__}: {exc} "
                              f"(it is called as FN(solver); run it on its own to see the traceback)") from exc
        traces[policy] = rec.trace(discard)
        if not traces[policy].times_ms and rec.signals:
            raise CutoffError(f"discard={discard} drops every one of the {len(rec.signals)} solves of policy "
                              f"{policy!r}'s run; discard fewer (default 3: compiles and first calls)")
        bad, kept = rec.failed(discard)
        if bad:  # a time of a solve that did not finish: a fit on it favours the policy that gave up
            what = ("left systems unconverged (raise max_iter or loosen tol)" if policy != "direct" else
                    "met systems that are not positive definite (NaN in x)")
            raise CutoffError(f"policy {policy!r}: {bad} of the {kept} timed solves {what}; "
                              f"max_iter={solve_kwargs.get('max_iter', 100)}, tol={solve_kwargs.get('tol')}: "
                              "no cutoff is fitted on solves that did not solve")
        if cuda:
            seen |= set(env.foreign_pids())
    prov = provenance.collect(gpu).to_json()
    return Probe(problem, store.device_name(dev), "cuda_events" if cuda else "perf_counter", traces,
                 prov, tuple(sorted(seen)))
