"""The fp8 scale mode inferred from a call's scales (scaled_mm/keys.infer_scale): at N, K <= 128 a
block weight scale is [1, 1], the shape of a per-tensor one; an activation scale of M > 1 values
then says block (before, the call was refused with a message naming per-tensor shapes)."""
import torch

from tunedb.families.scaled_mm import keys, ops


def test_block_scales_at_small_n_and_k_are_inferred():
    xf = torch.randn(4, 64).to(torch.float8_e4m3fn)
    wf = torch.randn(8, 64).to(torch.float8_e4m3fn)
    xs, ws = torch.full((4, 1), 0.5), torch.full((1, 1), 2.0)
    assert keys.infer_scale(ws, 8, 64, xs) == "block"
    assert torch.equal(ops.scaled_mm_fp8(xf, wf, xs, ws), ops.scaled_mm_fp8(xf, wf, xs, ws, "block"))
    assert keys.infer_scale(ws, 8, 64, torch.ones(())) == "tensor"
    assert keys.infer_scale(ws, 8, 64) == "tensor"
    assert keys.infer_scale(torch.ones(8), 8, 64, xs) == "row"
