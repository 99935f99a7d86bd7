"""A swapped MoE experts module in a training step: the group_gemm arms have no backward (a
Triton arm's result carries no history; stood in for here by detached results of the torch
arm), so a step that wants a gradient runs the model's own forward: the experts' weights and
the router's weights get the unswapped model's gradients (they got none). And a batch of no
tokens is the model's (group_gemm raised 'needs at least one token')."""
from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from tunedb.families.group_gemm import moe  # noqa: E402
from tunedb.runtime import dispatch  # noqa: E402
from test_group_gemm import _mixtral_block, _stacked_layout  # noqa: E402  (the family's test model)


def _block():
    if not _stacked_layout():
        pytest.skip("no stacked experts in this transformers")
    return _mixtral_block(torch.bfloat16).train()  # a training step's module state


def _out(y):
    return y[0] if isinstance(y, tuple) else y


def test_a_training_step_through_swapped_experts_gets_the_models_gradients(monkeypatch):
    real = dispatch.call
    served = []

    def kernel_like(*args, **kwargs):
        served.append(args[0])
        return real(*args, **kwargs).detach()

    monkeypatch.setattr(dispatch, "call", kernel_like)
    plain = _block()
    swapped = copy.deepcopy(plain)
    assert moe.swap_experts(swapped) == ["experts"]
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    try:
        _out(plain(x)).float().square().sum().backward()
        _out(swapped(x)).float().square().sum().backward()
        for (name, p), q in zip(plain.named_parameters(), swapped.parameters()):
            assert q.grad is not None, name
            torch.testing.assert_close(q.grad, p.grad)
        with torch.no_grad():
            _out(swapped(x))
        assert served  # without a wanted gradient the group_gemm call path serves
    finally:
        dispatch.clear()


def test_no_tokens_is_the_models_result():
    plain = _block().eval()
    swapped = copy.deepcopy(plain)
    assert moe.swap_experts(swapped) == ["experts"]
    x = torch.randn(1, 0, 64, dtype=torch.bfloat16)
    try:
        with torch.no_grad():
            want, got = _out(plain(x)), _out(swapped(x))
        assert got.shape == want.shape
    finally:
        dispatch.clear()


def test_the_swapped_block_compiles_whole_and_the_op_checks_its_inputs():
    """Through the tunedb::group_gemm op torch.compile(fullgraph=True) traces the swapped block
    (it failed inside the selection's Python: a lock, lazy imports); an empty batch is empty, and
    an expert id out of range is named in a compiled call too (it read garbage on the CPU)."""
    from tunedb.errors import SignatureError
    from tunedb.families.group_gemm.ops import group_gemm

    block = _block().eval()
    assert moe.swap_experts(block) == ["experts"]
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    try:
        with torch.no_grad():
            want = _out(block(x))
            got = _out(torch.compile(block, fullgraph=True)(x))
        torch.testing.assert_close(got, want, atol=1e-2, rtol=2e-2)  # inductor fuses the bf16 epilogue
        w = torch.randn(4, 16, 8, dtype=torch.bfloat16)
        empty = group_gemm(torch.randn(0, 8, dtype=torch.bfloat16), w, torch.zeros(0, 2, dtype=torch.int32))
        assert empty.shape == (0, 2, 16)
        bad = torch.tensor([[0, 7]], dtype=torch.int32)
        f = torch.compile(lambda a, b, i: group_gemm(a, b, i) + 1, fullgraph=True)
        with pytest.raises(SignatureError, match="7"):
            f(torch.randn(1, 8, dtype=torch.bfloat16), w, bad)
    finally:
        dispatch.clear()


def test_no_token_with_a_gradient_gives_zero_gradients_as_torch_does():
    """A training step where no token reaches the layer (M = 0): the empty result joins the graph,
    and backward gives x, weight and topk_weights zero gradients (it raised "element 0 of tensors
    does not require grad")."""
    from tunedb.families.group_gemm.ops import group_gemm

    w = torch.randn(3, 4, 8, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(0, 8, dtype=torch.bfloat16, requires_grad=True)
    tw = torch.rand(0, 2, requires_grad=True)
    y = group_gemm(x, w, torch.zeros(0, 2, dtype=torch.long), tw)
    assert y.shape == (0, 2, 4) and y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w)) and x.grad.shape == (0, 8) and tw.grad.shape == (0, 2)
