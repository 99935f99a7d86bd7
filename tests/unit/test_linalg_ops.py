"""The tunedb::linalg_* ops on the CPU (the library arm): results against fp64, the non-SPD
report, fake kernels under torch.compile, and the CUDA path's resolution (memoised per epoch,
from the tiers) exercised on meta tensors."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tunedb
from tunedb import settings
from tunedb.runtime import selector
from tunedb.database import schema, store, tiers
from tunedb.errors import SignatureError
from tunedb.families.linalg import ops, problems, signatures, table
from tunedb.families.linalg.ladder import Cell, CellResult
from tunedb.families.linalg.pick import CellPick


def _inputs(op: str, n: int = 6, batch: int = 5, dt: str = "fp64", seed: int = 0):
    return problems.make_inputs(signatures.make_signature(op, dt, n), batch, "cpu", seed)[0]


@pytest.mark.parametrize("op", signatures.OPS)
@pytest.mark.parametrize("dt", ["fp32", "fp64"])
def test_every_op_matches_the_fp64_reference_on_the_cpu(op, dt):
    args = _inputs(op, dt=dt)
    out = getattr(ops, op)(*args)
    sig = signatures.make_signature(op, dt, 6)
    assert problems.residual(sig, args, {}, out) < (1e-5 if dt == "fp32" else 1e-12)
    if op in ("potrf", "posv"):
        assert out[1].dtype == torch.int32 and not out[1].any()


def test_a_non_spd_problem_is_reported_per_problem_and_the_others_are_solved():
    a, b = _inputs("posv", n=8, batch=6)
    a[1] = -a[1]  # not positive definite: fails at the first pivot
    a[4, 3, 3] = -50.0  # fails at column 4
    x, info = ops.posv(a, b)
    assert info.tolist() == [0, 1, 0, 0, 4, 0]
    good = [0, 2, 3, 5]
    sig = signatures.make_signature("posv", "fp64", 8)
    assert problems.residual(sig, (a[good], b[good]), {}, x[good]) < 1e-12
    low, info2 = ops.potrf(a)
    assert info2.tolist() == info.tolist()


def test_bad_calls_name_the_problem():
    with pytest.raises(SignatureError, match="square"):
        ops.potrf(torch.zeros(3, 4, 5))
    with pytest.raises(SignatureError, match="int32|float32, float64"):
        ops.gemm(torch.zeros(3, 4, 4, dtype=torch.int32), torch.zeros(3, 4, 4, dtype=torch.int32))


def test_the_ops_trace_under_torch_compile():
    a, b = _inputs("posv", batch=3)
    compiled = torch.compile(lambda a, b: ops.posv(a, b)[0] + 1.0, backend="eager", fullgraph=True)
    assert torch.allclose(compiled(a, b), ops.posv(a, b)[0] + 1.0)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        low, info = ops.potrf(torch.empty(7, 4, 4))
        assert tuple(low.shape) == (7, 4, 4) and info.dtype == torch.int32


def _table(root: Path, winner: str) -> None:
    from tunedb.database.schema import DatabaseFile

    cell = Cell("potrf", "fp32", 8, 4096)
    result = CellResult(cell, {winner: (1.0,) * 9}, {winner: "ok"}, {winner: 1.0}, CellPick(winner, winner, ""))
    entries = table.entries([result], {})
    db = DatabaseFile("linalg", "sm90", {}, table.config_defs([winner] if winner != "torch" else []), entries, None)
    store.write_atomic(root / "sm90" / "linalg.json", schema.dumps(db))


def test_the_cuda_path_resolves_once_per_epoch_from_the_tiers(tmp_path):
    a = torch.empty(4096, 8, 8, device="meta")
    _table(tmp_path, "thread_p64_w2")
    with settings.override(USER_DB="off"), tiers.system_root_override(tmp_path):
        selector.configure(arch_family="sm90")
        try:
            first = ops.bound_for("potrf", a)
            assert (first.config.id, first.tier) == ("thread_p64_w2", "system")
            assert ops.bound_for("potrf", a) is first  # one dict lookup on later calls
            unmeasured = ops.bound_for("potrf", torch.empty(100, 16, 16, device="meta"))
            assert unmeasured.tier == "model" and unmeasured.config.id.startswith("warp_")
            _table(tmp_path, "block_w1")
            assert ops.bound_for("potrf", a) is first  # the file changed, the epoch did not
            tunedb.reload()
            again = ops.bound_for("potrf", a)
            assert again is not first and again.config.id == "block_w1"
        finally:
            selector.configure()


def test_without_guesses_an_unmeasured_cell_takes_the_library_arm(tmp_path):
    with settings.override(USER_DB="off", MODEL_FALLBACK="0"), tiers.system_root_override(tmp_path):
        selector.configure(arch_family="sm90")
        try:
            got = ops.bound_for("gemm", torch.empty(64, 8, 8, device="meta"), torch.empty(64, 8, 8, device="meta"))
            assert (got.config.id, got.tier) == ("torch", "default")
        finally:
            selector.configure()


def test_autotune_overrides_reach_the_linalg_ops_and_are_not_memoised(tmp_path):
    from tunedb.records import Config
    from tunedb.runtime import launch_table

    a = torch.empty(512, 8, 8, device="meta")
    seen = []

    def override(family, sig, m):
        seen.append((family.name, sig.format(), m))
        return Config.sentinel("torch"), "autotune"
    with settings.override(USER_DB="off"), tiers.system_root_override(tmp_path):
        selector.configure(arch_family="sm90")
        try:
            before = ops.bound_for("potrf", a)  # memoised before autotune() starts
            with launch_table.overriding(override):
                first = ops.bound_for("potrf", a)
                ops.bound_for("potrf", a)
            assert before.tier == "model"
            assert first.tier == "autotune" and seen == [("linalg", "linalg|op=potrf|dt=fp32|n=8", 512)] * 2
            assert ops.bound_for("potrf", a).tier == "model"  # the override is gone
        finally:
            selector.configure()


def test_a_config_failing_its_first_call_hands_the_cell_to_the_library_arm():
    """The run time's one first-call rule (launch_table.first_call) serves the linalg ops too:
    a Triton config that fails its first launch is warned about, named by the batch size axis,
    and the torch arm answers for the rest of the epoch."""
    from tunedb import families
    from tunedb.errors import TunedbWarning
    from tunedb.runtime import launch_table

    fam = families.get("linalg")
    a = torch.eye(4).repeat(8, 1, 1) * 2.0
    sig, batch = fam.signature_of("potrf", a)

    def broken(*tensors):
        raise RuntimeError("out of resources: shared memory")

    bound = launch_table.Bound("linalg", sig, batch, fam.parse_config("warp_p8_w1"), "system", broken)
    with pytest.warns(TunedbWarning, match="failed on its first call.*batch=8.*torch arm"):
        low, info = launch_table.first_call(bound, a)
    assert bound.config.id == "torch" and bound.launched
    torch.testing.assert_close(low, torch.linalg.cholesky(a))
    assert int(info.abs().sum()) == 0
