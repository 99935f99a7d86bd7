"""The small linear-algebra config space, its validity predicate, launch()'s argument checks and
the torch arms (no Triton kernel runs here; tests/unit/test_linalg_kernels.py runs them)."""
import pytest
import torch

from tunedb.families.linalg import kernels_check as check
from tunedb.families.linalg import kernels_space as space
from tunedb.families.linalg import kernels_prior as prior
from tunedb.families.linalg.launch import launch


def test_ids_round_trip_and_are_distinct():
    cfgs = space.config_space()
    ids = [c.id for c in cfgs]
    assert len(ids) == len(set(ids))
    assert all(space.parse_config(i) == c for i, c in zip(ids, cfgs))
    assert {"thread_p64_w2", "warp_p8_w4", "block_w4"} <= set(ids)


@pytest.mark.parametrize("bad", ["thread_p64", "warp_p8_w4x", "block_p2_w4", "torch", ""])
def test_bad_ids_are_refused_with_the_allowed_forms(bad):
    with pytest.raises(ValueError, match="thread_p<P>_w<W>"):
        space.parse_config(bad)


def test_predicate_refuses_what_cannot_run():
    r = space.invalid_reason
    assert "P >= 32*num_warps" in r("dot", "thread", 32, 2, 8, "fp32")
    assert r("dot", "thread", 64, 2, 8, "fp32") is None
    assert "n <= 16" in r("gemm", "thread", 64, 2, 32, "fp32")
    assert "fp16" in r("potrf", "block", 1, 4, 8, "fp16")
    assert r("gemm", "block", 1, 2, 8, "bf16") is None
    assert "outside" in r("gemv", "block", 1, 4, 129, "fp32")
    assert "outside" in r("gemv", "block", 1, 4, 1, "fp32")
    # the register budget (calibrated per op on sm90 cubins)
    assert "spill" in r("potrf", "block", 1, 4, 128, "fp32")
    assert r("potrf", "block", 1, 4, 64, "fp32") is None
    assert "spill" in r("potrf", "block", 1, 2, 64, "fp64")
    assert r("potrf", "block", 1, 8, 128, "fp64") is None  # the large-n arm, admitted though it spills
    assert "spill" in r("potrf", "warp", 2, 8, 128, "fp32")
    assert "spill" in r("trsv", "warp", 128, 1, 32, "fp32")
    assert r("gemm", "warp", 16, 1, 16, "fp32") is None
    assert "P >= 2" in r("dot", "warp", 1, 1, 8, "fp32")
    assert "one problem" in r("dot", "block", 2, 1, 8, "fp32")
    assert "idle" in r("dot", "block", 1, 8, 4, "fp32")
    assert r("dot", "block", 1, 1, 2, "fp32") is None  # one warp is always allowed


def test_every_cell_has_a_triton_config_and_the_space_is_what_the_predicate_admits():
    for op in space.OPS:
        for dtype in ("fp32", "fp64"):
            for n in (2, 3, 4, 8, 16, 32, 64, 100, 128):
                valid = space.config_space(op, n, dtype)
                assert valid, (op, dtype, n)
                every = space.config_space()
                assert valid == [c for c in every
                                 if space.invalid_reason(op, c.packing, c.problems, c.warps, n, dtype) is None]
                assert all(space.next_pow2(n) >= n for _ in valid)


def test_candidates_spend_a_cap_mostly_on_lane_and_warp_configs():
    capped = prior.candidates("potrf", 16, "fp32", cap=5, batch=65536)
    assert [c.packing for c in capped] == ["lane", "reg", "warp", "block", "thread"]
    assert capped[0].id == "lane_p2_w1"  # one column per lane, one warp per program
    assert capped[1].id == "reg_p32_w1"  # one problem per thread, one warp per program
    # a cap of 11 where reg runs spends the old cap of 9 on the other packings, plus two reg
    eleven = prior.candidates("potrf", 16, "fp32", cap=11, batch=4096)
    old = [c for c in eleven if c.packing != "reg"]
    assert len(old) == 9 and sum(c.packing == "reg" for c in eleven) == 2
    assert sorted(c.packing for c in old) == sorted(["lane"] * 3 + ["warp"] * 3 + ["block"] * 2 + ["thread"])
    # where reg cannot run, a cap of 9 is the old nine
    nine = prior.candidates("posv", 32, "fp32", cap=9, batch=4096)
    assert sorted(c.packing for c in nine) == sorted(["lane"] * 3 + ["warp"] * 3 + ["block"] * 2 + ["thread"])
    # the ops without a lane kernel keep the rotation they had
    capped = prior.candidates("gemm", 8, "fp32", cap=5, batch=65536)
    assert [c.packing for c in capped] == ["warp", "block", "thread", "warp", "warp"]


def test_candidates_cap_keeps_every_packing_that_has_a_valid_config():
    for op in space.OPS:
        full = space.config_space(op, 8, "fp32")
        capped = prior.candidates(op, 8, "fp32", cap=5)
        assert len(capped) == min(5, len(full)) and set(capped) <= set(full)
        # rows (session 15) takes its turns after the older packings' first eleven, shfl
        # (session 18) its one turn at a cap of 14
        assert {c.packing for c in capped} == {c.packing for c in full} - {"rows", "shfl"}
        assert {c.packing for c in prior.candidates(op, 8, "fp32", cap=13)} == {c.packing for c in full} - {"shfl"}
        assert {c.packing for c in prior.candidates(op, 8, "fp32", cap=14)} == {c.packing for c in full}
    assert set(prior.candidates("dot", 8, "fp32")) == set(space.config_space("dot", 8, "fp32"))


def test_simplicity_orders_thread_warp_block():
    ranks = [space.parse_config(i).simplicity for i in ("thread_p64_w2", "warp_p8_w4", "block_w4")]
    assert ranks == sorted(ranks) and len(set(ranks)) == 3


def test_launch_names_the_bad_argument():
    a = torch.randn(3, 4, 4)
    with pytest.raises(ValueError, match=r"expected shape \[3, 4\]"):
        launch("trsv", "block_w1", a, torch.randn(3, 5))
    with pytest.raises(ValueError, match="allowed: fp32, fp64"):
        launch("potrf", "block_w1", a.half())
    with pytest.raises(ValueError, match="unknown op"):
        launch("getrf", "block_w1", a)
    with pytest.raises(ValueError, match="n <= 16"):
        launch("gemm", "thread_p64_w2", torch.randn(2, 20, 20), torch.randn(2, 20, 20))
    with pytest.raises(ValueError, match="no in-place form"):
        launch("gemm", "torch", a, a, inplace=True)
    with pytest.raises(ValueError, match="must not alias"):
        launch("gemm", "torch", a, a.clone(), out=a)
    with pytest.raises(ValueError, match="contiguous"):
        launch("gemm", "torch", a, a.clone(), out=torch.empty(3, 4, 8)[..., :4])
    with pytest.raises(ValueError, match="outside 2..128"):
        launch("dot", "torch", torch.randn(2, 1), torch.randn(2, 1))


@pytest.mark.parametrize("op", space.OPS)
def test_torch_arms_meet_the_reference_and_write_out(op):
    ins = check.make_inputs(op, 5, 6, "fp32", seed=3)
    res = launch(op, "torch", *ins)
    ok, worst, bound = check.within_torch(op, "fp32", ins, res, res)
    assert ok and float(check.residual(op, ins, res).max()) < 1e-5, (worst, bound)
    first = res[0] if isinstance(res, tuple) else res
    out = torch.empty(first.shape, dtype=first.dtype)
    again = launch(op, "torch", *ins, out=out)
    assert (again[0] if isinstance(again, tuple) else again) is out and torch.equal(out, first)
    if op in ("potrf", "posv"):
        checked = launch(op, "torch_checked", *ins)
        assert float(check.residual(op, ins, checked).max()) < 1e-5 and not checked[1].any()


def test_residual_sees_a_wrong_answer():
    ins = check.make_inputs("posv", 4, 5, "fp64", seed=1)
    x, _ = launch("posv", "torch", *ins)
    assert float(check.residual("posv", ins, x).max()) < 1e-14
    x[2, 1] += 1e-3
    r = check.residual("posv", ins, x)
    assert float(r[2]) > 1e-6 and float(r[0]) < 1e-14
    ok, _, _ = check.within_torch("posv", "fp64", ins, x, launch("posv", "torch", *ins))
    assert not ok


def test_hard_inputs_are_spd_with_the_stated_spread():
    a = check.spd(3, 8, seed=2, kind="hard", cond=1e5)
    ev = torch.linalg.eigvalsh(a)
    assert (ev > 0).all() and torch.allclose(ev.max(-1).values / ev.min(-1).values,
                                             torch.full((3,), 1e5, dtype=torch.float64), rtol=1e-6)



def test_candidates_prefer_configs_that_fill_the_gpu_at_small_batch():
    small = prior.candidates("potrf", 8, "fp32", cap=5, batch=256)
    large = prior.candidates("potrf", 8, "fp32", cap=5, batch=65536)
    warp_small = min(c.problems for c in small if c.packing == "warp")
    warp_large = min(c.problems for c in large if c.packing == "warp")
    assert warp_small < warp_large and max([c.problems for c in small if c.packing == "warp"][:2]) <= 4
