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


def _block():
    if getattr(transformers.models.mixtral.modeling_mixtral, "MixtralExperts", None) is None:
        pytest.skip("no stacked experts in this transformers")
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
                                     num_hidden_layers=1, vocab_size=64, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(1)
    block = transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock(cfg)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.1)
    if hasattr(block.experts, "config"):
        block.experts.config._experts_implementation = "eager"
    return block.to(torch.bfloat16)


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
