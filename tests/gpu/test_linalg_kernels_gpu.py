"""The small linear-algebra Triton kernels on the GPU: every op x packing (the prior's first
config of each) x fp32/fp64 over n in {2..128} x batch {1, 257, 4096} against the fp64
reference, bounded by what torch gets on the same inputs; non-SPD reports; CUDA-graph capture
of each kernel; every warp/block config of potrf, posv and trsv at the n where their kernels
split the tile or unroll (8..64, ragged n included). All kernels are compiled first in a
process pool (kernels_prebuild).
Expected run time on an H200: about 90-150 s (most of it the parallel compile of ~900 kernels)."""
import pytest

torch = pytest.importorskip("torch")

from tunedb.families.linalg import kernels_check as check  # noqa: E402
from tunedb.families.linalg import kernels_prebuild  # noqa: E402
from tunedb.families.linalg import kernels_space as space  # noqa: E402
from tunedb.families.linalg.launch import launch  # noqa: E402

pytestmark = pytest.mark.gpu

OPS = ("dot", "gemv", "gemm", "potrf", "trsv", "posv")
NS = (2, 4, 8, 16, 32, 64, 128)
BATCHES = (1, 257, 4096)
DTYPES = ("fp32", "fp64")
PACKINGS = ("thread", "warp", "block")


def _config(op, packing, n, dtype):
    for c in check.one_per_packing(op, n, dtype):
        if c.packing == packing:
            return c.id
    return None


ITEMS = [(op, _config(op, p, n, dt), n, dt) for op in OPS for p in PACKINGS for n in NS for dt in DTYPES]
ITEMS += [(op, _config(op, "warp", 8, "fp16"), 8, "fp16") for op in ("dot", "gemv", "gemm")]
# Every warp/block config the ladder may serve for the split factorisation (NP >= 8: a full and a
# ragged second block) and the unrolled row-wise trsv (n <= 32) and its loop above.
SPLIT_NS = (8, 13, 16, 24, 32, 64)
SPLIT_ITEMS = [(op, c.id, n, dt) for op in ("potrf", "posv", "trsv") for n in SPLIT_NS for dt in DTYPES
               for c in space.config_space(op, n, dt) if c.packing in ("warp", "block")]  # lane: its own file
ITEMS += SPLIT_ITEMS


@pytest.fixture(scope="module", autouse=True)
def compiled():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    failures = kernels_prebuild.compile_all([it for it in ITEMS if it[1]])
    assert not failures, "\n".join(failures[:20])


def _agree(op, dtype, cid, ins, res, what):
    ref_ins = ins if dtype in ("fp32", "fp64") else tuple(t.float() for t in ins)
    ref = launch(op, "torch", *ref_ins)
    ok, worst, bound = check.within_torch(op, dtype, ins, res, ref)
    assert ok, f"{cid} {op} {dtype} {what}: residual {worst:.3e} > bound {bound:.3e}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("op", OPS)
def test_every_packing_meets_the_fp64_reference(op, packing, dtype):
    ran = 0
    for n in NS:
        cid = _config(op, packing, n, dtype)
        if cid is None:
            continue
        for batch in BATCHES:
            ins = check.make_inputs(op, batch, n, dtype, device="cuda", seed=n * 7 + batch)
            first = launch(op, cid, *ins)
            res = first[0] if isinstance(first, tuple) else first
            # a poisoned out: every element must be written
            out = torch.full_like(res, float("nan"))
            again = launch(op, cid, *ins, out=out)
            got = again[0] if isinstance(again, tuple) else again
            assert got is out and not torch.isnan(out).any(), f"{cid} {op} n={n} batch={batch}: unwritten output"
            _agree(op, dtype, cid, ins, got, f"n={n} batch={batch}")
            if op in ("potrf", "posv"):
                assert not first[1].any(), f"{cid} {op} n={n} batch={batch}: info on an SPD input"
            ran += 1
        if op in ("potrf", "posv"):
            ins = check.make_inputs(op, 257, n, dtype, device="cuda", seed=n, kind="hard")
            _agree(op, dtype, cid, ins, launch(op, cid, *ins), f"n={n} ill-conditioned")
    assert ran or packing == "thread"


@pytest.mark.parametrize("op", ("potrf", "posv", "trsv"))
def test_every_warp_and_block_config_of_the_solvers(op):
    for _, cid, n, dtype in (it for it in SPLIT_ITEMS if it[0] == op):
        ins = check.make_inputs(op, 257, n, dtype, device="cuda", seed=n + 31)
        res = launch(op, cid, *ins)
        _agree(op, dtype, cid, ins, res, f"n={n} batch=257")
        if op == "trsv":
            continue
        assert not res[1].any(), f"{cid} {op} {dtype} n={n}: info on an SPD input"
        # a pivot failing in the second block of the split tile, one in the first
        a = ins[0]
        a[3, n - 2, n - 2] = -1e3
        a[200, 1, 1] = -1.0
        want = torch.linalg.cholesky_ex(a.double()).info.int()
        out, info = launch(op, cid, *ins)
        assert info.tolist() == want.tolist() and int(info[3]) > n // 2, f"{cid} {op} {dtype} n={n}: info"
        assert torch.isfinite(out).all(), f"{cid} {op} {dtype} n={n}: a non-finite result beside a failed pivot"
        good = (want == 0).nonzero().flatten()
        _agree(op, dtype, cid, tuple(t[good] for t in ins), out[good], f"n={n} SPD problems beside non-SPD ones")


@pytest.mark.parametrize("op", ("dot", "gemv", "gemm"))
def test_half_precision_accumulates_in_fp32(op):
    for dtype in ("fp16", "bf16"):
        cid = _config(op, "warp", 8, dtype)
        ins = check.make_inputs(op, 257, 8, dtype, device="cuda", seed=3)
        _agree(op, dtype, cid, ins, launch(op, cid, *ins), "n=8")


@pytest.mark.parametrize("packing", PACKINGS)
@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_non_spd_problems_are_reported_and_the_others_solved(op, packing):
    for n in (8, 32):
        cid = _config(op, packing, n, "fp32")
        if cid is None:
            continue
        ins = check.make_inputs(op, 257, n, "fp32", device="cuda", seed=5)
        a = ins[0]
        for b, k in ((0, 1), (100, n // 2), (256, n)):
            a[b, k - 1, k - 1] = -1.0
        want = torch.linalg.cholesky_ex(a.double()).info
        res, info = launch(op, cid, *ins)
        assert info.tolist() == want.int().tolist() and set(info.nonzero().flatten().tolist()) == {0, 100, 256}
        assert torch.isfinite(res).all()
        good = (want == 0).nonzero().flatten()
        sub = tuple(t[good] for t in ins)
        _agree(op, "fp32", cid, sub, res[good], f"n={n} SPD problems beside non-SPD ones")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_kernel_captures_in_a_cuda_graph(op, dtype):
    for n in NS:
        for packing in PACKINGS:
            cid = _config(op, packing, n, dtype)
            if cid is None:
                continue
            ins = check.make_inputs(op, 257, n, dtype, device="cuda", seed=1)
            eager = launch(op, cid, *ins)
            inplace = op in ("potrf", "posv", "trsv")
            work = [t.clone() for t in ins]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = launch(op, cid, *work, inplace=inplace) if inplace else launch(op, cid, *work)
            for t, src in zip(work, ins):  # refill the consumed inputs, then replay
                t.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            e = eager[0] if isinstance(eager, tuple) else eager
            c = captured[0] if isinstance(captured, tuple) else captured
            assert torch.equal(e, c), f"{cid} {op} {dtype} n={n}: the graph replay differs from eager"
