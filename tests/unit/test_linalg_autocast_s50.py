"""The linalg ops under torch.autocast: the result keeps the operands' dtype on every path (eager
entry, the op, a compiled call, the fake kernel), as the fake promises; autocast used to cast the
CPU torch arm's bmm to bf16 eagerly while the compiled call returned fp32."""
from __future__ import annotations

import pytest
import torch

from tunedb.families.linalg import ops


@pytest.mark.parametrize("op", ["dot", "gemv", "gemm", "trsv", "posv", "potrf"])
def test_autocast_leaves_the_ops_dtype_alone(op):
    torch.manual_seed(0)
    a = torch.randn(3, 6, 6, dtype=torch.float32)
    spd = a @ a.mT + 6 * torch.eye(6)
    v = torch.randn(3, 6)
    args = {"dot": (v, v), "gemv": (a, v), "gemm": (a, a), "trsv": (torch.linalg.cholesky(spd), v),
            "posv": (spd, v), "potrf": (spd,)}[op]
    fn = getattr(ops, op)
    ref = fn(*args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = fn(*args)
        through_op = getattr(torch.ops.tunedb, f"linalg_{op}")(*args)
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    for got in (eager, through_op, compiled):
        got = got[0] if isinstance(got, tuple) else got
        want = ref[0] if isinstance(ref, tuple) else ref
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want)


def test_autocast_past_the_tables_n_keeps_the_dtype():
    a = torch.randn(2, 130, 130)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ops.gemm(a, a).dtype == torch.float32
