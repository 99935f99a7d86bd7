"""A decode-shaped x ([B, 1, K]: one token a row) with its scale already in the keys' [M, ...] form
(session 56 probe): the [B, 1] scale equals x's leading dims, and was flattened to [B], which a
block scale at K <= 128 ([M, ceil(K/128)] = [B, 1]) is not; the error then named a shape the caller
never passed."""
from __future__ import annotations

import pytest
import torch

from tunedb.errors import SignatureError
from tunedb.families.scaled_mm import ops as S

F8 = torch.float8_e4m3fn


def _operands(b: int, n: int, k: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(b, 1, k, generator=g).to(F8)
    w = torch.randn(n, k, generator=g).to(F8)
    return x, w


@pytest.mark.parametrize("scale", ["block", None])
def test_a_one_token_rows_x_takes_its_flat_block_scale(scale):
    x, w = _operands(4, 32, 64)
    sx, sw = torch.rand(4, 1), torch.rand(1, 1)
    args = (sx, sw) if scale is None else (sx, sw, scale)
    flat = S.scaled_mm_fp8(x.view(4, 64), w, sx, sw, "block")
    got = S.scaled_mm_fp8(x, w, *args)
    assert got.shape == (4, 1, 32) and torch.equal(got.view(4, 32), flat)


def test_a_row_scale_over_leading_dims_still_folds():
    x = torch.randn(2, 3, 64).to(F8)
    w = torch.randn(32, 64).to(F8)
    sx, sw = torch.rand(2, 3), torch.rand(1, 32)
    got = S.scaled_mm_fp8(x, w, sx, sw)
    want = S.scaled_mm_fp8(x.reshape(6, 64), w, sx.reshape(6, 1), sw)
    assert got.shape == (2, 3, 32) and torch.equal(got.reshape(6, 32), want)


def test_a_wrong_block_scale_is_named_as_passed():
    x, w = _operands(4, 32, 256)  # ceil(256 / 128) = 2 blocks: [4, 1] is not a block scale
    with pytest.raises(SignatureError, match=r"x_scale has shape \[4, 1\] but scale=block"):
        S.scaled_mm_fp8(x, w, torch.rand(4, 1), torch.rand(1, 2), "block")


@pytest.mark.parametrize("fam", ["fp8", "int8"])
def test_an_empty_batch_keeps_its_lead_shaped_scale(fam):
    if fam == "fp8":
        x, w = torch.zeros(0, 4, 64).to(F8), torch.randn(32, 64).to(F8)
        got = S.scaled_mm_fp8(x, w, torch.rand(0, 4), torch.rand(1, 32))
    else:
        x, w = torch.zeros(0, 3, 64, dtype=torch.int8), torch.zeros(32, 64, dtype=torch.int8)
        got = S.scaled_mm_int8(x, w, torch.rand(0, 3), torch.rand(32))
    assert got.shape == (*x.shape[:-1], 32)


def test_a_lead_shaped_scale_of_one_row_per_sequence_still_folds():
    x = torch.randn(3, 1, 64).to(F8)  # x [B, 1, K] with a [B, 1] row scale: the same numbers either way
    w = torch.randn(32, 64).to(F8)
    sx, sw = torch.rand(3, 1), torch.rand(1, 32)
    got = S.scaled_mm_fp8(x, w, sx, sw)
    assert torch.equal(got.view(3, 32), S.scaled_mm_fp8(x.view(3, 64), w, sx, sw))
