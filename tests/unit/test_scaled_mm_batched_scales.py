"""An x of more than two dims (a [batch, tokens, K] activation) with its per-token scale over the
same leading dims: what the `_quant` op returns ([..., 1]) and torchao's [...] layout are
accepted and give the flattened call's result (they were refused: 'x_scale has shape [2, 3, 1]
but scale=row at M=6 ... needs one of [[6], [6, 1]]', so a quantized layer could not feed the
next); a leading-dim scale that does not match x is still refused by name."""
from __future__ import annotations

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.scaled_mm import ops as smm


def _int8(shape, seed):
    return torch.randint(-8, 8, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layout", ["[...,1]", "[...]"])
def test_int8_leading_dim_scales(layout):
    x, w = _int8((2, 3, 32), 0), _int8((16, 32), 1)
    xs, ws = torch.rand(2, 3, 1) + 0.5, torch.rand(16) + 0.5
    scale = xs if layout == "[...,1]" else xs.squeeze(-1)
    want = smm.scaled_mm_int8(x.view(6, 32), w, xs.view(6, 1), ws).view(2, 3, 16)
    torch.testing.assert_close(smm.scaled_mm_int8(x, w, scale, ws), want, rtol=0, atol=0)
    got_meta = smm.scaled_mm_int8(x.to("meta"), w.to("meta"), scale.to("meta"), ws.to("meta"))
    assert got_meta.shape == (2, 3, 16)


def test_the_quant_ops_scale_feeds_the_next_layer():
    x, w1, w2 = _int8((2, 3, 32), 2), _int8((32, 32), 3), _int8((16, 32), 4)
    q, s = smm.scaled_mm_int8_quant(x, w1, torch.rand(2, 3, 1) + 0.5, torch.rand(32) + 0.5)
    assert q.shape == (2, 3, 32) and s.shape == (2, 3, 1)
    ws = torch.rand(16) + 0.5
    torch.testing.assert_close(smm.scaled_mm_int8(q, w2, s, ws),
                               smm.scaled_mm_int8(q.view(6, 32), w2, s.view(6, 1), ws).view(2, 3, 16), rtol=0, atol=0)


def test_fp8_block_scales_over_leading_dims():
    f8 = torch.float8_e4m3fn
    x, w = torch.randn(2, 3, 256).to(f8), torch.randn(128, 256).to(f8)
    xs, ws = torch.rand(2, 3, 2) + 0.5, torch.rand(1, 2) + 0.5
    want = smm.scaled_mm_fp8(x.view(6, 256), w, xs.view(6, 2), ws, scale="block").view(2, 3, 128)
    torch.testing.assert_close(smm.scaled_mm_fp8(x, w, xs, ws, scale="block"), want, rtol=0, atol=0)


def test_a_scale_over_other_leading_dims_is_still_refused():
    x, w = _int8((2, 3, 32), 0), _int8((16, 32), 1)
    with pytest.raises(SignatureError, match=r"x_scale has shape \[3, 2, 1\]"):
        smm.scaled_mm_int8(x, w, torch.rand(3, 2, 1), torch.rand(16))
