"""The checks the GEMM decode lane's interpreter tests share (test_gemm_decode.py for `dk` configs,
test_gemm_decode_stream.py for `ds`): each case at each M against an fp32 reference with the output
NaN-poisoned (fp16: the interpreter's tl.dot mishandles bf16), then the deterministic reduction's
bitwise repeatability. Runs inside the interpreter child; returns the failures as lines. Also the
pure-Python side those tests share: the signature maker and the two arches the predicate sees."""
from __future__ import annotations


def sig(n=4096, k=4096, op="gemm", act="none", bias=False, dt="bf16"):
    """A GEMM family signature of the decode tests' defaults."""
    from tunedb.families.gemm import FAMILY

    return FAMILY.make_signature(op, dt, n, k, act, bias)


def arches():
    """(sm90 as shipped, an sm80 profile): the predicate refuses PDL and the prefetch off sm90."""
    from tunedb.arch import shipped_profile
    from tunedb.records import ArchProfile

    return shipped_profile("sm90"), ArchProfile("sm80", "test", 108, 166912, 166912, 40 << 20, 0, 0.0, 0.0, 0.0,
                                                0.0, 0.0, "test")


def decode_failures(cases, det_k: int, det_cids) -> list[str]:
    """`cases`: (config id, op, N, K, act, bias, Ms); `det_cids` run twice on the same inputs at
    a gelu+bias signature of N=80, K=`det_k`, M=13 and must give the same bits."""
    import torch

    from tunedb.families.gemm import FAMILY

    failures = []

    def run(cid, s, m, seed):
        (x, w, b), _ = FAMILY.make_inputs(s, m, "cpu", seed=seed)
        out = torch.full((m, s.get("N")), float("nan"), dtype=x.dtype)
        y = FAMILY.launch(FAMILY.parse_config(cid), s, x, w, b, out=out)
        return x, w, b, y

    for cid, op, n, k, act, bias, ms in cases:
        s = FAMILY.make_signature(op, "fp16", n, k, act, bias)
        for m in ms:
            x, w, b, y = run(cid, s, m, seed=m)
            ref = FAMILY.reference(s, x, w, b)
            err = (y.float() - ref).abs().max().item()
            rounding = (ref.to(x.dtype).float() - ref).abs().max().item()
            if torch.isnan(y).any() or err > 4 * rounding + 2e-3:
                failures.append(f"{cid} {s.format()} M={m}: err {err} (rounding {rounding})")
    # the deterministic reduction: the same inputs give the same bits (and the counters reset)
    s = FAMILY.make_signature("gemm_act", "fp16", 80, det_k, "gelu", True)
    for cid in det_cids:
        first, again = run(cid, s, 13, seed=7)[3], run(cid, s, 13, seed=7)[3]
        if not torch.equal(first, again):
            failures.append(f"{cid}: two runs on the same inputs differ")
    return failures
