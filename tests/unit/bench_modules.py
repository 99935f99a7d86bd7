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
