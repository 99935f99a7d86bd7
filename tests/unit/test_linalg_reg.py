"""The reg packing of potrf/posv (kernels_reg.py) under the Triton interpreter, through launch():
n from 2 to the packing's limit (odd n and padding included), one and several problems per
thread, several warps, batches that leave the last program partly empty, fp32 and fp64, against
an fp64 reference bounded by what torch gets on the same inputs; the upper triangle of A never
read; info on non-SPD problems with the others still right; the in-place forms. And the config
space's rules for the packing (its register budget, its place in the candidates)."""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

from tunedb.families.linalg import kernels_space as space  # noqa: E402

# (config, n, dtype, batch): one problem per thread, two and eight per thread, two warps, ragged batches
CASES = [("reg_p32_w1", 2, "fp32", 37), ("reg_p256_w1", 3, "fp64", 40), ("reg_p64_w1", 4, "fp32", 70),
         ("reg_p64_w2", 5, "fp32", 33), ("reg_p64_w1", 8, "fp64", 65), ("reg_p32_w1", 8, "fp32", 31),
         ("reg_p32_w1", 12, "fp64", 33), ("reg_p32_w1", 13, "fp32", 35), ("reg_p64_w2", 16, "fp32", 67)]


def _child() -> None:
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    failures = []
    for cid, n, dt, batch in CASES:
        for op in ("potrf", "posv"):
            for kind, seed in (("well", n), ("hard", 100 + n)):
                ins = check.make_inputs(op, batch, n, dt, seed=seed, kind=kind)
                poisoned = ins[0] + torch.triu(torch.full_like(ins[0], float("nan")), 1)
                res = launch(op, cid, poisoned, *ins[1:])
                ok, worst, bound = check.within_torch(op, dt, ins, res[0], launch(op, "torch", *ins))
                if not ok:
                    failures.append(f"{cid} {op} {dt} n={n} {kind}: residual {worst:.2e} > {bound:.2e}")
                if res[1].any():
                    failures.append(f"{cid} {op} {dt} n={n} {kind}: info {res[1].tolist()} on SPD input")
                if op == "potrf" and not torch.equal(res[0], res[0].tril()):
                    failures.append(f"{cid} potrf n={n}: L not zero above the diagonal")
        # non-SPD problems (one in the first program, one in the last): info names exactly
        # those (first bad column), the others stay right and every result finite
        for op in ("potrf", "posv"):
            ins = check.make_inputs(op, batch, n, dt, seed=7)
            a = ins[0]
            a[batch - 1, n // 2, n // 2] = -1.0
            a[1, 0, 0] = 0.0
            want = torch.linalg.cholesky_ex(a.double()).info.int().tolist()
            res = launch(op, cid, *ins)
            if res[1].tolist() != want or want[-1] == 0 or want[1] != 1:
                failures.append(f"{cid} {op} n={n} non-SPD: info {res[1].tolist()} != {want}")
            keep = [i for i in range(batch) if want[i] == 0]
            sub = tuple(t[keep] for t in ins)
            ok, worst, bound = check.within_torch(op, dt, sub, res[0][keep], launch(op, "torch", *sub))
            if not ok:
                failures.append(f"{cid} {op} n={n} non-SPD: the SPD problems' residual {worst:.2e} > {bound:.2e}")
            if not torch.isfinite(res[0]).all():
                failures.append(f"{cid} {op} n={n} non-SPD: a non-finite result from a finite input")
    # in place: L over A, x over b (the kernels load everything before they store)
    a, = check.make_inputs("potrf", 33, 6, "fp32", seed=3)
    keep = a.clone()
    low, _ = launch("potrf", "reg_p32_w1", a, inplace=True)
    if low.data_ptr() != a.data_ptr() or not check.within_torch(
            "potrf", "fp32", (keep,), low, launch("potrf", "torch", keep))[0]:
        failures.append("reg potrf inplace: L not written over A correctly")
    a, b = check.make_inputs("posv", 33, 6, "fp32", seed=4)
    x, _ = launch("posv", "reg_p32_w1", a, b)
    x2, _ = launch("posv", "reg_p32_w1", a, b, inplace=True)
    if x2.data_ptr() != b.data_ptr() or not torch.equal(x2, x):
        failures.append("reg posv inplace: x not written over b, or differs from the out-of-place x")
    interpret_child.report(failures)


@pytest.mark.slow
def test_reg_kernels_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=900, OMP_NUM_THREADS="1") == []


def test_reg_packing_holds_one_problem_per_thread_within_its_register_budget():
    assert space.invalid_reason("posv", "reg", 32, 1, 16, "fp32") is None  # 136 elements
    assert "spill" in space.invalid_reason("posv", "reg", 32, 1, 17, "fp32")  # 153
    assert "spill" in space.invalid_reason("posv", "reg", 64, 1, 16, "fp32")  # two problems per thread
    assert space.invalid_reason("potrf", "reg", 32, 1, 12, "fp64") is None  # 78 elements
    assert "spill" in space.invalid_reason("potrf", "reg", 32, 1, 13, "fp64")
    assert space.invalid_reason("posv", "reg", 64, 1, 8, "fp32") is None  # 2 x 36
    assert "P >= 32*num_warps" in space.invalid_reason("potrf", "reg", 32, 2, 4, "fp32")
    assert "potrf, posv only" in space.invalid_reason("gemm", "reg", 32, 1, 4, "fp32")
    assert "num_warps" in space.invalid_reason("posv", "reg", 256, 8, 4, "fp32")
    assert space.parse_config("reg_p64_w2") == space.KernelConfig("reg", 64, 2)
    assert not any(c.packing == "reg" for c in space.config_space("posv", 32, "fp32"))
    assert not any(c.packing == "reg" for c in space.config_space("posv", 16, "fp64"))
    assert {c.id for c in space.config_space("posv", 16, "fp32") if c.packing == "reg"} == {
        "reg_p32_w1", "reg_p64_w2", "reg_p128_w4"}


def test_the_family_parses_reg_ids_and_ranks_them_after_lane():
    from tunedb.families.linalg import configs

    cfg = configs.parse("reg_p64_w2")
    assert configs.shape_of(cfg) == ("reg", 64, 2)
    assert configs.simplicity("reg_p32_w1") > configs.simplicity("lane_p1_w4")
    with pytest.raises(Exception, match="reg configs name their problems per program"):
        configs.parse("reg_w2")


if __name__ == "__main__":
    _child()
