"""A bias the Triton arms of gemm_log_softmax and conv could misread (session 55 probe): a strided
view (bias[::2], a column of a table) read as if contiguous gave wrong log-probabilities / outputs
(the shipped sm90 gemm_log_softmax table serves `rf_` configs for biased heads; the gemm family's
own launcher, which measurement calls directly, too), and a bias of
another dtype or shape than [Cout], which torch's conv refuses, ran through the conv arms. Each
family's `launch` (what the run time's dispatch calls) hands the arms a unit-stride bias. Kernels
under TRITON_INTERPRET=1 against the fp32 reference; keys on the CPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interpret_child

from tunedb.errors import SignatureError
from tunedb.families.conv import keys as conv_keys

_STRIDED = r"""
import torch
import torch.nn.functional as F
from tunedb.families.gemm_log_softmax import FAMILY as GLSM, configs as gc
from tunedb.families.conv import FAMILY as CONV, configs as cc, keys as ck

torch.manual_seed(0)
x = torch.randn(5, 64).half()
w = (torch.randn(200, 64) * 0.2).half()
table = torch.randn(200, 3).half()
for b in (table[:, 1], torch.randn(400).half()[::2]):  # a column; every other element
    assert not b.is_contiguous()
    ref = torch.log_softmax(F.linear(x.float(), w.float(), b.float()), -1)
    for cid in ("rf_b64x64x64_w4_s3_pdl", "rc_b16x128x64_w4_s2", "lr_r1_c2048_w4"):
        y = GLSM.launch(gc.parse(cid), None, x, w, b)
        err = (y.float() - ref).abs().max().item()
        assert err < 0.05, (cid, err)
    assert b.stride(0) != 1  # the caller's tensor is left as it was

xc = torch.randn(2, 8, 40).half()
wd = (torch.randn(8, 1, 5) * 0.3).half()   # depthwise
wp = (torch.randn(12, 8, 3) * 0.3).half()  # dense
for wt, groups, cid in ((wd, 8, "dw_t32_c32_w4"), (wp, 1, "ig_b32x32x16_w4_s2")):
    b = torch.randn(2 * wt.shape[0]).half()[::2]
    sig, _ = ck.signature_of("conv1d", xc, wt, b, 1, 2, 1, groups)
    ref = F.conv1d(xc.float(), wt.float(), b.float(), 1, 2, 1, groups)
    for y in (CONV.launch(cc.parse(cid), sig, xc, wt, b, [1], [2], [1], groups, "none"),
              CONV.launcher(cc.parse(cid), sig)(xc, wt, b, [1], [2], [1], groups, "none")):
        err = (y.float() - ref).abs().max().item()
        assert err < 0.02, (cid, err)

from tunedb.families.gemm import FAMILY as GEMM  # its public ops copied a strided bias; its launcher did not
sig = GEMM.make_signature("gemm_act", "fp16", 64, 64, "none", True)
x = torch.randn(3, 64).half()
w = (torch.randn(64, 64) * 0.125).half()
for b in (torch.randn(128).half()[::2], torch.randn(64, 4).half()[:, 1], torch.tensor([0.75]).half().expand(64)):
    ref = F.linear(x.float(), w.float(), b.float())
    for cid in ("b16x32x32_w4_s3_g8", "dk1_n32x256_w4_s4"):
        for y in (GEMM.launch(GEMM.parse_config(cid), sig, x, w, b),
                  GEMM.launcher(GEMM.parse_config(cid), sig)(x, w, b, None)):
            err = (y.float() - ref).abs().max().item()
            assert err < 0.02, (cid, b.stride(), err)
print("ok")
"""


@pytest.mark.slow
def test_a_strided_bias_is_read_as_its_values_by_every_triton_arm():
    res = interpret_child.snippet(_STRIDED)
    assert res.returncode == 0 and "ok" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]


@pytest.mark.parametrize("bias, why", [
    (torch.randn(8), "another dtype"),
    (torch.randn(16).half(), "more elements than Cout"),
    (torch.randn(1, 8).half(), "two dimensions"),
])
def test_a_bias_torch_refuses_has_no_conv_key(bias, why):
    x, w = torch.randn(1, 4, 12).half(), torch.randn(8, 4, 3).half()
    with pytest.raises(RuntimeError):
        torch.nn.functional.conv1d(x, w, bias, 1, 1)  # torch's own refusal, the contract
    with pytest.raises(SignatureError, match=r"bias .* expected \[8\] \(Cout\)"):
        conv_keys.signature_of("conv1d", x, w, bias, 1, 1, 1, 1)


def test_a_fitting_bias_still_keys_with_bias():
    x, w = torch.randn(1, 4, 12).half(), torch.randn(8, 4, 3).half()
    sig, m = conv_keys.signature_of("conv1d", x, w, torch.randn(16).half()[::2], 1, 1, 1, 1)
    assert sig.get("bias") == 1 and m == 12
