"""Session 22's robustness pass over the linalg family's public surface on the CPU (the ops, the
recommend() call and `tunedb linalg ...`): each test fails before its fix."""
from __future__ import annotations

import math
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


def _calls(batch: int = 3, n: int = 5):
    a = _spd(batch, n)
    b = torch.randn(batch, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return {"dot": (b, b), "gemv": (a, b), "gemm": (a, a), "potrf": (a,),
            "trsv": (torch.linalg.cholesky(a), b), "posv": (a, b)}


@pytest.mark.parametrize("op", ["dot", "gemv", "gemm", "potrf", "trsv", "posv"])
def test_each_ops_fake_kernel_promises_the_strides_the_op_returns(op):
    # potrf's library arm returned cholesky_ex's column-major L while the fake promised a
    # row-major one: Inductor's stride assert failed torch.compile(la.potrf) on every CPU call
    args = _calls()[op]
    for given in (args, tuple(t.mT if t.dim() == 3 else t for t in args)):  # transposed inputs too
        torch.library.opcheck(getattr(torch.ops.tunedb, f"linalg_{op}").default, given,
                              test_utils=("test_faketensor", "test_aot_dispatch_static"))
    out = getattr(la, op)(*args)
    assert (out[0] if isinstance(out, tuple) else out).is_contiguous()


def test_potrf_compiles_with_inductor_and_matches_cholesky():
    a = _spd(4, 6)
    low, info = torch.compile(la.potrf, fullgraph=True)(a)
    torch.testing.assert_close(low, torch.linalg.cholesky(a))
    assert info.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("op", ["posv", "gemv", "potrf"])
def test_a_compiled_call_keeps_one_graph_as_the_batch_and_n_change(op):
    # the fake kernel made every size concrete (int() on the symbolic batch): each new batch
    # recompiled, and under fullgraph=True the 9th raised FailOnRecompileLimitHit
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(a, b):
        out = {"posv": lambda: la.posv(a, b)[0], "gemv": lambda: la.gemv(a, b), "potrf": lambda: la.potrf(a)[0]}[op]()
        return out * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    for batch, n in ((2, 4), (3, 4), (5, 4), (7, 4), (9, 6), (11, 7)):
        a = _spd(batch, n, seed=batch)
        b = torch.randn(batch, n, generator=torch.Generator().manual_seed(batch), dtype=torch.float64)
        torch.testing.assert_close(compiled(a, b), f(a, b))
    assert len(graphs) <= 3, f"{len(graphs)} graphs for 6 shapes"
    # past the family's n the entry point runs torch's forms (a guard on n's range, not an error)
    big, rhs = _spd(4, 130), torch.randn(4, 130, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = {"posv": lambda: torch.cholesky_solve(rhs.unsqueeze(2), torch.linalg.cholesky(big)).squeeze(2),
            "gemv": lambda: (big @ rhs.unsqueeze(2)).squeeze(2), "potrf": lambda: torch.linalg.cholesky(big)}[op]()
    torch.testing.assert_close(compiled(big, rhs), want * 2.0)
    torch._dynamo.reset()


@pytest.mark.parametrize("bad", [(64, 8, 1), (64, 9), (32, 8)])
def test_a_repeated_cuda_call_checks_b_as_the_first_call_does(tmp_path, bad):
    # the CUDA path's front memo keyed (op, A's dtype, n, batch): a later call with a mismatched
    # b hit the memo and skipped signature_of (the launcher's plain ValueError, not the
    # SignatureError the first call raised); meta tensors take the CUDA path's resolution
    from tunedb import settings
    from tunedb.database import tiers
    from tunedb.errors import SignatureError
    from tunedb.runtime import selector

    a = torch.empty(64, 8, 8, device="meta")
    with settings.override(USER_DB="off"), tiers.system_root_override(tmp_path):
        selector.configure(arch_family="sm90")
        try:
            la.bound_for("posv", a, torch.empty(64, 8, device="meta"))
            with pytest.raises(SignatureError, match=r"posv's b must have shape \[batch, n\] = \[64, 8\]"):
                la.bound_for("posv", a, torch.empty(*bad, device="meta"))
            with pytest.raises(SignatureError, match="share one dtype"):
                la.bound_for("posv", a, torch.empty(64, 8, device="meta", dtype=torch.float64))
        finally:
            selector.configure()


@pytest.mark.parametrize("op", ["dot", "gemv", "gemm", "potrf", "trsv", "posv"])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_a_none_given_for_a_tensor_is_named(op, device):
    # torch.ops hands None through for a Tensor argument: the op raised AttributeError
    # ('NoneType' object has no attribute 'device' / 'shape') from inside run() or signatures
    from tunedb.errors import SignatureError
    from tunedb.families.linalg import signatures

    args = tuple(t.to(device) for t in _calls()[op])
    for k, name in enumerate(signatures.ARG_NAMES[op]):
        given = args[:k] + (None,) + args[k + 1:]
        with pytest.raises(SignatureError, match=f"linalg {op}'s {name} must be a tensor, got None"):
            getattr(la, op)(*given)


def test_a_0d_tensor_on_the_cuda_path_is_named_not_indexed(tmp_path):
    # run()'s CUDA branch read first.shape[0] before any check: a 0-d CUDA tensor raised
    # IndexError; stand-ins with a "cuda" device take that branch on the CPU
    from types import SimpleNamespace

    from tunedb import settings
    from tunedb.database import tiers
    from tunedb.errors import SignatureError
    from tunedb.runtime import selector

    cuda = SimpleNamespace(type="cuda", index=0)

    def stand_in(*shape):
        return SimpleNamespace(device=cuda, is_cuda=True, get_device=lambda: 0, shape=shape, dtype=torch.float32,
                               numel=lambda: math.prod(shape))

    with settings.override(USER_DB="off"), tiers.system_root_override(tmp_path):
        selector.configure(arch_family="sm90")
        try:
            with pytest.raises(SignatureError, match=r"dot's x must have shape \[batch, n\], got \(\)"):
                la.run("dot", stand_in(), stand_in())
        finally:
            selector.configure()
