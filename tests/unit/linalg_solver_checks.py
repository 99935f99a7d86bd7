"""The solver checks the linalg packings' interpreter tests share (test_linalg_lane.py,
test_linalg_reg.py, test_linalg_shfl.py, test_linalg_panel.py): potrf/posv of each (config, n,
dtype, batch) case against torch on well and badly conditioned SPD inputs with the upper triangle
NaN-poisoned, the non-SPD report, and the in-place forms; trsv the same way. Runs inside the
interpreter child; returns the failures as lines."""
from __future__ import annotations


def solver_failures(cases, second_bad: bool, inplace_cfg: str, inplace_batch: int, inplace_n: int) -> list[str]:
    """`second_bad`: besides the last problem, problem 1 is non-SPD too (its first pivot zero), so
    info must name both and the problems between stay right."""
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    failures = []
    for cid, n, dt, batch in cases:
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
        # non-SPD problems: info names exactly those (first bad column), the others stay right and
        # every result finite
        for op in ("potrf", "posv"):
            ins = check.make_inputs(op, batch, n, dt, seed=7)
            a = ins[0]
            a[batch - 1, n // 2, n // 2] = -1.0
            if second_bad:
                a[1, 0, 0] = 0.0
            want = torch.linalg.cholesky_ex(a.double()).info.int().tolist()
            res = launch(op, cid, *ins)
            if res[1].tolist() != want or want[-1] == 0 or (second_bad and want[1] != 1):
                failures.append(f"{cid} {op} n={n} non-SPD: info {res[1].tolist()} != {want}")
            keep = [i for i in range(batch) if want[i] == 0]
            if keep:
                sub = tuple(t[keep] for t in ins)
                ok, worst, bound = check.within_torch(op, dt, sub, res[0][keep], launch(op, "torch", *sub))
                if not ok:
                    failures.append(f"{cid} {op} n={n} non-SPD: the SPD problems' residual {worst:.2e} > {bound:.2e}")
            if not torch.isfinite(res[0]).all():
                failures.append(f"{cid} {op} n={n} non-SPD: a non-finite result from a finite input")
    # in place: L over A, x over b (the kernels load everything before they store)
    packing = inplace_cfg.split("_", 1)[0]
    a, = check.make_inputs("potrf", inplace_batch, inplace_n, "fp32", seed=3)
    kept = a.clone()
    low, _ = launch("potrf", inplace_cfg, a, inplace=True)
    if low.data_ptr() != a.data_ptr() or not check.within_torch(
            "potrf", "fp32", (kept,), low, launch("potrf", "torch", kept))[0]:
        failures.append(f"{packing} potrf inplace: L not written over A correctly")
    a, b = check.make_inputs("posv", inplace_batch, inplace_n, "fp32", seed=4)
    x, _ = launch("posv", inplace_cfg, a, b)
    x2, _ = launch("posv", inplace_cfg, a, b, inplace=True)
    if x2.data_ptr() != b.data_ptr() or not torch.equal(x2, x):
        failures.append(f"{packing} posv inplace: x not written over b, or differs from the out-of-place x")
    return failures


def trsv_failures(cases) -> list[str]:
    """trsv of each (config, n, dtype, batch) case against torch, the upper triangle NaN-poisoned;
    in place (out=b) equal to out of place."""
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    failures = []
    for cid, n, dt, batch in cases:
        ins = check.make_inputs("trsv", batch, n, dt, seed=n)
        poisoned = ins[0] + torch.triu(torch.full_like(ins[0], float("nan")), 1)
        x = launch("trsv", cid, poisoned, ins[1])
        ok, worst, bound = check.within_torch("trsv", dt, ins, x, launch("trsv", "torch", *ins))
        if not ok:
            failures.append(f"{cid} trsv {dt} n={n}: residual {worst:.2e} > {bound:.2e}")
        b = ins[1].clone()
        x2 = launch("trsv", cid, ins[0], b, inplace=True)
        if x2.data_ptr() != b.data_ptr() or not torch.equal(x2, x):
            failures.append(f"{cid} trsv {dt} n={n}: in place (out=b) differs from out of place")
    return failures
