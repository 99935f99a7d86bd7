"""The panel packing with its update on tl.dot (kernels_pdot.py) under the Triton interpreter:
potrf and posv at n = 16 (one panel, no product) and 37 (products over two panels, a last panel
without its second sub-panel), fp32 and fp64, batch 2, against an fp64 reference bounded by what
torch gets on the same inputs; the upper triangle never read (NaN-poisoned); info on a non-SPD
problem as torch.linalg.cholesky_ex reports it with every result finite; posv in place (the
factor over A, x over b). Not wired into launch(): the kernels are called directly."""
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
