"""An op's very first call may come inside torch.compile(fullgraph=True): each family's entry
point is called for the first time in a fresh process under a full-graph compile (the op must be
registered before Dynamo traces the call: a registration under the trace hit its lock and raised
"Unsupported context manager"), and the result equals the eager one."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

SNIPPETS = {
    "bmm": """
import torch
from tunedb.families.bmm.ops import bmm
a, b = torch.randn(3, 5, 7).half(), torch.randn(3, 7, 4).half()
got = torch.compile(lambda a, b: bmm(a, b), fullgraph=True)(a, b)
assert torch.equal(got, bmm(a, b)), (got - bmm(a, b)).abs().max()
print("ok")
""",
    "group_gemm": """
import torch
from tunedb.families.group_gemm.ops import group_gemm
g = torch.Generator().manual_seed(0)
x, w = torch.randn(6, 8, generator=g).bfloat16(), torch.randn(4, 5, 8, generator=g).bfloat16()
ids = torch.randint(0, 4, (6, 2), generator=g)
got = torch.compile(lambda x, w, i: group_gemm(x, w, i), fullgraph=True)(x, w, ids)
assert torch.equal(got, group_gemm(x, w, ids))
print("ok")
""",
}


@pytest.mark.parametrize("op", sorted(SNIPPETS))
def test_a_first_call_inside_a_full_graph_compile(op):
    proc = subprocess.run([sys.executable, "-c", SNIPPETS[op]], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


BREAK = """
import copy, torch, torch.nn as nn, tunedb
torch.manual_seed(0)
class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)
    def forward(self, x):
        x = self.fc2(self.act(self.fc1(x)))
        torch._dynamo.graph_break()
        return x * 2
model = M().bfloat16()
plain = copy.deepcopy(model)
tunedb.optimize(model, families="all")
x = torch.randn(4, 16, dtype=torch.bfloat16)
with torch.no_grad():
    got = torch.compile(model, backend="{backend}")(x)
assert torch.equal(got, plain(x).detach()), (got - plain(x)).abs().max()
print("ok")
"""


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_optimized_models_first_call_compiled_in_a_frame_that_graph_breaks(backend):
    """The process's first tunedb call inside a compiled frame that graph-breaks after it: Dynamo
    analyses such a frame twice, and a lazy binding of the checks on that first call ran between
    the passes (SpeculationLogDivergence); the names are bound at import now."""
    proc = subprocess.run([sys.executable, "-c", BREAK.replace("{backend}", backend)], capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
