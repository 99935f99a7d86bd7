"""Session 22's robustness pass over the linalg family's public surface on the CPU (the ops, the
recommend() call and `tunedb linalg ...`): each test fails before its fix."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tunedb.families.linalg import ops as la


def _spd(batch: int, n: int, dtype=torch.float64, seed: int = 0):
    g = torch.randn(batch, n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (g @ g.mT / n + torch.eye(n, dtype=torch.float64)).to(dtype)


def test_an_ops_first_call_may_be_inside_torch_compile_fullgraph():
    # a fresh interpreter: the first call registered the ops under Dynamo, which cannot enter
    # register()'s lock ("Unsupported context manager" under fullgraph=True)
    code = (
        "import torch\n"
        "from tunedb.families.linalg import ops as la\n"
        "a = torch.eye(4, dtype=torch.float64).repeat(3, 1, 1) * 4.0\n"
        "b = torch.ones(3, 4, dtype=torch.float64)\n"
        "f = torch.compile(lambda a, b: la.posv(a, b), backend='eager', fullgraph=True)\n"
        "x, info = f(a, b)\n"
        "assert torch.equal(x, torch.full((3, 4), 0.25, dtype=torch.float64)), x\n"
        "assert info.tolist() == [0, 0, 0], info\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
