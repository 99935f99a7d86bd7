"""The measurement protocol: every number tunedb acts on is taken here.

    measure_point(family, sig, m, config_ids, *, timer=None, alpha=0.0, incumbent=None, ...)
    measure_problem(problem, *, timer=None, ...)      any Problem of Arms (toy arms in tests)
    measure_point_isolated(worker, family_name, ...)  the same in a worker subprocess
    FakeTimer, ReplayTimer, CudaGraphTimer            the timers (the last imports torch)
    MeasurementLog, read_log                          the JSONL measurement log
    Worker                                            the per-GPU benchmark subprocess
    collect_provenance()                              provenance for log lines

Attributes are imported on first use, so importing tunedb.bench touches neither torch nor the GPU.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "measure_point": "tunedb.bench.protocol",
    "measure_problem": "tunedb.bench.protocol",
    "measure_point_isolated": "tunedb.bench.protocol",
    "best": "tunedb.bench.protocol",
    "refuse_capture": "tunedb.bench.protocol",
    "Arm": "tunedb.bench.arms",
    "Problem": "tunedb.bench.arms",
    "arms_for": "tunedb.bench.arms",
    "problem_for": "tunedb.bench.arms",
    "FakeTimer": "tunedb.bench.timers",
    "ReplayTimer": "tunedb.bench.timers",
    "rotation_copies": "tunedb.bench.timers",
    "CudaGraphTimer": "tunedb.bench.cudagraph",
    "MeasurementLog": "tunedb.bench.log",
    "read_log": "tunedb.bench.log",
    "Worker": "tunedb.bench.worker",
    "NvmlEnv": "tunedb.bench.gpuenv",
    "GateResult": "tunedb.bench.gate",
}

__all__ = sorted([*_LAZY, "collect_provenance"])


def collect_provenance(**kwargs: Any) -> Any:
    from tunedb.bench.provenance import collect

    return collect(**kwargs)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tunedb.bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
