"""The shfl packing of potrf/posv/trsv (kernels_shfl.py) on the GPU: every config the predicate admits
(one per n) at n in {2, 3, 4, 5, 8, 12, 16, 24, 32} x fp32/fp64 x batch {1, 257, 4096, 65536}
(65536 at n = 16 and 32, the goal's large cells), each run INSIDE a captured CUDA graph (warmed up
on a side stream, as the tune times it) and the replay's result checked against the fp64
reference (bounded by what torch gets on the same inputs), the upper triangle never read (NaN),
every output element written (NaN-poisoned out=), no info on SPD input; and the non-SPD report
(a negative pivot in one program, a NaN pivot in the last). Compiled first in a process pool
(kernels_prebuild). Expected run time on an H200: 30-50 s (most of it compiling 36 unrolled
kernels in parallel; the n = 32 kernels take 10-30 s each)."""
import pytest

torch = pytest.importorskip("torch")

from linalg_packing_checks import check_non_spd, compile_or_skip  # noqa: E402

from tunedb.families.linalg import kernels_check as check  # noqa: E402
from tunedb.families.linalg import kernels_space as space  # noqa: E402
from tunedb.families.linalg.launch import launch  # noqa: E402

pytestmark = pytest.mark.gpu

NS = (2, 3, 4, 5, 8, 12, 16, 24, 32)
DTYPES = ("fp32", "fp64")
OPS = ("potrf", "posv")


def _shfl(op, n, dt):
    return [c.id for c in space.config_space(op, n, dt) if c.packing == "shfl"]


def _batches(n):
    return (1, 257, 4096, 65536) if n >= 16 else (1, 257, 4096)


ITEMS = [(op, cid, n, dt) for op in OPS for n in NS for dt in DTYPES for cid in _shfl(op, n, dt)]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    compile_or_skip(ITEMS)


def _captured_check(op, cid, n, dt, batch):
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
        got, info = launch(op, cid, poisoned, *ins[1:], out=out)
    info.fill_(-7)  # the replay must write every problem's info
    graph.replay()
    torch.cuda.synchronize()
    assert got is out and not torch.isnan(out).any(), f"{cid} {op} {dt} n={n} batch={batch}: NaN in the result"
    ok, worst, bound = check.within_torch(op, dt, ins, got, launch(op, "torch", *ins))
    assert ok, f"{cid} {op} {dt} n={n} batch={batch}: residual {worst:.3e} > bound {bound:.3e}"
    assert not info.any(), f"{cid} {op} {dt} n={n} batch={batch}: info {info.unique().tolist()} on an SPD input"


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_shfl_config_meets_the_fp64_reference_inside_a_cuda_graph(op, dt):
    ran = 0
    for n in NS:
        for cid in _shfl(op, n, dt):
            for batch in _batches(n):
                _captured_check(op, cid, n, dt, batch)
                ran += 1
    assert ran == sum(len(_batches(n)) for n in NS)


@pytest.mark.parametrize("op", OPS)
def test_shfl_non_spd_problems_are_reported_and_the_others_solved(op):
    for n, dt in ((4, "fp64"), (8, "fp32"), (16, "fp32"), (32, "fp32"), (32, "fp64")):
        check_non_spd(op, _shfl(op, n, dt)[0], n, dt)


def test_every_shfl_trsv_config_meets_the_fp64_reference_inside_a_cuda_graph():
    """trsv (session 20): every n class x fp32/fp64 x batch, captured; upper triangle NaN, every
    output written (NaN-poisoned out=), in place (out=b) equal to the captured result."""
    items = [("trsv", cid, n, dt) for n in NS for dt in DTYPES for cid in _shfl("trsv", n, dt)]
    compile_or_skip(items)
    for _op, cid, n, dt in items:
        for batch in _batches(n):
            ins = check.make_inputs("trsv", batch, n, dt, device="cuda", seed=n * 31 + batch)
            poisoned = ins[0] + torch.triu(torch.full_like(ins[0], float("nan")), 1)
            out = torch.full(ins[1].shape, float("nan"), dtype=ins[0].dtype, device="cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                launch("trsv", cid, poisoned, ins[1], out=torch.empty_like(out))
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                got = launch("trsv", cid, poisoned, ins[1], out=out)
            graph.replay()
            torch.cuda.synchronize()
            where = f"{cid} trsv {dt} n={n} batch={batch}"
            assert got is out and not torch.isnan(out).any(), f"{where}: NaN in the result"
            ok, worst, bound = check.within_torch("trsv", dt, ins, got, launch("trsv", "torch", *ins))
            assert ok, f"{where}: residual {worst:.3e} > bound {bound:.3e}"
            b = ins[1].clone()
            assert torch.equal(launch("trsv", cid, ins[0], b, inplace=True), got), f"{where}: in place"
