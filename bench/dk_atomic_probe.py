"""Which `dk..._at` (atomic split-K) decode configs compute wrong results on the GPU, and when.

    PYTHONPATH=src python bench/dk_atomic_probe.py --out dk_atomic_probe.json   # ~30 s on an H200

Sessions 18 A and 33 (bench/decode_gemv_bf16.py) found dk8_n128x128_w8_s4_at_pdl and
dk16_n64x128_w4_s4_at_pdl wrong (error ~2x the output's scale) at M = 4, 8, 16 on every Llama
weight and right at M = 1, while dk8_n32x256_w4_s4_at_pdl was right everywhere; the Triton
interpreter computes all three right. `_at` configs are outside the family's build space (the
deterministic finish is the default), so nothing served them. This probe separates the
suspects: each config with and without PDL and its deterministic twin, M = 1..16, two weights,
a fresh launcher per (config, weight) called at each M in turn, then M = 1 and M = 4 again;
error = max |y - ref| / max |ref| against the fp64 product (the gate's scale: ~4e-3 for bf16).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

CONFIGS = ("dk8_n128x128_w8_s4", "dk8_n128x128_w8_s4_at", "dk8_n128x128_w8_s4_at_pdl",
           "dk16_n64x128_w4_s4", "dk16_n64x128_w4_s4_at", "dk16_n64x128_w4_s4_at_pdl",
           "dk8_n32x256_w4_s4_at", "dk8_n32x256_w4_s4_at_pdl", "dk8_n128x128_w4_s4_at",
           "dk2_n128x128_w8_s4_at", "dk8_n64x128_w8_s4_at", "dk4_n64x128_w4_s4_at")
SHAPES = ((4096, 4096), (1024, 4096))
MS = (1, 2, 3, 4, 8, 16, 1, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="dk_atomic_probe.json")
    args = ap.parse_args()
    import torch

    from tunedb.families.gemm import FAMILY

    torch.manual_seed(0)
    rows = []
    for n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        sig = FAMILY.make_signature("gemm", "bf16", n, k)
        for cid in CONFIGS:
            try:
                fn = FAMILY.launcher(FAMILY.parse_config(cid), sig)
            except Exception as exc:  # noqa: BLE001 - an id this tree refuses is reported
                rows.append({"config": cid, "N": n, "K": k, "error": str(exc)[:200]})
                continue
            errs = []
            for m in MS:
                x = (torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16)
                ref = x.double() @ w.double().T
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                fn(x, w, None, out)
                torch.cuda.synchronize()
                errs.append(round(float((out.double() - ref).abs().max() / ref.abs().max()), 5))
            rows.append({"config": cid, "N": n, "K": k, "M": list(MS), "rel_err": errs})
            print(f"{cid:28s} {n}x{k}  " + "  ".join(f"M={m}:{e:.1e}" for m, e in zip(MS, errs)), flush=True)
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
