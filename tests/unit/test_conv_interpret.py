"""The conv family's Triton kernels under TRITON_INTERPRET=1 (CPU, small shapes) against the fp32
convolution: the direct depthwise kernel in both layouts, with stride, dilation, bias and an
activation; the implicit GEMM as a pointwise conv1d on a transposed view and as the Conformer's
conv2d(3x3, stride 2) + ReLU."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import json
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

CASES = {
    "dw_nct_bias_silu": ("conv1d", dict(cin=12, cout=12, kernel=31, stride=1, padding=15, dilation=1, groups=12,
                                         bias=True, act="silu", lay="nct"), "dw_t32_c16_w2", (2, 45)),
    "dw_ntc_strided": ("conv1d", dict(cin=20, cout=20, kernel=5, stride=2, padding=3, dilation=2, groups=20,
                                      bias=False, act="none", lay="ntc"), "dw_t32_c16_w2", (1, 70)),
    "pw_ntc": ("conv1d", dict(cin=24, cout=40, kernel=1, stride=1, padding=0, dilation=1, groups=1, bias=True,
                              act="none", lay="ntc"), "ig_b32x32x16_w4_s2", (2, 37)),
    "dense_k3": ("conv1d", dict(cin=10, cout=33, kernel=3, stride=2, padding=1, dilation=1, groups=1, bias=True,
                                act="relu", lay="nct"), "ig_b32x32x16_w4_s2", (1, 50)),
    "sub_first": ("conv2d", dict(cin=1, cout=16, kernel=3, stride=2, padding=0, dilation=1, groups=1, bias=True,
                                 act="relu", lay="nchw", width=20), "ig_b32x32x16_w4_s2", (2, 23)),
    "sub_second": ("conv2d", dict(cin=16, cout=16, kernel=3, stride=2, padding=0, dilation=1, groups=1, bias=True,
                                  act="relu", lay="nhwc", width=9), "ig_b64x32x32_w4_s2", (1, 15)),
}

SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from tunedb.families.conv import FAMILY, keys, configs
    from tunedb.families.conv.arms import make_inputs
    results = {}
    for name, (op, kw, cid, (b, length)) in json.loads(sys.argv[1]).items():
        kw = dict(kw)
        sig = keys.make_signature(op, "fp16", kw.pop("cin"), kw.pop("cout"), kw.pop("kernel"), **kw)
        args, _ = make_inputs(sig, 1, "cpu", seed=3, batch=b, length=length)
        if keys.signature_of(op, *args)[0] != sig:
            results[name] = "inputs keyed as " + str(keys.signature_of(op, *args)[0])
            continue
        ref = FAMILY.reference(sig, *args)
        y = FAMILY.launch(configs.parse(cid), sig, *args)
        if y.shape != ref.shape:
            results[name] = f"shape {tuple(y.shape)} != {tuple(ref.shape)}"
            continue
        out = torch.full_like(y, float("nan"))
        FAMILY.launch(configs.parse(cid), sig, *args, out=out)
        err = max(((t.float() - ref).norm() / ref.norm()).item() for t in (y, out))
        results[name] = err if not out.isnan().any() else "elements left unwritten"
        if name == "dw_nct_bias_silu":  # the run-time path: the op's call key, an override, the kernel
            from tunedb.runtime import dispatch, launch_table
            with launch_table.overriding(lambda fam, s, m: (configs.parse(cid), "test")):
                bound = dispatch.bound(keys.FAMILY, op, *args)
                y = dispatch.call(keys.FAMILY, op, *args)
            ok = bound.config.id == cid and bound.signature == sig
            results["dispatch"] = ((y.float() - ref).norm() / ref.norm()).item() if ok else f"bound {bound}"
    print("RESULTS" + json.dumps(results))
""")


@pytest.fixture(scope="module")
def results():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cases = {name: [op, {k: v for k, v in kw.items()}, cid, list(shape)] for name, (op, kw, cid, shape) in CASES.items()}
    res = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(res.stdout.split("RESULTS", 1)[1])


@pytest.mark.parametrize("name", sorted(CASES) + ["dispatch"])
def test_kernel_matches_fp32_reference(results, name):
    err = results[name]
    assert isinstance(err, float), err
    assert err < 2e-3, f"{name}: relative error {err:.2e} against the fp32 convolution"
