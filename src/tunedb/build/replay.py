"""A build replayed from a recorded measurement log (`tunedb build --replay LOG`): no GPU, and
every number the log's.

A device call can end before its table comes back while its measurement log survives (session
13's call F lost a rebuilt fp8 table that way). The replay rebuilds that table on any machine:
each planned point measures the configs the log holds at that (signature, M) -- the recorded
run's own plan, whatever this machine's cost model would rank first -- and each request is
answered with the logged Measurement itself (median, samples, status, environment), so the
partition, the pick rule and the write are the build's own over the device's numbers. The file's
soft validators are the log's (its torch, Triton, CUDA, GPU, tunedb and the family's
implementation hash; this code's hash for a log that predates recording it), and the replay's
own log repeats the records under the recorded provenance. A point the log lacks, or a log built
for another arch family than the replay's, stops the replay.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

from tunedb.errors import BuildError
from tunedb.records import Measurement, Provenance, Signature


class LoggedRun:
    """A measurement log, keyed for a replay: (signature, M) -> its configs in first-logged order,
    and (signature, M, config) -> its Measurements in logged order. An arm timed in two calls at
    one point (the fallback, again in the cross call) answers a request with every record not yet
    served, each with its call's id, so the replayed arms pair as the recorded ones did
    (partition.objective_table); once all are served, the latest answers again."""

    def __init__(self, path: str | Path) -> None:
        from tunedb.measure.log import read_log

        self.path = Path(path)
        if not self.path.exists():
            raise BuildError(f"--replay {path}: no such measurement log")
        if not self.path.is_file():
            raise BuildError(f"--replay {path}: not a regular file (a directory, FIFO or device); give a measurement log")
        records = read_log(self.path)
        if not records:
            raise BuildError(f"--replay {path}: the log holds no measurement")
        # a --out DIR log holds every build written there (one run id each): the runs in the
        # order of their last record, the latest last; replan() keeps the latest that covers the plan
        runs: dict[str, list[Any]] = {}
        last: dict[str, int] = {}
        for i, r in enumerate(records):
            runs.setdefault(r.run_id, []).append(r)
            last[r.run_id] = i
        self._runs = {run: runs[run] for run in sorted(runs, key=last.__getitem__)}
        self.use(next(reversed(self._runs)))

    def use(self, run_id: str) -> None:
        """Answer from the run `run_id` of the log."""
        mine = self._runs[run_id]
        self.run_id = run_id
        self.provenance: Provenance = mine[-1].provenance
        self._arms: dict[tuple[Signature, int], dict[str, None]] = {}  # configs in first-logged order
        self._logged: dict[tuple[Signature, int, str], list[Measurement]] = {}
        self._served: dict[tuple[Signature, int, str], int] = {}
        for r in mine:
            m = r.measurement
            self._arms.setdefault((m.signature, m.m), {})[m.config_id] = None
            self._logged.setdefault((m.signature, m.m, m.config_id), []).append(m)

    def simulated(self) -> bool:
        """Whether the run answering was timed by the --simulate build's fake timer."""
        return any(dict(r.measurement.env).get("timer") == "fake" for r in self._runs[self.run_id])

    def use_latest_covering(self, points: Sequence[tuple[Signature, int]]) -> None:
        """Answer from the latest run that measured every point (none: stay on the latest run,
        whose first missing point stops the replay)."""
        for run_id in reversed(self._runs):
            held = {(r.measurement.signature, r.measurement.m) for r in self._runs[run_id]}
            if all(p in held for p in points):
                self.use(run_id)
                return

    def arms(self, sig: Signature, m: int) -> tuple[str, ...]:
        ids = self._arms.get((sig, m))
        if not ids:
            raise BuildError(f"--replay {self.path}: the log has no measurement of {sig.format()} at M={m}; "
                             f"replay the census and flags of the build that wrote it")
        return tuple(ids)

    def measured(self, sig: Signature, m: int, ids: Sequence[str]) -> tuple[Measurement, ...]:
        missing = [c for c in ids if (sig, m, c) not in self._logged]
        if missing:
            raise BuildError(f"--replay {self.path}: no measurement of {', '.join(missing)} for "
                             f"{sig.format()} at M={m}; the log holds {', '.join(self.arms(sig, m))}")
        out: list[Measurement] = []
        for c in ids:
            key = (sig, m, c)
            logged, i = self._logged[key], self._served.get(key, 0)
            out.extend(logged[i:] if i < len(logged) else logged[-1:])
            self._served[key] = len(logged)
        return tuple(out)

    def check_arch(self, arch_family: str) -> None:
        """A log names the arch family it was built for (logs before session 13's end do not)."""
        if self.provenance.arch and self.provenance.arch != arch_family:
            raise BuildError(f"--replay {self.path}: measured for {self.provenance.arch} "
                             f"({self.provenance.gpu_name or 'unknown GPU'}), not {arch_family}; "
                             f"pass --arch {self.provenance.arch}")

    def validators(self, impl_hash: str | None) -> dict[str, str]:
        """The recorded environment as a file's soft validators (what is unrecorded is left out).
        The implementation hash is the log's where it recorded one (so a log measured under
        other kernels reads stale), else `impl_hash` (this code's)."""
        p = self.provenance
        out = {"tunedb": p.tunedb, "torch": p.torch, "triton": p.triton, "cuda": p.cuda, "sku": p.gpu_name,
               "impl_hash": p.impl_hash or impl_hash or ""}
        return {k: v for k, v in out.items() if v}


def replan(plans: Sequence[Any], logged: LoggedRun) -> list[Any]:
    """Each plan's points measure the configs the log holds there (the recorded build's plan),
    from the latest run in the log that measured every planned point (else the latest run, whose
    first missing point stops the replay)."""
    logged.use_latest_covering([(p.signature, pt.m) for p in plans for pt in p.points])
    return [dataclasses.replace(p, arms={pt.m: logged.arms(p.signature, pt.m) for pt in p.points})
            for p in plans]
