"""The tuned ops decompose to their torch forms through torch._decomp's global table, which
torch.onnx.export (dynamo=True) reads: an optimized model exports to ONNX as the plain one does
(session 57: "No ONNX function found for tunedb.gemm_act"), while torch.export keeps the ops."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tunedb


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.fc2 = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x, img):
        return self.act(self.fc2(self.fc(x))), torch.relu(self.conv(img))


def _models():
    torch.manual_seed(0)
    plain = _Net().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), inplace=False, families="all")
    return plain, tuned, (torch.randn(4, 16), torch.randn(1, 3, 8, 8))


def _tunedb_targets(ep):
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function" and str(n.target).startswith("tunedb.")}


def test_the_global_table_decomposes_every_tuned_op_an_export_holds():
    from torch import _decomp

    plain, tuned, args = _models()
    ep = torch.export.export(tuned, args)
    held = [n.target for n in ep.graph.nodes if n.op == "call_function" and str(n.target).startswith("tunedb.")]
    assert held  # the export keeps the tuned ops (torch.export's own table leaves them)
    assert _tunedb_targets(ep.run_decompositions()) == {str(t) for t in held}
    table = {op: _decomp.decomposition_table[op] for op in held}
    flat = ep.run_decompositions(table)
    assert not _tunedb_targets(flat)
    with torch.no_grad():
        for a, b in zip(flat.module()(*args), plain(*args)):
            torch.testing.assert_close(a, b)


def test_onnx_export_of_an_optimized_model(tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    plain, tuned, args = _models()
    prog = torch.onnx.export(tuned, args, dynamo=True)
    assert prog is not None
    path = tmp_path / "net.onnx"
    prog.save(str(path))
    session = ort.InferenceSession(str(path))
    outs = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})
    with torch.no_grad():
        for a, b in zip(outs, plain(*args)):
            torch.testing.assert_close(torch.from_numpy(a), b, atol=1e-5, rtol=1e-5)
