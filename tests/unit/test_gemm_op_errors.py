"""The GEMM ops' argument errors are tunedb's SignatureError (still a ValueError), and a weight on
another device than x is named before the key is resolved (it was served: a CPU x with a meta
weight returned a result)."""
from __future__ import annotations

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.gemm import ops


@pytest.mark.parametrize("call, words", [
    (lambda x, w: ops.gemm(x, w[:, :30]), "weight's K=30"),
    (lambda x, w: ops.gemm(x, w.float()), "differs from weight dtype"),
    (lambda x, w: ops.gemm(x, w.view(2, 8, 32)), "weight must be 2-D"),
    (lambda x, w: ops.gemm_act(x, w, torch.zeros(3, dtype=x.dtype)), r"bias must have shape \(16,\)"),
    (lambda x, w: ops.gemm(x, w.to("meta")), "gemm's tensors must be on one device; got x on cpu, weight on meta"),
    (lambda x, w: ops.gemm_act(x, w, torch.zeros(16, dtype=x.dtype, device="meta"), "relu"), "bias on meta"),
])
def test_bad_arguments_are_signature_errors(call, words):
    x, w = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    with pytest.raises(SignatureError, match=words):
        call(x, w)
