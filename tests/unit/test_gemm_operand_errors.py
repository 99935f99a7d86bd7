"""The tuned GEMM ops' errors for operands that do not fit together are also torch's error type."""
import pytest
import torch

from tunedb.families.gemm import ops


def test_operands_that_do_not_fit_raise_what_torch_raises_too():
    # torch's F.linear raises RuntimeError for a K or dtype that differs; code catching it around
    # an nn.Linear must still catch it around a tuned one (the error is a SignatureError as well)
    from tunedb.errors import SignatureError

    w = torch.randn(4, 3, dtype=torch.bfloat16)
    for x in (torch.randn(2, 3), torch.randn(2, 5, dtype=torch.bfloat16)):
        with pytest.raises(RuntimeError) as err:
            ops.gemm(x, w)
        assert isinstance(err.value, SignatureError)
