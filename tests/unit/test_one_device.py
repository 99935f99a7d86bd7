"""A call whose tensors sit on different devices is a SignatureError naming each tensor's device,
in every public op (a CUDA kernel handed a CPU pointer failed inside Triton, and the key then fell
back to torch for the epoch; here a meta tensor among CPU tensors stands in for the second
device: the linalg and log-softmax ops returned results on mixed devices, scaled_mm computed)."""
from __future__ import annotations

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families import key_rules


def _meta(t):
    return t.to("meta")


def test_the_rule_names_every_device_and_skips_none():
    key_rules.check_one_device("op", a=torch.zeros(1), b=None, c=torch.zeros(2))
    with pytest.raises(SignatureError, match="op's tensors must be on one device; got a on cpu, b on meta"):
        key_rules.check_one_device("op", a=torch.zeros(1), b=torch.zeros(1, device="meta"))


def _spd():
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    return a @ a.mT + torch.eye(4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)


@pytest.mark.parametrize("which", [0, 1])
def test_linalg_ops(which):
    from tunedb.families.linalg import ops as la

    a, b = _spd()
    args = [a, b]
    args[which] = _meta(args[which])
    with pytest.raises(SignatureError, match=r"linalg posv's tensors must be on one device; got A on .*, b on "):
        la.posv(*args)
    with pytest.raises(SignatureError, match="linalg gemv's tensors must be on one device"):
        la.gemv(*args)


def test_bmm_and_gemm_log_softmax():
    from tunedb.families.bmm import ops as bmm_ops
    from tunedb.families.gemm_log_softmax import ops as glsm_ops

    with pytest.raises(SignatureError, match="bmm's tensors must be on one device"):
        bmm_ops.bmm(torch.randn(2, 3, 4), _meta(torch.randn(2, 4, 5)))
    x, w = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(9, 16, dtype=torch.bfloat16)
    with pytest.raises(SignatureError, match="gemm_log_softmax's tensors must be on one device; got x on cpu, "
                                             "weight on meta"):
        glsm_ops.gemm_log_softmax(x, _meta(w))
    with pytest.raises(SignatureError, match="bias on meta"):
        glsm_ops.gemm_log_softmax(x, w, _meta(torch.randn(9, dtype=torch.bfloat16)))


def test_scaled_mm_scales_on_another_device():
    from tunedb.families.scaled_mm import ops as smm

    x, w = torch.randint(-8, 8, (4, 32), dtype=torch.int8), torch.randint(-8, 8, (16, 32), dtype=torch.int8)
    xs, ws = torch.rand(4, 1), torch.rand(16)
    with pytest.raises(SignatureError, match="scaled_mm's tensors must be on one device; .*x_scale on meta"):
        smm.scaled_mm_int8(x, w, _meta(xs), ws)
    with pytest.raises(SignatureError, match="weight on meta"):
        smm.scaled_mm_int8(x, _meta(w), xs, ws)


def test_conv_and_group_gemm_keys():
    from tunedb.families.conv import keys as conv_keys
    from tunedb.families.group_gemm import keys as gg_keys

    x = torch.empty(2, 8, 20, dtype=torch.float16)
    with pytest.raises(SignatureError, match="conv1d's tensors must be on one device"):
        conv_keys.signature_of("conv1d", x, torch.empty(8, 1, 5, dtype=torch.float16, device="meta"), None, 1, 2, 1, 8)
    ids = torch.zeros(3, 2, dtype=torch.int32, device="meta")
    with pytest.raises(SignatureError, match="group_gemm's tensors must be on one device"):
        gg_keys.signature_of("group_gemm", torch.empty(3, 16, dtype=torch.bfloat16),
                             torch.empty(4, 8, 16, dtype=torch.bfloat16), ids)
