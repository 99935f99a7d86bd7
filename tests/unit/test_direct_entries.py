"""The eager entry points of the forward-only ops (linalg, bmm, conv, gemm_log_softmax) run the
implementation directly when runtime.grad_form.direct allows (plain eager CUDA inference) and
go through torch.ops.tunedb otherwise, with the same arguments either way.

On the CPU, direct() is always False; here it is forced to say yes so that the wiring (which
implementation, which arguments in which order) is checked; tests/gpu/test_direct_entries_gpu.py
checks the real decision and that both paths give the same result on the H200."""
import pytest
import torch

from tunedb.families.bmm import ops as bmm_ops
from tunedb.families.conv import ops as conv_ops
from tunedb.families.gemm_log_softmax import ops as glsm_ops
from tunedb.families.linalg import ops as linalg_ops
from tunedb.runtime import grad_form


def _spd(batch: int, n: int) -> torch.Tensor:
    g = torch.randn(batch, n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    return g @ g.transpose(1, 2) + n * torch.eye(n, dtype=torch.float64)


class Recorder:
    def __init__(self, result):
        self.calls, self.result = [], result

    def __call__(self, *args):
        self.calls.append(args)
        return self.result


def _force(monkeypatch, value: bool):
    seen = []

    def fake(args):
        seen.append(args)
        return value
    monkeypatch.setattr(grad_form, "direct", fake)
    return seen


@pytest.mark.parametrize("name,make", [
    ("dot", lambda: (torch.randn(3, 4), torch.randn(3, 4))),
    ("gemv", lambda: (torch.randn(3, 4, 4), torch.randn(3, 4))),
    ("gemm", lambda: (torch.randn(3, 4, 4), torch.randn(3, 4, 4))),
    ("trsv", lambda: (torch.randn(3, 4, 4).tril() + 4 * torch.eye(4), torch.randn(3, 4))),
    ("posv", lambda: (_spd(3, 4), torch.randn(3, 4, dtype=torch.float64))),
])
def test_linalg_entries_call_run_directly_when_allowed(monkeypatch, name, make):
    args = make()
    expected = getattr(linalg_ops, name)(*args)  # the op's own answer (direct is False on CPU)
    seen = _force(monkeypatch, True)
    rec = Recorder("direct")
    monkeypatch.setattr(linalg_ops, "run", rec)
    assert getattr(linalg_ops, name)(*args) == "direct"
    assert rec.calls == [(name, *args)] and seen == [args]
    _force(monkeypatch, False)
    got = getattr(linalg_ops, name)(*args)  # the op again: run is not reached from the recorder
    assert not isinstance(got, str)
    for g, e in zip(got if isinstance(got, tuple) else (got,), expected if isinstance(expected, tuple) else (expected,)):
        assert torch.equal(g, e)


def test_potrf_direct_returns_the_ops_row_major_factor(monkeypatch):
    a = _spd(2, 5)
    low_op, info_op = linalg_ops.potrf(a)
    _force(monkeypatch, True)
    low, info = linalg_ops.potrf(a)  # CPU run() takes the torch arm: L column-major, made row-major
    assert low.is_contiguous() and torch.equal(low, low_op) and torch.equal(info, info_op)


def test_bmm_entry_calls_run_directly_when_allowed(monkeypatch):
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    bmm_ops.register()  # before run is replaced: the op's kernel is the real one
    seen = _force(monkeypatch, True)
    rec = Recorder("direct")
    monkeypatch.setattr(bmm_ops, "run", rec)
    assert bmm_ops.bmm(a, b) == "direct" and rec.calls == [(a, b)] and seen == [(a, b)]
    _force(monkeypatch, False)
    assert torch.equal(bmm_ops.bmm(a, b), a @ b)


@pytest.mark.parametrize("op", ["conv1d", "conv2d"])
def test_conv_entries_pass_the_ops_arguments_to_the_implementation(monkeypatch, op):
    dims = 1 if op == "conv1d" else 2
    x = torch.randn(2, 4, *([9] * dims))
    w, bias = torch.randn(6, 2, *([3] * dims)), torch.randn(6)
    entry = getattr(conv_ops, op)
    via_op = entry(x, w, bias, stride=2, padding=1, dilation=1, groups=2, act="silu")
    seen = _force(monkeypatch, True)
    rec = Recorder("direct")
    monkeypatch.setattr(conv_ops, f"_{op}_impl", rec)
    assert entry(x, w, bias, stride=2, padding=1, dilation=1, groups=2, act="silu") == "direct"
    assert seen == [(x, w, bias)]
    (args,) = rec.calls
    assert args[:3] == (x, w, bias) and args[3:] == ([2] * dims, [1] * dims, [1] * dims, 2, "silu")
    monkeypatch.undo()
    _force(monkeypatch, True)  # the real implementation, directly: the op's result
    assert torch.equal(entry(x, w, bias, stride=2, padding=1, dilation=1, groups=2, act="silu"), via_op)


def test_gemm_log_softmax_entry_calls_the_implementation_directly_when_allowed(monkeypatch):
    x, w = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(16, 8, dtype=torch.bfloat16)
    via_op = glsm_ops.gemm_log_softmax(x, w)
    seen = _force(monkeypatch, True)
    rec = Recorder("direct")
    monkeypatch.setattr(glsm_ops, "_impl", rec)
    assert glsm_ops.gemm_log_softmax(x, w) == "direct" and rec.calls == [(x, w, None)]
    assert seen == [(x, w, None)]
    monkeypatch.undo()
    _force(monkeypatch, True)
    assert torch.equal(glsm_ops.gemm_log_softmax(x, w), via_op)
