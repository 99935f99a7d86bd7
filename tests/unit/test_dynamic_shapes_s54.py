"""A dynamic token count through the op families whose keys read it (bmm, group_gemm, scaled_mm):
torch.compile(dynamic=True) traces one graph for every M, and torch.export with a dynamic dimension
exports a program that runs at another M. Their fake kernels called int() on the traced size, which
specialised the graph to the first M (a recompile per token count; export refused the dimension)."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch.export import Dim, export

from tunedb.families.bmm.ops import bmm
from tunedb.families.group_gemm.ops import group_gemm
from tunedb.families.scaled_mm.ops import scaled_mm_int8

_W = torch.randn(3, 4, 8, dtype=torch.bfloat16)  # 3 experts: no M below equals E (Dynamo's duck sizing)
_B = torch.randn(2, 8, 4)
_WI8 = torch.randint(-5, 5, (8, 16), dtype=torch.int8)
_SW = torch.rand(1, 8)


def _bmm_args(m):
    return (torch.randn(2, m, 8),)


def _gg_args(m):
    return torch.randn(m, 8, dtype=torch.bfloat16), torch.randint(0, 3, (m, 2))


def _i8_args(m):
    return torch.randint(-5, 5, (m, 16), dtype=torch.int8), torch.rand(m, 1)


CASES = {
    "bmm": (lambda a: bmm(a, _B), _bmm_args, ({1: Dim("M", min=2, max=4096)},)),
    "group_gemm": (lambda x, ids: group_gemm(x, _W, ids), _gg_args,
                   ({0: Dim("M", min=2, max=4096)}, {0: Dim("M", min=2, max=4096)})),
    "scaled_mm_int8": (lambda x, sx: scaled_mm_int8(x, _WI8, sx, _SW, torch.bfloat16), _i8_args,
                       ({0: Dim("M", min=2, max=4096)}, {0: Dim("M", min=2, max=4096)})),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_dynamic_compile_traces_one_graph_for_every_token_count(name):
    fn, args, _ = CASES[name]
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
    for m in (5, 7, 12, 33):
        a = args(m)
        torch.testing.assert_close(compiled(*a), fn(*a))
    assert counter.frame_count == 1, f"{name}: {counter.frame_count} graphs for 4 token counts"


@pytest.mark.parametrize("name", sorted(CASES))
def test_export_with_a_dynamic_token_count_runs_at_another_count(name):
    fn, args, dims = CASES[name]

    class Wrap(torch.nn.Module):
        def forward(self, *a):
            return fn(*a)

    program = export(Wrap(), args(6), dynamic_shapes=(dims,))
    a = args(21)
    torch.testing.assert_close(program.module()(*a), fn(*a))


def test_a_dynamic_backward_through_bmm_and_group_gemm_traces_one_graph():
    w = _W.clone().requires_grad_(True)
    for fn, args in ((lambda a: bmm(a, _B), _bmm_args), (lambda x, ids: group_gemm(x, w, ids), _gg_args)):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(fn, backend=counter, dynamic=True)
        for m in (5, 9, 14):
            a = list(args(m))
            a[0] = a[0].requires_grad_(True)
            compiled(*a).float().sum().backward()
            got = a[0].grad.clone()
            a[0].grad = None
            fn(*a).float().sum().backward()
            torch.testing.assert_close(got.float(), a[0].grad.float(), atol=3e-2, rtol=3e-2)
        assert counter.frame_count == 1
