"""Importing a module of bench/ from a test: bench/ is a folder of scripts, not a package, so its
directory joins sys.path for the import only."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = str(Path(__file__).resolve().parents[2] / "bench")


def bench_module(name: str) -> ModuleType:
    sys.path.insert(0, BENCH)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(BENCH)


_PRELUDE = r"""
import sys, torch
sys.path.insert(0, BENCH)
from tunedb.arch import shipped_profile
calls = []
def timer(call, weights):
    call(*weights[0])
    calls.append(1)
    return 10.0 + len(calls)  # distinct times: the picks are well defined
"""


def bench_snippet(module: str, body: str) -> str:
    """A child-process snippet running `body` with bench/<module> imported as `g`, shipped_profile
    imported and `timer`, a stand-in for the benches' graph timer (calls the arm once; 10 us plus
    the call's ordinal)."""
    return f"BENCH = {BENCH!r}\n" + _PRELUDE + f"import {module} as g\n" + body
