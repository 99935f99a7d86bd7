"""What a user met in the linalg API (session 28 audit): recommend() named torch.float32 as a
dtype potrf "does not take", accepted a bool or a one-element tensor as a batch and planned Triton
grids CUDA cannot launch; a sparse input failed deep in torch (or ran); `linalg tune --ops potrf
--legs ladder` blamed the dtypes."""
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import tunedb
from tunedb.errors import SignatureError
from tunedb.families.linalg import configs, ops, signatures


@pytest.mark.parametrize("dtype", [torch.float32, "float32", "torch.float32"])
def test_recommend_takes_a_torch_dtype_or_its_name(dtype):
    assert tunedb.recommend("potrf", dtype, 8, 4096) == tunedb.recommend("potrf", "fp32", 8, 4096)


def test_a_dtype_the_op_does_not_take_is_still_named():
    with pytest.raises(SignatureError, match="potrf does not take dtype 'fp16'; allowed: fp32, fp64"):
        tunedb.recommend("potrf", torch.float16, 8, 4096)
    with pytest.raises(SignatureError, match="'complex64'"):
        tunedb.recommend("potrf", "complex64", 8, 4096)


@pytest.mark.parametrize("batch", [torch.tensor(True), np.bool_(True), torch.tensor([4096]), np.array([4096])])
def test_a_bool_or_an_array_is_not_a_batch(batch):
    with pytest.raises(SignatureError, match="batch=.* must be a positive int"):
        tunedb.recommend("potrf", "fp32", 8, batch)


def test_a_true_n_is_named_as_given():
    with pytest.raises(SignatureError, match=r"n=tensor\(True\)"):
        tunedb.recommend("potrf", "fp32", torch.tensor(True), 4)


def test_integer_scalars_of_numpy_and_torch_still_count():
    want = tunedb.recommend("potrf", "fp32", 8, 4096)
    assert tunedb.recommend("potrf", "fp32", np.int64(8), torch.tensor(4096)) == want


@pytest.mark.parametrize("op,dt", [("potrf", "fp32"), ("gemm", "fp16")])
def test_no_plan_launches_more_programs_than_cuda_allows(op, dt):
    for batch in (10 ** 12, 10 ** 30):
        plan = tunedb.recommend(op, dt, 8, batch)
        assert plan.grid is None or plan.grid <= configs.GRID_X_MAX, plan
    cfg = configs.parse("thread_p256_w4")
    sig = signatures.make_signature("gemm", "fp16", 8)
    assert configs.invalid_reason(cfg, sig, 4096, None) is None
    assert "CUDA allows 2147483647" in configs.invalid_reason(cfg, sig, 256 * 2 ** 31, None)
    assert configs.invalid_reason(cfg, sig, None, None) is None  # any batch: the space itself


@pytest.mark.parametrize("to_sparse", [lambda t: t.to_sparse(), lambda t: t.to_sparse_csr()])
def test_a_sparse_input_is_refused_by_name(to_sparse):
    a = (torch.eye(4) * 2).expand(3, 4, 4).contiguous()
    x = torch.ones(3, 4)
    for call in (lambda: ops.potrf(to_sparse(a)), lambda: ops.gemv(to_sparse(a), x),
                 lambda: ops.gemm(to_sparse(a), a)):
        with pytest.raises(SignatureError, match="must be a dense \\(strided\\) tensor, got layout torch.sparse"):
            call()


def test_tune_names_the_ops_outside_the_chosen_legs(tmp_path):
    out = subprocess.run([sys.executable, "-m", "tunedb", "linalg", "tune", "--ops", "potrf", "--legs", "ladder"],
                         capture_output=True, text=True, timeout=120,
                         env={"TUNEDB_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2, out.stderr
    assert "the ops potrf are in none of the legs ladder" in out.stderr and "solver: potrf" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("op, args, named", [
    ("potrf", (torch.ones(4, 5),), "[4, 5]"),
    ("gemv", (torch.ones(200, 200), torch.ones(201)), "[201]"),
    ("trsv", (torch.eye(3).expand(1, 2, 3, 3), torch.ones(1, 2, 4)), "[1, 2, 4]"),
])
def test_a_bad_shape_with_leading_dims_is_named_as_the_caller_passed_it(op, args, named):
    # the checks ran on the folded operands: potrf of a [4, 5] matrix said "got shape (1, 4, 5)"
    with pytest.raises(SignatureError, match=re.escape(named)):
        getattr(ops, op)(*args)


def test_a_matrix_of_right_hand_sides_is_refused_as_what_it_is():
    # posv(A [4, 4], b [4, 2]) said the batch shapes differed: b takes one vector per problem
    with pytest.raises(SignatureError, match=r"one vector per problem.*\[4, 2\]"):
        ops.posv(torch.eye(4), torch.ones(4, 2))


def test_recommend_names_a_batch_held_by_a_meta_tensor():
    import tunedb

    with pytest.raises(SignatureError, match="batch="):
        tunedb.recommend("potrf", "fp32", 8, torch.tensor(5, device="meta"))
