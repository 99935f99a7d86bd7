"""The panel packing of potrf/posv/trsv (kernels_panel.py) and its tl.dot form for potrf/posv
(kernels_pdot.py: pdot, pdottf) on the GPU: every config the predicate
admits at n in {16, 24, 37, 64, 100, 128} x fp32/fp64 x batch {1, 257, 4096} (65536 at n = 64),
each run INSIDE a captured CUDA graph (warmed up on a side stream, as the tune times it) and the
replay's result checked against the fp64 reference (bounded by what torch gets on the same
inputs), the upper triangle never read (NaN), every output element written (NaN-poisoned out=),
no info on SPD input; the non-SPD report (a negative pivot in one problem, a NaN pivot in the
last), the in-place forms, and a graph replay bit for bit equal to the eager launch. The kernels
share memory between their threads through L and barriers, which the interpreter cannot check:
a missing barrier shows here as a wrong residual. Expected run time on an H200: 60-120 s."""
import pytest

torch = pytest.importorskip("torch")

from linalg_packing_checks import check_captured, check_graph_replay, check_non_spd, compile_or_skip  # noqa: E402

from tunedb.families.linalg import kernels_check as check  # noqa: E402
from tunedb.families.linalg import kernels_space as space  # noqa: E402
from tunedb.families.linalg.launch import launch  # noqa: E402

pytestmark = pytest.mark.gpu

NS = (16, 24, 37, 64, 100, 128)
DTYPES = ("fp32", "fp64")
OPS = ("potrf", "posv", "trsv")


def _panel(op, n, dt):
    """The panel configs, then (potrf/posv, n >= 33) the pdot / pdottf ones (kernels_pdot.py)."""
    return [c.id for c in space.config_space(op, n, dt) if c.packing in ("panel", *space.PDOT_PACKINGS)]


def _batches(n):
    return (1, 257, 4096, 65536) if n == 64 else (1, 257, 4096)


ITEMS = [(op, cid, n, dt) for op in OPS for n in NS for dt in DTYPES for cid in _panel(op, n, dt)]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    compile_or_skip(ITEMS)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_panel_config_meets_the_fp64_reference_inside_a_cuda_graph(op, dt):
    ran = 0
    for n in NS:
        for cid in _panel(op, n, dt):
            for batch in _batches(n):
                check_captured(op, cid, n, dt, batch)
                ran += 1
    assert ran == sum(len(_batches(n)) * len(_panel(op, n, dt)) for n in NS) > 0


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_panel_non_spd_problems_are_reported_and_the_others_solved(op):
    for n, dt in ((16, "fp32"), (37, "fp64"), (64, "fp32"), (128, "fp64")):
        for cid in _panel(op, n, dt):
            check_non_spd(op, cid, n, dt)
            # a failed problem with a finite input keeps finite results (its pivot replaced by 1),
            # here on the GPU, where the threads of a program really run apart
            ins = check.make_inputs(op, 64, n, dt, device="cuda", seed=6)
            ins[0][5, n // 2, n // 2] = -100.0
            got, info = launch(op, cid, *ins)
            assert info[5].item() > 0 and torch.isfinite(got).all(), f"{cid} {op} {dt} n={n}: non-finite"


@pytest.mark.parametrize("op", ("potrf", "posv"))
def test_panel_graph_replay_is_bitwise_the_eager_result(op):
    for n, dt in ((64, "fp32"), (128, "fp64")):
        check_graph_replay(op, _panel(op, n, dt)[-1], n, dt)


def test_panel_in_place_forms():
    for n, dt in ((64, "fp32"), (100, "fp64")):
        for cid in (_panel("posv", n, dt)[0], _panel("posv", n, dt)[-1]):  # a panel and a pdot config
            _in_place(cid, n, dt)
        low, b = check.make_inputs("trsv", 300, n, dt, device="cuda", seed=5)
        z = launch("trsv", "panel_w1", low, b).clone()
        z2 = launch("trsv", "panel_w1", low, b, inplace=True)
        assert z2.data_ptr() == b.data_ptr() and torch.equal(z2, z), f"panel_w1 trsv n={n}: in place"


def _in_place(cid, n, dt):
    """L over A equal to the out-of-place L; x over b equal to the out-of-place x."""
    a, = check.make_inputs("potrf", 300, n, dt, device="cuda", seed=3)
    want = launch("potrf", cid, a)[0]
    low, _ = launch("potrf", cid, a, inplace=True)
    assert low.data_ptr() == a.data_ptr() and torch.equal(low, want), f"{cid} potrf n={n}: in place"
    a, b = check.make_inputs("posv", 300, n, dt, device="cuda", seed=4)
    x = launch("posv", cid, a, b)[0].clone()
    x2, _ = launch("posv", cid, a, b, inplace=True)
    assert x2.data_ptr() == b.data_ptr() and torch.equal(x2, x), f"{cid} posv n={n}: in place"
