"""The GPU checks the linalg packings' tests share (test_linalg_{lane,reg,rows,shfl,panel}_gpu.py):
the prior's configs of a packing, compiling them first, one config at one point against the fp64
reference (eagerly, or replayed from a CUDA graph), the non-SPD report, and a CUDA-graph replay."""
import torch

from tunedb.families.linalg import kernels_check as check
from tunedb.families.linalg import kernels_prebuild
from tunedb.families.linalg import kernels_space as space
from tunedb.families.linalg import kernels_prior as prior
from tunedb.families.linalg.launch import launch



def packing_configs(packing, op, n, dt, count):
    """The prior's first `count` configs of `packing` for (op, n, dt) at batch 4096."""
    return [c.id for c in prior.candidates(op, n, dt, batch=4096) if c.packing == packing][:count]


def compile_or_skip(items):
    """Every (op, config, n, dt) of a test module compiled first, in a process pool; the module
    skips without a GPU."""
    import pytest

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    failures = kernels_prebuild.compile_all(items)
    assert not failures, "\n".join(failures[:20])

def check_reference(op, cid, n, dt, batch):
    """The upper triangle never read (NaN-poisoned), every output element written, the residual
    within torch's bound, no info on an SPD input."""
    ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n * 31 + batch)
    poisoned = ins[0] + torch.triu(torch.full_like(ins[0], float("nan")), 1)
    shape = ins[0].shape if op == "potrf" else ins[1].shape
    out = torch.full(shape, float("nan"), dtype=ins[0].dtype, device="cuda")
    got, info = launch(op, cid, poisoned, *ins[1:], out=out)
    assert got is out and not torch.isnan(out).any(), f"{cid} {op} n={n} batch={batch}: NaN in the result"
    ok, worst, bound = check.within_torch(op, dt, ins, got, launch(op, "torch", *ins))
    assert ok, f"{cid} {op} {dt} n={n} batch={batch}: residual {worst:.3e} > bound {bound:.3e}"
    assert not info.any(), f"{cid} {op} n={n} batch={batch}: info on an SPD input"


def check_non_spd(op, cid, n, dt):
    """Problems 7 (a negative pivot) and 299 (a NaN pivot) of 300 reported, the others solved."""
    ins = check.make_inputs(op, 300, n, dt, device="cuda", seed=5)
    ins[0][7, n - 3, n - 3] = -100.0
    ins[0][299, 1, 1] = float("nan")
    want = torch.linalg.cholesky_ex(ins[0].double()).info.int()
    want[299] = 2  # a NaN pivot fails its column (torch's own report of NaN varies by backend)
    got, info = launch(op, cid, *ins)
    assert torch.equal(info, want), f"{cid} {op} n={n}: info {info.nonzero().tolist()} != {want.nonzero().tolist()}"
    good = (want == 0).nonzero().flatten()
    sub = tuple(t[good] for t in ins)
    ok, worst, bound = check.within_torch(op, dt, sub, got[good], launch(op, "torch", *sub))
    assert ok, f"{cid} {op} n={n}: the SPD problems' residual {worst:.3e} > {bound:.3e}"


def check_graph_replay(op, cid, n, dt):
    """A captured launch (warmed up on a side stream) replays the eager result bit for bit."""
    ins = check.make_inputs(op, 4096, n, dt, device="cuda", seed=9)
    eager = launch(op, cid, *ins)[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(op, cid, *ins)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = launch(op, cid, *ins)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager), f"{cid} {op} n={n} {dt}: the graph's result differs from eager"


def check_captured(op, cid, n, dt, batch):
    """One config at one point run INSIDE a captured CUDA graph (warmed up on a side stream, as
    the tune times it), the replay checked: the upper triangle never read (NaN), every output
    element written (NaN-poisoned out=), the residual within torch's bound, no info on an SPD
    input (potrf/posv), L zero above the diagonal (potrf), and for trsv in place (out=b) equal."""
    ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n * 31 + batch)
    poisoned = ins[0] + torch.triu(torch.full_like(ins[0], float("nan")), 1)
    shape = ins[0].shape if op == "potrf" else ins[1].shape
    out = torch.full(shape, float("nan"), dtype=ins[0].dtype, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        launch(op, cid, poisoned, *ins[1:], out=torch.empty_like(out))  # warm: compiled, allocator primed
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = launch(op, cid, poisoned, *ins[1:], out=out)
    got, info = (res, None) if op == "trsv" else res
    if info is not None:
        info.fill_(-7)  # the replay must write every problem's info
    graph.replay()
    torch.cuda.synchronize()
    where = f"{cid} {op} {dt} n={n} batch={batch}"
    assert got is out and not torch.isnan(out).any(), f"{where}: NaN in the result"
    ok, worst, bound = check.within_torch(op, dt, ins, got, launch(op, "torch", *ins))
    assert ok, f"{where}: residual {worst:.3e} > bound {bound:.3e}"
    if info is not None:
        assert not info.any(), f"{where}: info {info.unique().tolist()} on an SPD input"
    if op == "potrf":
        assert torch.equal(got, got.tril()), f"{where}: L not zero above the diagonal"
    if op == "trsv":
        b = ins[1].clone()
        assert torch.equal(launch(op, cid, ins[0], b, inplace=True), got), f"{where}: in place (out=b)"
