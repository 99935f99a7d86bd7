"""tunedb: measured kernel selection for PyTorch on NVIDIA GPUs.

Public API (imported lazily; importing tunedb touches neither the GPU nor the disk):
    tunedb.reload()            start a new database epoch
    tunedb.tuning_report()     one line per family: how each call resolved, per tier
    tunedb.optimize(model)     patch in the tuned ops of GEMM and of every family measured on this GPU
    tunedb.autotune(...)       context manager: measure shapes no tier covers
    tunedb.prewarm(...)        measure a model's uncovered must-tune points before capture
    tunedb.confirm(...)        judge a model's Triton picks inside its captured forward
    tunedb.recommend(...)      the execution plan of one small batched linear-algebra cell
    tunedb.register_ops()      every family's torch.library ops now (before torch.export.load)
    tunedb.cutoff              solver choice by measurement (probe / fit / persist; solve(linsys="auto"))
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "reload": "tunedb.runtime.selector:reload",
    "tuning_report": "tunedb.runtime.report:tuning_report",
    "optimize": "tunedb.runtime.patching:optimize",
    "autotune": "tunedb.runtime.autotuner:autotune",
    "prewarm": "tunedb.runtime.prewarm:prewarm",
    "confirm": "tunedb.runtime.confirm:confirm",
    "recommend": "tunedb.families.linalg.plan:recommend",
    "register_ops": "tunedb.runtime.dispatch:register_all",
}

__all__ = ["__version__", "cutoff", *_LAZY]


def __getattr__(name: str) -> Any:
    if name == "cutoff":  # a subpackage: importing it touches neither torch nor the disk
        return importlib.import_module("tunedb.cutoff")
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'tunedb' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
