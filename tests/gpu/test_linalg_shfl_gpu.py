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

from linalg_packing_checks import check_captured, check_non_spd, compile_or_skip  # noqa: E402

from tunedb.families.linalg import kernels_space as space  # noqa: E402

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


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_shfl_config_meets_the_fp64_reference_inside_a_cuda_graph(op, dt):
    ran = 0
    for n in NS:
        for cid in _shfl(op, n, dt):
            for batch in _batches(n):
                check_captured(op, cid, n, dt, batch)
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
            check_captured("trsv", cid, n, dt, batch)
