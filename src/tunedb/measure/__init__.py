"""The measurement protocol: every number tunedb acts on is taken here.

    measure_point(family, sig, m, config_ids, *, timer=None, alpha=0.0, incumbent=None, ...)
    measure_problem(problem, *, timer=None, ...)      any Problem of Arms (toy arms in tests)
    measure_point_isolated(worker, family_name, ...)  the same in a worker subprocess
    FakeTimer, ReplayTimer, CudaGraphTimer            the timers (the last imports torch)
    EagerTimer                                        wall-clock launches on any device (CPU)
    inputs: rotate / ring / none                      the input policies of the timed calls
    MeasurementLog, read_log                          the JSONL measurement log
    Worker                                            the per-GPU benchmark subprocess
    collect_provenance()                              provenance for log lines

Attributes are imported on first use, so importing tunedb.measure touches neither torch nor the GPU.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "measure_point": "tunedb.measure.protocol",
    "measure_problem": "tunedb.measure.protocol",
    "measure_point_isolated": "tunedb.measure.isolated",
    "best": "tunedb.measure.protocol",
    "refuse_capture": "tunedb.measure.protocol",
    "Arm": "tunedb.measure.arms",
    "Problem": "tunedb.measure.arms",
    "arms_for": "tunedb.measure.arms",
    "problem_for": "tunedb.measure.arms",
    "FakeTimer": "tunedb.measure.timers",
    "ReplayTimer": "tunedb.measure.timers",
    "rotation_copies": "tunedb.measure.timers",
    "CudaGraphTimer": "tunedb.measure.cudagraph",
    "EagerTimer": "tunedb.measure.eager",
    "MeasurementLog": "tunedb.measure.log",
    "read_log": "tunedb.measure.log",
    "Worker": "tunedb.measure.worker",
    "NvmlEnv": "tunedb.measure.gpuenv",
    "GateResult": "tunedb.measure.gate",
}

__all__ = sorted([*_LAZY, "collect_provenance"])


def collect_provenance(**kwargs: Any) -> Any:
    from tunedb.measure.provenance import collect

    return collect(**kwargs)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tunedb.measure' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
