"""linalg entry points on inputs session 51's probe found unserved: meta tensors at an n outside
2..128 (shape inference before a model is materialized) and nested tensors (a named refusal)."""
from __future__ import annotations

import warnings

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.linalg import ops


@pytest.mark.parametrize("n", [1, 129, 200])
@pytest.mark.parametrize("autocast", [False, True])
def test_meta_tensors_outside_the_served_n_give_meta_results_of_torchs_shapes(n, autocast):
    A = torch.empty(3, n, n, device="meta")
    b = torch.empty(3, n, device="meta")
    with torch.autocast("cpu", enabled=autocast):
        L, info = ops.potrf(A)
        x, info2 = ops.posv(A, b)
        y = ops.gemv(A, b)
    assert L.shape == (3, n, n) and x.shape == (3, n) and y.shape == (3, n)
    assert info.shape == info2.shape == (3,)
    assert L.device.type == x.device.type == y.device.type == "meta"


def _nested(*shapes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.ones(s) for s in shapes])


@pytest.mark.parametrize("which", ["first", "second"])
def test_a_nested_tensor_is_refused_by_name(which):
    x = _nested((3,), (3,))
    args = (x, torch.ones(2, 3)) if which == "first" else (torch.ones(2, 3), x)
    with pytest.raises(SignatureError, match=r"dot's [xy] must be a dense tensor, got a nested tensor"):
        ops.dot(*args)
    with pytest.raises(SignatureError, match="potrf's A must be a dense tensor"):
        ops.potrf(_nested((3, 3), (3, 3)))


def test_recommend_with_every_dependency_never_names_an_arm_past_its_batch_limit():
    """The CUDA tier takes the batch as a 32-bit int: at 2**31 problems its arm is invalid for a
    reason of its own, not for a missing NVRTC, so deps="all" names no such plan."""
    import tunedb

    at_limit = tunedb.recommend("posv", "fp32", 64, 2**31 - 1, deps="all")
    past = tunedb.recommend("posv", "fp32", 64, 2**31, deps="all")
    assert not past.arm.startswith("cuda") and past.grid <= 2**31 - 1, (past.arm, past.grid)
    assert at_limit.grid <= 2**31 - 1


@pytest.mark.parametrize("alias,canonical", [("float", "float32"), ("double", "float64"), ("half", "float16")])
def test_recommend_takes_torchs_dtype_aliases(alias, canonical):
    import tunedb

    assert tunedb.recommend("gemv", alias, 16, 4096) == tunedb.recommend("gemv", canonical, 16, 4096)
