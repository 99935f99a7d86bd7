"""The panel packing with its update on tl.dot (kernels_pdot.py) under the Triton interpreter:
potrf and posv at n = 16 (one panel, no product) and 37 (products over two panels, a last panel
without its second sub-panel), fp32 and fp64, batch 2, against an fp64 reference bounded by what
torch gets on the same inputs; the upper triangle never read (NaN-poisoned); info on a non-SPD
problem as torch.linalg.cholesky_ex reports it with every result finite; posv in place (the
factor over A, x over b). The kernels are called directly (n = 16 is below the packing's n >= 33
in the space, and still a valid kernel); the packing's rules and place in the candidates are
checked below, the launch path on the GPU (tests/gpu/test_linalg_panel_gpu.py)."""
import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import interpret_child  # noqa: E402

CASES = [(16, "fp32"), (16, "fp64"), (37, "fp32"), (37, "fp64")]


def _run(op, ins, a=None, x=None):
    """One pdot call on `ins` (B = 8, KC = 16); posv factors into `a` and solves into `x` when given."""
    import torch

    from tunedb.families.linalg import kernels_pdot as kd

    batch, n = ins[0].shape[0], ins[0].shape[-1]
    meta = {"N": n, "NP": max(32, 1 << (n - 1).bit_length()), "B": 8, "KC": 16}
    info = torch.empty(batch, dtype=torch.int32)
    if op == "potrf":
        out = torch.empty_like(ins[0])
        kd.potrf_pdot[(batch,)](ins[0], out, info, batch, **meta)
        return out, info
    out = torch.empty_like(ins[1]) if x is None else x
    work = torch.empty_like(ins[0]) if a is None else a
    kd.posv_pdot[(batch,)](ins[0], ins[1], out, work, info, batch, **meta)
    return out, info


def _failures() -> list[str]:
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    failures = []
    for n, dt in CASES:
        for op in ("potrf", "posv"):
            ins = check.make_inputs(op, 2, n, dt, seed=n, kind="hard")
            poisoned = ins[0] + torch.triu(torch.full_like(ins[0], float("nan")), 1)
            res = _run(op, (poisoned,) + ins[1:])
            ok, worst, bound = check.within_torch(op, dt, ins, res[0], launch(op, "torch", *ins))
            if not ok or res[1].any():
                failures.append(f"pdot {op} {dt} n={n}: residual {worst:.2e} (bound {bound:.2e}), info {res[1].tolist()}")
            if op == "potrf" and not torch.equal(res[0], res[0].tril()):
                failures.append(f"pdot potrf {dt} n={n}: L not zero above the diagonal")
            bad = check.make_inputs(op, 2, n, dt, seed=7)
            bad[0][1, n // 2 + 1, n // 2 + 1] = -1.0
            want = torch.linalg.cholesky_ex(bad[0].double()).info.int().tolist()
            res = _run(op, bad)
            if res[1].tolist() != want or not torch.isfinite(res[0]).all():
                failures.append(f"pdot {op} {dt} n={n} non-SPD: info {res[1].tolist()} != {want} or non-finite")
    a, b = check.make_inputs("posv", 2, 37, "fp64", seed=4)
    x, _ = _run("posv", (a, b))
    a2, b2 = a.clone(), b.clone()
    x2, _ = _run("posv", (a2, b2), a=a2, x=b2)
    if not torch.equal(x2, x):
        failures.append("pdot posv in place (factor over A, x over b) differs from out of place")
    return failures


@pytest.mark.slow
def test_pdot_kernels_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, timeout=900, OMP_NUM_THREADS="1") == []


if __name__ == "__main__":
    interpret_child.report(_failures())


def test_pdot_packing_rules_and_ids():
    from tunedb.families.linalg import configs
    from tunedb.families.linalg import kernels_space as space

    ids = lambda op, n, dt: [c.id for c in space.config_space(op, n, dt) if c.packing in space.PDOT_PACKINGS]  # noqa: E731
    assert ids("potrf", 128, "fp32") == ["pdot_w2", "pdot_w4", "pdottf_w2", "pdottf_w4"]  # <= 2 rows a thread
    assert ids("posv", 128, "fp64") == ["pdot_w4"]  # fp64: one row a thread (two spill)
    assert ids("posv", 64, "fp32") == ["pdot_w1", "pdot_w2", "pdottf_w1", "pdottf_w2"]
    assert ids("potrf", 32, "fp32") == [] and ids("trsv", 64, "fp32") == []
    assert "fp32 only" in space.invalid_reason("potrf", "pdottf", 1, 4, 128, "fp64")
    assert "n >= 33" in space.invalid_reason("posv", "pdot", 1, 1, 32, "fp32")
    assert "num_warps >= 4 fits" in space.invalid_reason("posv", "pdot", 1, 2, 128, "fp64")
    assert space.parse_config("pdottf_w2") == space.KernelConfig("pdottf", 1, 2)
    assert configs.shape_of(configs.parse("pdot_w4")) == ("pdot", 1, 4)
    assert configs.simplicity("pdot_w1") > configs.simplicity("panel_w4")
    with pytest.raises(Exception, match="one problem per program"):
        configs.parse("pdot_p2_w1")


def test_pdot_goes_first_then_panel_at_n_33_and_up():
    from tunedb.families.linalg import kernels_prior as prior
    from tunedb.families.linalg import kernels_space as space

    for op in ("potrf", "posv"):
        for dt in ("fp32", "fp64"):
            for n in (33, 64, 128):
                valid = space.config_space(op, n, dt)
                pdot = [c for c in valid if c.packing in space.PDOT_PACKINGS]
                panel = [c for c in valid if c.packing == "panel"]
                first = prior.candidates(op, n, dt, cap=len(pdot) + len(panel), batch=4096)
                assert set(first[:len(pdot)]) == set(pdot) and set(first[len(pdot):]) == set(panel), (op, n, dt, first)
