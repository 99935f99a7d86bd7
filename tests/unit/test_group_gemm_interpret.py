"""The grouped-GEMM Triton kernel under the Triton interpreter (CPU), fp16, small E, N, K: both
input forms, weighted and not, against the fp32 reference (the routing metadata from the
one-program routing kernel, itself checked against the Python reference), with random routings, experts that
get no slot, one expert that gets every slot, ragged N/K (masked tiles) and several tiles of
both Triton lanes (the sorted grouped tiles and the routing-free slot lane).
TRITON_INTERPRET must be set before triton is imported, so the checks run in a child process."""
from __future__ import annotations

import pytest

import interpret_child


def _child() -> None:
    import torch

    from tunedb import families
    from tunedb.families.group_gemm import arms, configs
    from tunedb.families.group_gemm.keys import make_signature
    from tunedb.records import Config

    from tunedb.families.group_gemm import routing

    fam = families.get("group_gemm")
    failures = []
    # the one-program routing kernel against the Python reference (and the torch ops)
    gen = torch.Generator().manual_seed(1)
    for e, m, top_k, bm in ((6, 37, 2, 16), (8, 1, 2, 64), (20, 9, 4, 16), (5, 40, 1, 128)):
        cases = {"random": arms.random_routing(m, e, top_k, gen, "cpu").long(),
                 "all_to_one": torch.full((m, top_k), e - 2, dtype=torch.int32),
                 "two_used": torch.randint(0, 2, (m, top_k), generator=gen, dtype=torch.int32) * (e - 1),
                 # a column view of a wider tensor: reshape(-1) is strided, the program reads stride 1
                 "strided": torch.randint(0, e, (m, 2 * top_k + 1), generator=gen, dtype=torch.int32)[:, :top_k]}
        for name, ids in cases.items():
            r = routing.route(ids, e, bm, fused=True)
            rows, experts = routing.reference_route(ids, e, bm)
            counts = [int((ids == i).sum()) for i in range(e)]
            if (r.sorted_ids.tolist(), r.block_expert.tolist(), r.counts.tolist()) != (rows, experts, counts):
                failures.append(f"route_kernel E={e} M={m} top_k={top_k} BM={bm} {name}: differs from the reference")
    # the torch sentinel too: every arm must return the `out` it is given
    tiles = [Config.sentinel("default"), configs.make(16, 64, 64, 4, 2, 1), configs.make(32, 64, 64, 4, 3, 8),
             configs.make_slots(16, 64, 2, 2), configs.make_slots(32, 128, 4, 1), Config.sentinel("torch")]
    gen = torch.Generator().manual_seed(0)
    for e, n, k, top_k, m in ((4, 48, 40, 2, 7), (5, 72, 96, 1, 19), (4, 32, 64, 3, 4)):
        for form in ("token", "slot"):
            sig = make_signature(e, n, k, top_k, "fp16", form)
            args, _ = fam.make_inputs(sig, m, "cpu", seed=e + m)
            routings = {"random": args[2], "random_int64": args[2].long(),
                        "all_to_one": torch.stack([torch.full((m,), e - 1, dtype=torch.int32)]
                                                  + [torch.full((m,), j, dtype=torch.int32) for j in range(top_k - 1)], 1),
                        "one_empty": arms.random_routing(m, e - 1, top_k, gen, "cpu"),  # expert e-1 gets none
                        "strided": torch.cat([args[2], args[2]], 1)[:, ::2]}  # the same ids, a strided view
            for name, ids in routings.items():
                call = (args[0], args[1], ids, *args[3:])
                if name == "strided":  # strided routing weights too (the kernels read them at stride 1)
                    tw = torch.rand((m, 2 * top_k), generator=gen).to(torch.float16)[:, ::2]
                    call = (args[0], args[1], ids, tw)
                ref = fam.reference(sig, *call)
                base = float((arms.loop(sig, *call).float() - ref).norm() / ref.norm())
                for cfg in tiles:
                    out = torch.full((m, top_k, n), float("nan"), dtype=torch.float16)
                    y = fam.launch(cfg, sig, *call, out=out)
                    err = float((y.float() - ref).norm() / ref.norm())
                    if y is not out or not err <= max(4 * base, 2e-3) or torch.isnan(out).any():
                        failures.append(f"{sig.format()} M={m} {name} {cfg.id}: err {err:.2e} (loop {base:.2e}), "
                                        f"returned out: {y is out}, unwritten: {int(torch.isnan(out).sum())}")
    interpret_child.report(failures)


@pytest.mark.slow
def test_kernel_matches_the_fp32_reference_under_the_interpreter():
    assert interpret_child.failures(__file__, OMP_NUM_THREADS="1") == []


if __name__ == "__main__":
    _child()
