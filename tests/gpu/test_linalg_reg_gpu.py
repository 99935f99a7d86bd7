"""The reg packing of potrf/posv (kernels_reg.py) on the GPU: the prior's first two reg configs
of each op x n in {4, 8, 13, 16} (fp32) and {4, 8, 12} (fp64) over batches {1, 257, 4096}
against the fp64 reference (bounded by what torch gets on the same inputs), the upper triangle
never read, every output element written, info on non-SPD problems (in the first and the last
program, a NaN pivot too), and a CUDA-graph capture that replays the eager result. Compiled
first in a process pool (kernels_prebuild). Expected run time on an H200: about 30-50 s (most of
it compiling ~28 unrolled kernels)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.families.linalg import kernels_check as check  # noqa: E402
from tunedb.families.linalg import kernels_prebuild  # noqa: E402
from tunedb.families.linalg import kernels_space as space  # noqa: E402
from tunedb.families.linalg.launch import launch  # noqa: E402

pytestmark = pytest.mark.gpu

NS = {"fp32": (4, 8, 13, 16), "fp64": (4, 8, 12)}
BATCHES = (1, 257, 4096)


def _reg_configs(op, n, dt):
    return [c.id for c in space.candidates(op, n, dt, batch=4096) if c.packing == "reg"][:2]


ITEMS = [(op, cid, n, dt) for op in ("potrf", "posv") for dt in NS for n in NS[dt] for cid in _reg_configs(op, n, dt)]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    failures = kernels_prebuild.compile_all(ITEMS)
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("dt", tuple(NS))
@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_reg_configs_meet_the_fp64_reference(op, dt):
    ran = 0
    for n in NS[dt]:
        for cid in _reg_configs(op, n, dt):
            for batch in BATCHES:
                ins = check.make_inputs(op, batch, n, dt, device="cuda", seed=n * 31 + batch)
                poisoned = ins[0] + torch.triu(torch.full_like(ins[0], float("nan")), 1)
                shape = ins[0].shape if op == "potrf" else ins[1].shape
                out = torch.full(shape, float("nan"), dtype=ins[0].dtype, device="cuda")
                got, info = launch(op, cid, poisoned, *ins[1:], out=out)
                assert got is out and not torch.isnan(out).any(), f"{cid} {op} n={n} batch={batch}: NaN in the result"
                ok, worst, bound = check.within_torch(op, dt, ins, got, launch(op, "torch", *ins))
                assert ok, f"{cid} {op} {dt} n={n} batch={batch}: residual {worst:.3e} > bound {bound:.3e}"
                assert not info.any(), f"{cid} {op} n={n} batch={batch}: info on an SPD input"
                ran += 1
    assert ran == sum(len(_reg_configs(op, n, dt)) for n in NS[dt]) * len(BATCHES) > 0


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_reg_non_spd_problems_are_reported_and_the_others_solved(op):
    for n, dt in ((8, "fp32"), (16, "fp32"), (12, "fp64")):
        cid = _reg_configs(op, n, dt)[0]
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


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_reg_kernels_replay_in_a_cuda_graph(op):
    for n, dt in ((16, "fp32"), (8, "fp64")):
        cid = _reg_configs(op, n, dt)[0]
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
