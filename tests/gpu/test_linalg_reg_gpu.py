"""The reg packing of potrf/posv (kernels_reg.py) on the GPU: the prior's first two reg configs
of each op x n in {4, 8, 13, 16} (fp32) and {4, 8, 12} (fp64) over batches {1, 257, 4096}
against the fp64 reference (bounded by what torch gets on the same inputs), the upper triangle
never read, every output element written, info on non-SPD problems (in the first and the last
program, a NaN pivot too), and a CUDA-graph capture that replays the eager result. Compiled
first in a process pool (kernels_prebuild). Expected run time on an H200: about 30-50 s (most of
it compiling ~28 unrolled kernels)."""
import pytest

torch = pytest.importorskip("torch")

from linalg_packing_checks import check_graph_replay, check_non_spd, check_reference  # noqa: E402
from linalg_packing_checks import compile_or_skip, packing_configs  # noqa: E402

pytestmark = pytest.mark.gpu

NS = {"fp32": (4, 8, 13, 16), "fp64": (4, 8, 12)}
BATCHES = (1, 257, 4096)


def _reg_configs(op, n, dt):
    return packing_configs("reg", op, n, dt, 2)


ITEMS = [(op, cid, n, dt) for op in ("potrf", "posv") for dt in NS for n in NS[dt] for cid in _reg_configs(op, n, dt)]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    compile_or_skip(ITEMS)


@pytest.mark.parametrize("dt", tuple(NS))
@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_reg_configs_meet_the_fp64_reference(op, dt):
    ran = 0
    for n in NS[dt]:
        for cid in _reg_configs(op, n, dt):
            for batch in BATCHES:
                check_reference(op, cid, n, dt, batch)
                ran += 1
    assert ran == sum(len(_reg_configs(op, n, dt)) for n in NS[dt]) * len(BATCHES) > 0


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_reg_non_spd_problems_are_reported_and_the_others_solved(op):
    for n, dt in ((8, "fp32"), (16, "fp32"), (12, "fp64")):
        cid = _reg_configs(op, n, dt)[0]
        check_non_spd(op, cid, n, dt)


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_reg_kernels_replay_in_a_cuda_graph(op):
    for n, dt in ((16, "fp32"), (8, "fp64")):
        cid = _reg_configs(op, n, dt)[0]
        check_graph_replay(op, cid, n, dt)
