"""The Triton arms a shape no table measured still gets, under the Triton interpreter (CPU), at
small stand-ins with the unseen shapes' awkward properties, against an fp64 reference:

- scaled_mm int8's `heuristic` (the family's fallback: a tile, since torch._int_mm is slower and
  refuses M <= 16) at K < 128 (BK = 128: the whole K is one masked tail), N not a multiple of the
  tile, M = 1, 5 and 33 (edge row tiles): bit-equal to the torch path and near the fp64 product;
- group_gemm's untuned tile (`default`), which the default tier still serves where torch's arm
  is the host-syncing per-expert loop: fp16 keys and N, K not multiples of 8.
TRITON_INTERPRET must be set before triton is imported, so the checks run in a child process."""
from __future__ import annotations

import pytest

import interpret_child


def _scaled_mm(failures: list) -> None:
    import torch

    from tunedb import families
    from tunedb.families.scaled_mm import ops
    from tunedb.records import Config

    fam = families.get("scaled_mm")
    for n, k in ((40, 96), (72, 24)):
        for m in (1, 5, 33):
            sig = fam.make_signature("scaled_mm", n, k, "bf16")
            args, _ = fam.make_inputs(sig, m, "cpu", seed=n + m)
            tile = fam.heuristic(sig, m)
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
            got = fam.launch(Config.sentinel("heuristic"), sig, *args, out=y)
            # the interpreter converts fp32 -> bf16 by dropping the low bits (test_scaled_mm_interpret)
            y32 = ops.cpu_product(sig, *args)
            want = (y32.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
            ref = fam.reference(sig, *args, dtype=torch.float64)
            err = float((got.double() - ref).norm() / ref.norm())
            if got is not y or torch.isnan(got).any() or not torch.equal(got, want) or err > 2 ** -7:
                failures.append(f"scaled_mm heuristic ({tile.id}) {sig} M={m}: err {err:.2e}, "
                                f"bitwise {torch.equal(got, want)}")


def _group_gemm(failures: list) -> None:
    import torch

    from tunedb import families
    from tunedb.families.group_gemm.keys import make_signature
    from tunedb.records import Config
    from tunedb.runtime import selector

    fam = families.get("group_gemm")
    selector.configure("sm90")
    for e, n, k, top_k, m, dt in ((6, 20, 36, 2, 9, "fp16"), (3, 44, 12, 1, 17, "bf16")):
        sig = make_signature(e, n, k, top_k, dt, "token")
        served = selector.peek("group_gemm", sig, m).config
        if served.id != "default":
            failures.append(f"group_gemm {sig}: the default tier serves {served.id}, not the untuned tile")
        if dt == "bf16":
            continue  # the interpreter's tl.dot mishandles bf16 on CPU; the selection is what is checked
        args, _ = fam.make_inputs(sig, m, "cpu", seed=e + m)
        ref = fam.reference(sig, *args, dtype=torch.float64)
        out = torch.full((m, top_k, n), float("nan"), dtype=torch.float16)
        got = fam.launch(Config.sentinel("default"), sig, *args, out=out)
        err = float((got.double() - ref.double()).norm() / ref.double().norm())
        if got is not out or torch.isnan(out).any() or err > 2e-3:
            failures.append(f"group_gemm default {sig} M={m}: err {err:.2e}")


def _child() -> None:
    failures: list = []
    _scaled_mm(failures)
    _group_gemm(failures)
    interpret_child.report(failures)


@pytest.mark.slow
def test_the_arms_unseen_shapes_get_match_the_fp64_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, OMP_NUM_THREADS="1") == []


if __name__ == "__main__":
    _child()
