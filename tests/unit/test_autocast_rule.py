"""Under torch.autocast a tuned op takes torch's path only where autocast would cast its operands
(runtime.autocast_rule): a model already in autocast's dtype keeps its served kernel (the RNN's
persistent kernel here; the GEMM ops in test_gemm_autocast.py; conv and bmm on the GPU)."""
from __future__ import annotations

import torch

from tunedb.families.rnn.census import _kernel_may_serve
from tunedb.runtime.autocast_rule import casts


def test_casts_only_what_autocast_would_cast():
    bf, f32 = torch.ones(2, dtype=torch.bfloat16), torch.ones(2)
    assert not casts("cpu", bf, f32)  # autocast off
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not casts("cpu", bf, bf, None)
        assert casts("cpu", bf, f32)
        assert not casts("cuda", bf, f32)  # autocast is per device type


def test_an_rnn_already_in_autocasts_dtype_may_take_the_kernel():
    lstm = torch.nn.LSTM(8, 8, num_layers=2).to(torch.bfloat16).eval()
    x = torch.randn(5, 2, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        assert _kernel_may_serve(lstm, x, None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert _kernel_may_serve(lstm, x, None)
            assert not _kernel_may_serve(lstm.float(), x, None)  # fp32 weights: autocast casts them
