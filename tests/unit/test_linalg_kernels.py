"""The small linear-algebra Triton kernels under the Triton interpreter (CPU): every op x packing
at small n (odd n and padding included), batches that are not a multiple of P, against an fp64
reference and bounded by what torch gets on the same inputs; the non-SPD report; the in-place
contract of launch().

TRITON_INTERPRET must be set before triton is imported, so each packing's checks run in a child
process (this file run as a script, one packing per child).
"""
import json
import os
import subprocess
import sys

import pytest

# (config, batch): batches leave the last program partly empty.
PACKINGS = {"thread": ("thread_p32_w1", 35), "warp": ("warp_p4_w1", 6), "block": ("block_w1", 3)}
OPS = ("dot", "gemv", "gemm", "potrf", "trsv", "posv")


def _child(packing: str) -> None:
    import torch

    from tunedb.families.linalg import kernels_check as check
    from tunedb.families.linalg.launch import launch

    cid, batch = PACKINGS[packing]
    failures = []

    def run(op, dtype, n, seed=0, kind="well"):
        ins = check.make_inputs(op, batch, n, dtype, seed=seed, kind=kind)
        res = launch(op, cid, *ins)
        ref_dtype = "fp32" if dtype in ("fp16", "bf16") else dtype
        ref = launch(op, "torch", *(t.to(check.torch_dtype(ref_dtype)) for t in ins))
        ok, worst, bound = check.within_torch(op, dtype, ins, res, ref)
        if not ok:
            failures.append(f"{cid} {op} {dtype} n={n} {kind}: residual {worst:.2e} > {bound:.2e}")
        if op in ("potrf", "posv") and res[1].any():
            failures.append(f"{cid} {op} {dtype} n={n}: info {res[1].tolist()} on SPD input")
        return ins, res

    for n in (2, 3, 4, 5, 8):
        for op in OPS:
            run(op, "fp32", n)
    for op in OPS:
        run(op, "fp64", 5)
    for op in ("dot", "gemv", "gemm"):
        run(op, "fp16", 4)
    for op in ("potrf", "posv"):
        run(op, "fp32", 8, seed=4, kind="hard")
        run(op, "fp64", 6, seed=5, kind="hard")
    if packing != "thread":
        # the 2x2-split factorisation (NP >= 8): a full last block, a ragged one (n - NP/2 < NP/2),
        # and trsv's unrolled row loop past its first power of two
        for op in ("potrf", "posv", "trsv"):
            run(op, "fp32", 16, seed=15, kind="hard")
            run(op, "fp64", 7, seed=16)
            run(op, "fp32", 13, seed=17)
        # a pivot failing in the second block: info names it, the other problems stay right
        for op in ("potrf", "posv"):
            ins = check.make_inputs(op, batch, 12, "fp32", seed=18)
            ins[0][batch - 1, 9, 9] = -50.0
            want = torch.linalg.cholesky_ex(ins[0].double()).info.int().tolist()
            res = launch(op, cid, *ins)
            if res[1].tolist() != want or want[-1] < 9:
                failures.append(f"{cid} {op} n=12 non-SPD in the second block: info {res[1].tolist()} != {want}")
            ok, worst, bound = check.within_torch(op, "fp32", tuple(t[:-1] for t in ins), res[0][:-1],
                                                  launch(op, "torch", *(t[:-1] for t in ins)))
            if not ok:
                failures.append(f"{cid} {op} n=12 non-SPD: the SPD problems' residual {worst:.2e} > {bound:.2e}")
        low, _ = launch("potrf", cid, *check.make_inputs("potrf", batch, 12, "fp64", seed=19))
        if not torch.equal(low, low.tril()):
            failures.append(f"{cid} potrf n=12: L not zero above the diagonal")

    # non-SPD problems: info for exactly those, the others still right
    for op in ("potrf", "posv"):
        n = 5
        ins = check.make_inputs(op, batch, n, "fp32", seed=9)
        a = ins[0]
        bad = {0: 3, batch - 1: 1}
        for b, k in bad.items():
            a[b, k - 1, k - 1] = -1.0
        if batch > 2:
            a[1, 2, 2] = float("nan")
        want = torch.linalg.cholesky_ex(a.double()).info
        want[1] = 3 if batch > 2 else want[1]
        res = launch(op, cid, *ins)
        if res[1].tolist() != want.int().tolist():
            failures.append(f"{cid} {op} non-SPD: info {res[1].tolist()} != {want.tolist()}")
        good = (want == 0).nonzero().flatten()
        if len(good):
            sub = tuple(t[good] for t in ins)
            ok, worst, bound = check.within_torch(op, "fp32", sub, res[0][good], launch(op, "torch", *sub))
            if not ok:
                failures.append(f"{cid} {op} non-SPD: the SPD problems' residual {worst:.2e} > {bound:.2e}")
        finite_in = torch.isfinite(a).flatten(1).all(1)
        if not torch.isfinite(res[0][finite_in]).all():
            failures.append(f"{cid} {op} non-SPD: a non-finite result from a finite input")

    # the in-place contract
    n = 5
    a, = check.make_inputs("potrf", batch, n, "fp32", seed=11)
    keep = a.clone()
    low, info = launch("potrf", cid, a, inplace=True)
    if low.data_ptr() != a.data_ptr() or not check.within_torch("potrf", "fp32", (keep,), low, launch("potrf", "torch", keep))[0]:
        failures.append(f"{cid} potrf inplace: L not written over A correctly")
    lo, b = check.make_inputs("trsv", batch, n, "fp32", seed=12)
    keep = b.clone()
    x = launch("trsv", cid, lo, b, out=b)
    if x.data_ptr() != b.data_ptr() or not check.within_torch("trsv", "fp32", (lo, keep), x, launch("trsv", "torch", lo, keep))[0]:
        failures.append(f"{cid} trsv out=b: wrong")
    a, b = check.make_inputs("posv", batch, n, "fp32", seed=13)
    ka, kb = a.clone(), b.clone()
    x, _ = launch("posv", cid, a, b)
    if not (torch.equal(a, ka) and torch.equal(b, kb)):
        failures.append(f"{cid} posv without inplace wrote an input")
    x2, _ = launch("posv", cid, a, b, inplace=True)
    if x2.data_ptr() != b.data_ptr() or not torch.equal(x2, x):
        failures.append(f"{cid} posv inplace: x not written over b, or differs from the out-of-place x")
    for op in ("dot", "gemv", "gemm"):
        ins = check.make_inputs(op, batch, 3, "fp32", seed=14)
        keep = [t.clone() for t in ins]
        y = launch(op, cid, *ins)
        out = torch.full_like(y, float("nan"))
        if launch(op, cid, *ins, out=out) is not out or not torch.equal(out, y) or not all(map(torch.equal, ins, keep)):
            failures.append(f"{cid} {op}: out= not honoured or an input written")
    empty = launch("potrf", cid, torch.empty(0, 4, 4))
    if empty[0].shape != (0, 4, 4) or empty[1].shape != (0,):
        failures.append(f"{cid} potrf on an empty batch: shapes {empty[0].shape}, {empty[1].shape}")
    print("RESULT " + json.dumps(failures))


@pytest.mark.slow
@pytest.mark.parametrize("packing", sorted(PACKINGS))
def test_kernels_match_the_fp64_reference_under_the_interpreter(packing):
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")  # tiny tensors: threads only cost
    proc = subprocess.run([sys.executable, __file__, packing], env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads(lines[-1][7:]) == []


if __name__ == "__main__":
    _child(sys.argv[1])
