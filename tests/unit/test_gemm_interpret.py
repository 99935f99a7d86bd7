"""GEMM Triton lanes under the Triton interpreter (CPU) on small odd shapes, against torch.

TRITON_INTERPRET must be set before any kernel is defined, so the checks run in a child
process (this file run as a script). The interpreter's tl.dot mishandles bf16 on CPU, so
these checks use fp16; bf16 is covered by tests/gpu/test_gemm_gpu.py.
"""
import json
import os
import subprocess
import sys

import pytest

LANE_CASES = [
    # (config id, op, N, K, act, bias, Ms)
    ("b16x32x32_w4_s3_g8", "gemm", 80, 72, "none", False, (1, 3, 17)),
    ("b32x64x64_w4_s3_g8", "gemm_act", 80, 72, "gelu", True, (1, 3)),
    ("b16x64x32_w4_s3_g8", "gemm_act", 80, 72, "relu", True, (3,)),
    ("b16x64x32_w4_s3_g8", "gemm_act", 80, 72, "gelu_tanh", False, (3,)),
    ("b16x64x32_w4_s3_g8", "gemm_act", 80, 72, "silu", True, (3,)),
    ("sk2_b16x32x64_w4_s4", "gemm", 80, 72, "none", False, (1, 3)),
    ("sk4_b16x32x32_w4_s4", "gemm_act", 80, 136, "silu", True, (1, 17)),
    ("sk8_b16x32x32_w4_s4", "gemm_act", 48, 200, "gelu", True, (3,)),  # 7 K tiles: the last split is empty
    ("tma_b64x64x64_w4_s3_g8", "gemm", 80, 72, "none", False, (1, 3, 70)),
    ("tma_b64x128x64_w4_s3_g8", "gemm_act", 136, 72, "gelu_tanh", True, (3,)),
]


def _child() -> None:
    import torch

    from tunedb.families.gemm import FAMILY, configs

    failures = []

    def check(cid, sig, m, x_shape=None, strided=False):
        (x, w, b), _ = FAMILY.make_inputs(sig, m, "cpu", seed=m)
        if x_shape is not None:
            x = x.reshape(x_shape)
        if strided:  # a non-contiguous view with the same values
            x = x.t().contiguous().t()
        cfg = configs.parse(cid) if cid in configs.GEMM_SENTINELS else _make(cid)
        out = torch.full((*x.shape[:-1], sig.get("N")), float("nan"), dtype=x.dtype)
        y = FAMILY.launch(cfg, sig, x, w, b, out=out)
        ref = FAMILY.reference(sig, x, w, b)
        err = (y.float() - ref).abs().max().item()
        torch_err = (FAMILY.launch(configs.parse("torch"), sig, x.float(), w.float(),
                                   None if b is None else b.float()).to(x.dtype).float() - ref).abs().max().item()
        if y is not out or torch.isnan(y).any() or err > 4 * torch_err + 1e-3:
            failures.append(f"{cid} {sig} M={m}: err {err} (torch {torch_err}), nan={torch.isnan(y).any().item()}")
        return y

    def _make(cid):
        cfg = configs.parse(cid) if cid in {c.id for c in configs.full_grid()} else None
        if cfg is None:  # tiny tiles outside the production grid are fine for the interpreter
            import re

            g = re.match(r"^(tma_)?(?:sk(\d+)_)?b(\d+)x(\d+)x(\d+)_w(\d+)_s(\d+)(?:_g(\d+))?$", cid).groups()
            lane = "triton_tma" if g[0] else "triton_splitk" if g[1] else "triton_mma"
            cfg = configs.make(lane, int(g[2]), int(g[3]), int(g[4]), int(g[5]), int(g[6]),
                               int(g[7] or 1), int(g[1] or 1))
        return cfg

    for cid, op, n, k, act, bias, ms_ in LANE_CASES:
        sig = FAMILY.make_signature(op, "fp16", n, k, act, bias)
        for m in ms_:
            check(cid, sig, m)
    sig = FAMILY.make_signature("gemm", "fp16", 80, 72)
    check("b16x32x32_w4_s3_g8", sig, 6, x_shape=(2, 3, 72))  # leading dims
    check("b16x32x32_w4_s3_g8", sig, 5, strided=True)
    check("default", sig, 3)
    # split-K: the same inputs give the same bits
    sk_sig = FAMILY.make_signature("gemm_act", "fp16", 80, 136, "gelu", True)
    first = check("sk4_b16x32x32_w4_s4", sk_sig, 5)
    again = check("sk4_b16x32x32_w4_s4", sk_sig, 5)
    if not torch.equal(first, again):
        failures.append("split-K results differ between two runs on the same inputs")
    print("RESULT " + json.dumps(failures))


@pytest.mark.slow
def test_triton_lanes_match_torch_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert json.loads(lines[-1][7:]) == []


if __name__ == "__main__":
    _child()
