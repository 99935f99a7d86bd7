"""Solver choice by measurement: the probe / fit / persist cutoff recipe (spec 003, issue 21).

Two solvers consume one block-tridiagonal strip layout (`layout`): `direct` (block Cholesky,
flat cost) and `pcg` (block-Jacobi preconditioned CG, warm-start friendly). Which one to run is
workload evidence: `probe` runs the caller's workload once per policy and keeps every solve's
time and switching signal, `fit` picks the cutoff on the signal that optimizes the statistic the
deployment bounds (and the band around it), `persist` writes the decision with its provenance
into the user's configuration, and `solve(..., linsys="auto", signal=s)` switches per solve.
Nothing here imports torch until a function runs.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "direct": "tunedb.cutoff.solvers", "pcg": "tunedb.cutoff.solvers", "solve": "tunedb.cutoff.solvers",
    "residual": "tunedb.cutoff.layout", "random_system": "tunedb.cutoff.layout",
    "probe": "tunedb.cutoff.probing", "Trace": "tunedb.cutoff.probing", "Probe": "tunedb.cutoff.probing",
    "fit": "tunedb.cutoff.fitting", "Fit": "tunedb.cutoff.fitting",
    "persist": "tunedb.cutoff.store", "lookup": "tunedb.cutoff.store", "Decision": "tunedb.cutoff.store",
    "load": "tunedb.cutoff.store",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tunedb.cutoff' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
