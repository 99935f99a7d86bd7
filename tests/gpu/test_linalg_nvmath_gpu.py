"""The optional dependency tier of linalg (kernels_nvmath.py: potrf/posv through cuSOLVERDx, nvmath-
python's device API) on the GPU, where nvmath-python and numba-cuda are installed (the device machine:
bench/nvmath_install.sh; skipped elsewhere): nvmath_b1 at n in {5, 64, 128} (128: dynamic shared
memory past 48 KiB) x fp32/fp64 against the fp64 reference within torch's bound, the upper triangle
never read (NaN), every output written (NaN-poisoned out=), a ragged batch; the non-SPD report
(a negative pivot, a NaN pivot) as the other packings give it; in place; a captured CUDA graph
replaying the eager result bit for bit. Each (op, dtype, n) kernel compiles on its first launch
(3-17 s): expected 1-2 minutes on an H200."""
import pytest

torch = pytest.importorskip("torch")

from linalg_packing_checks import check_graph_replay, check_non_spd, check_reference  # noqa: E402

from tunedb.families.linalg import kernels_check as check  # noqa: E402
from tunedb.families.linalg import kernels_nvmath  # noqa: E402
from tunedb.families.linalg.launch import launch  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not kernels_nvmath.available(), reason="nvmath-python / numba-cuda not installed")]

ARM = "nvmath_b1"
CASES = [("potrf", "fp32", 64), ("potrf", "fp64", 128), ("posv", "fp64", 64), ("posv", "fp32", 128), ("posv", "fp64", 5)]


@pytest.mark.parametrize("op,dt,n", CASES)
def test_nvmath_meets_the_fp64_reference(op, dt, n):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for batch in (1, 37, 4096):
        check_reference(op, ARM, n, dt, batch)


@pytest.mark.parametrize("op,dt,n", [("potrf", "fp32", 64), ("posv", "fp64", 64)])
def test_nvmath_non_spd_problems_are_reported_and_the_others_solved(op, dt, n):
    check_non_spd(op, ARM, n, dt)


@pytest.mark.parametrize("op,dt,n", [("potrf", "fp64", 128), ("posv", "fp64", 64)])
def test_nvmath_in_place_and_in_a_cuda_graph(op, dt, n):
    ins = check.make_inputs(op, 300, n, dt, device="cuda", seed=3)
    want = launch(op, ARM, *ins)[0].clone()
    work = tuple(t.clone() for t in ins)
    got, info = launch(op, ARM, *work, inplace=True)
    target = work[0] if op == "potrf" else work[1]
    assert got.data_ptr() == target.data_ptr() and torch.equal(got, want) and not info.any()
    check_graph_replay(op, ARM, n, dt)


def test_the_op_serves_the_tier_where_the_table_names_it(monkeypatch, tmp_path):
    """posv fp32 n=64 at batch 65536 as session 20 E measured it (nvmath_b1 by 1.14x over the pdot
    packing; the shipped table has named the CUDA tier's block kernel there since session 22, so
    the entry goes into a user table, as `tunedb linalg tune` writes one): the public op binds
    nvmath_b1 and answers within torch's bound, eagerly and replayed from a CUDA graph; the next
    epoch with the tier marked missing binds the native winner (pdot_w1) instead."""
    import dataclasses

    from tunedb import database, settings
    from tunedb.families.linalg import configs, ops, problems, signatures
    from tunedb.records import Region
    from tunedb.runtime import selector

    sig = signatures.make_signature("posv", "fp32", 64)
    shipped = next(res.db.entries[sig] for res in database.lookup("sm90", "linalg") if sig in res.db.entries)
    entry = dataclasses.replace(shipped, regions=(Region(None, ARM),), regions_native=(Region(None, "pdot_w1"),))
    with settings.override(USER_DB=str(tmp_path / "user")):
        database.write_entries("user", "linalg", "sm90", [entry], configs=[configs.parse(ARM), configs.parse("pdot_w1")])
    a, b = problems.make_inputs(sig, 65536, "cuda", 11)[0]
    with settings.override(USER_DB=str(tmp_path / "user")):
        selector.reload()
        assert ops.bound_for("posv", a, b).config.id == ARM
        x, info = ops.posv(a, b)
        ref = problems.residual(sig, (a, b), {}, problems.torch_arm("posv", a, b))
        assert problems.residual(sig, (a, b), {}, (x, info)) <= problems.residual_bound(sig, ref, 4.0)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ops.posv(a, b)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            xg, _ = ops.posv(a, b)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(xg, x)
        monkeypatch.setattr(kernels_nvmath, "available", lambda: False)
        selector.reload()
        assert ops.bound_for("posv", a, b).config.id == "pdot_w1"  # the entry's native winner there
        monkeypatch.undo()
        selector.reload()
