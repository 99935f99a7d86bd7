"""The CUDA C++ tier (kernels_cuda.py) on the GPU: every config its predicate admits for potrf/posv
at n in {2, 3, 4, 5, 8, 12, 13, 16, 24, 32, 33, 40, 48, 64, 80, 100, 128} (past 64, and trsv past 32, the
tile kernel `cudat_t<TS>` alone), x fp32/fp64 x
batch {1, 257, 4096, 65536 (16 <= n <= 32)},
each run INSIDE a captured CUDA graph (warmed up on a side stream, as the tune times it) and the
replay's result checked against the fp64 reference (bounded by what torch gets on the same
inputs), the upper triangle never read (NaN), every output element written (NaN-poisoned out=),
no info on SPD input; the non-SPD report (a negative pivot in one problem, a NaN pivot in the
last); in place (potrf out=A, posv out=b) equal to the out-of-place result. Kernels compile in
process by NVRTC on first launch (about 0.3 s each). Expected run time on an H200: 30-60 s."""
import pytest

torch = pytest.importorskip("torch")

from linalg_packing_checks import check_captured, check_non_spd  # noqa: E402

from tunedb.families.linalg import kernels_check as check  # noqa: E402
from tunedb.families.linalg import kernels_cuda as kc  # noqa: E402
from tunedb.families.linalg.launch import launch  # noqa: E402

pytestmark = pytest.mark.gpu

NS = (2, 3, 4, 5, 8, 12, 13, 16, 24, 32, 33, 40, 48, 64, 80, 100, 128)
DTYPES = ("fp32", "fp64")
OPS = ("potrf", "posv")


@pytest.fixture(scope="module", autouse=True)
def nvrtc():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert kc.available(), "a CUDA GPU with torch but no NVRTC: the CUDA tier cannot compile"


def _batches(n):
    return (1, 257, 4096, 65536) if 16 <= n <= 32 else (1, 257, 4096)


CELLS = [(op, n) for op in (*OPS, "trsv") for n in NS if n <= max(kc.MAX_N[op], kc.tile.MAX_N)]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op,n", CELLS, ids=[f"{op}-n{n}" for op, n in CELLS])
def test_every_cuda_config_meets_the_fp64_reference_inside_a_cuda_graph(op, n, dt):
    ids = kc.config_ids(op, n, dt)
    assert ids, f"no CUDA config for {op} {dt} n={n}"
    for cid in ids:
        for batch in _batches(n):
            check_captured(op, cid, n, dt, batch)


@pytest.mark.parametrize("op", OPS)
def test_cuda_non_spd_problems_are_reported_and_the_others_solved(op):
    for n, dt in ((4, "fp64"), (8, "fp32"), (13, "fp64"), (16, "fp32"), (32, "fp32"), (32, "fp64"), (40, "fp32"),
                  (64, "fp64"), (100, "fp32"), (128, "fp64")):
        ids = kc.config_ids(op, n, dt)
        for cid in {*ids[:2], *(i for i in ids if i.startswith(("cudat", "cudaw", "cudab")))}:
            check_non_spd(op, cid, n, dt)


@pytest.mark.parametrize("op", OPS)
def test_cuda_in_place_equals_out_of_place(op):
    cells = [(n, dt, cid) for n, dt in ((5, "fp32"), (16, "fp64"), (32, "fp32"), (64, "fp64"), (100, "fp32"), (128, "fp64"))
             for cid in {kc.config_ids(op, n, dt)[-1], *(i for i in kc.config_ids(op, n, dt) if i.startswith(("cudat", "cudaw", "cudab")))}]
    for n, dt, cid in cells:  # the last warp/block config, and every wide-warp and tile kernel from n = 33
        ins = check.make_inputs(op, 1000, n, dt, device="cuda", seed=3)
        want = launch(op, cid, *ins)[0].clone()
        work = tuple(t.clone() for t in ins)
        got = launch(op, cid, *work, inplace=True)[0]
        assert got.data_ptr() == (work[0] if op == "potrf" else work[1]).data_ptr()
        assert torch.equal(got, want), f"{cid} {op} {dt} n={n}: in place differs"
        if op == "posv":
            assert torch.equal(work[0], ins[0]), f"{cid} posv wrote A"


@pytest.mark.parametrize("op", OPS)
def test_the_op_serves_the_tier_where_the_table_names_it(monkeypatch, op):
    """fp32 n=32 at batch 4096: the shipped table's full winner is a CUDA-tier arm (session 21),
    so the public op binds it and answers within torch's bound, eagerly and replayed from a CUDA
    graph; the next epoch with NVRTC marked missing binds the entry's native (Triton) winner."""
    from tunedb import database, settings
    from tunedb.families.linalg import ops, problems, signatures
    from tunedb.runtime import selector

    sig = signatures.make_signature(op, "fp32", 32)
    entry = next(res.db.entries[sig] for res in database.lookup("sm90", "linalg") if sig in res.db.entries)
    full, native = entry.lookup(4096), entry.lookup(4096, native=True)
    assert full.startswith("cuda") and not native.startswith("cuda"), (full, native)
    args = problems.make_inputs(sig, 4096, "cuda", 11)[0]
    fn = getattr(ops, op)
    with settings.override(USER_DB="off"):
        selector.reload()
        assert ops.bound_for(op, *args).config.id == full
        got = fn(*args)
        ref = problems.residual(sig, args, {}, problems.torch_arm(op, *args))
        assert problems.residual(sig, args, {}, got) <= problems.residual_bound(sig, ref, 4.0)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn(*args)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured[0], got[0])
        monkeypatch.setitem(kc._AVAILABLE, "nvrtc", False)
        selector.reload()
        assert ops.bound_for(op, *args).config.id == native
    selector.reload()


@pytest.mark.parametrize("dt", DTYPES)
def test_trsv_reads_l_in_either_layout(dt):
    """trsv takes L as the caller hands it: torch.linalg.cholesky's column-major L with no copy
    (the COLMAJOR kernel), at a storage offset too, and a row-major copy of it; all give the same
    x, within torch's bound (odd n, batch 1 and a partial last group of problems included)."""
    for n in (3, 7, 11, 16, 17, 31, 32, 45, 128):
        for batch in (1, 1000):
            ins = check.make_inputs("trsv", batch, n, dt, device="cuda", seed=n + batch)
            row = ins[0].contiguous()
            col = row.mT.contiguous().mT  # each matrix column-major, as torch.linalg.cholesky returns L
            assert col.mT.is_contiguous() and not col.is_contiguous() and torch.equal(col, row)
            flat = row.mT.contiguous()
            shifted = torch.cat([flat[:1], flat])[1:].mT  # the same, one matrix into its storage
            assert shifted.storage_offset() == n * n and shifted.mT.is_contiguous()
            want = launch("trsv", "torch", row, ins[1])
            for cid in kc.config_ids("trsv", n, dt):
                got_row = launch("trsv", cid, row, ins[1])
                for other in (col, shifted):
                    assert torch.equal(launch("trsv", cid, other, ins[1]), got_row), (
                        f"{cid} trsv {dt} n={n} batch={batch}: the layouts differ")
                ok, worst, bound = check.within_torch("trsv", dt, (row, ins[1]), got_row, want)
                assert ok, f"{cid} trsv {dt} n={n} batch={batch}: residual {worst:.3e} > {bound:.3e}"


@pytest.mark.parametrize("op", (*OPS, "trsv"))
def test_tile_kernel_reads_a_misaligned_tensor_element_by_element(op):
    """The tile kernel reads 16-byte vectors only where A, b and out are 16-byte aligned: the same
    problems one element into their storage (a view, contiguous) give the same result bit for bit."""
    for n, dt in ((64, "fp32"), (128, "fp64")):
        ins = check.make_inputs(op, 300, n, dt, device="cuda", seed=n)
        shifted = []
        for t in ins:
            flat = torch.cat([t.new_zeros(1), t.contiguous().flatten()])[1:]
            shifted.append(flat.view(t.shape))
        assert shifted[0].data_ptr() % 16 != 0 and torch.equal(shifted[0], ins[0].contiguous())
        for cid in (i for i in kc.config_ids(op, n, dt) if i.startswith(("cudat", "cudab"))):
            want = launch(op, cid, *(t.contiguous() for t in ins))
            got = launch(op, cid, *shifted)
            if op == "trsv":
                want, got = (want, None), (got, None)
            assert torch.equal(got[0], want[0]), f"{cid} {op} {dt} n={n}: misaligned input differs"
