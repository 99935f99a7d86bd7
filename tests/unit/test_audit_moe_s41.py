"""s41 audit of the MoE / grouped-GEMM family as optimize() applies it: experts modules that are
not transformers' generic experts forward must run as the model wrote them (models in
audit_moe_models_s41.py: optimize() reads each model class's source file)."""
from __future__ import annotations

import copy

import pytest
import torch

import tunedb

import audit_moe_models_s41 as M  # (see the module docstring)

transformers = pytest.importorskip("transformers")


def _swapped(model):
    return [n for n, mod in model.named_modules() if getattr(mod, "_tunedb_group_gemm", False)]


class _Wrap(torch.nn.Module):
    def __init__(self, moe):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.moe = moe

    def forward(self, x):
        return self.moe(self.norm(x))


@pytest.mark.parametrize("families", ["all", ["group_gemm"]])
@pytest.mark.parametrize("build", [
    lambda: _Wrap(M.FusedMoE()),                 # forward(x): crashed (tuned_forward wants 3 arguments)
    lambda: M.Block(M.UpGateExperts()),           # up rows first: silently wrong
    lambda: M.Block(M.BiasedExperts()),           # biases: silently dropped
    lambda: M.Block(M.UpGateExperts(), mode="deepseek", k=1),
], ids=["fused_block", "up_gate", "biased", "up_gate_deepseek_top1"])
def test_user_experts_named_like_transformers_keep_their_outputs(build, families, swap_unmeasured):
    torch.manual_seed(0)
    model = build().to(torch.bfloat16).eval()
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
        opt = tunedb.optimize(copy.deepcopy(model), families=families)
        got = opt(x)
    assert _swapped(opt) == []
    assert torch.equal(got, ref)


def _run_experts(experts, k=2, e=4, h=16, scale=3.0):
    from tunedb.families.group_gemm import moe

    torch.manual_seed(0)
    experts = experts.to(torch.bfloat16)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=1.0)
    parent = torch.nn.Module()
    parent.top_k = k
    parent.experts = experts
    x = torch.randn(6, h, dtype=torch.bfloat16) * scale
    idx = torch.stack([torch.randperm(e)[:k] for _ in range(6)])
    w = torch.rand(6, k).to(torch.bfloat16)
    with torch.no_grad():
        ref = experts(x, idx, w)
        swapped = moe.swap_experts(parent)
        got = experts(x, idx, w)
    return swapped, got, ref


def test_experts_with_their_own_gate_are_not_swapped():
    """DeepSeek-V4's experts clamp gate and up in their _apply_gate (so do Step3p7, GLM-5-Next,
    MiniMax-M3): the swap's act(gate) * up dropped the clamp (relative error ~180 here)."""
    mod = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    cfg = transformers.DeepseekV4Config()
    cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts, cfg.swiglu_limit = 16, 8, 4, 1.0
    swapped, got, ref = _run_experts(mod.DeepseekV4Experts(cfg))
    assert swapped == []
    assert torch.equal(got, ref)


def test_experts_with_a_post_expert_norm_are_not_swapped():
    mod = pytest.importorskip("transformers.models.muse_spark.modeling_muse_spark")
    cfg = transformers.MuseSparkConfig().get_text_config()
    cfg.moe_hidden_size, cfg.moe_intermediate_size, cfg.num_local_experts = 16, 8, 4
    swapped, got, ref = _run_experts(mod.MuseSparkExperts(cfg))
    assert swapped == []
    assert torch.equal(got, ref)


def test_swapped_experts_under_expert_parallelism_skip_the_sentinel_id():
    """Expert parallelism marks the experts `_is_expert_parallel` and routes non-local slots to
    id E, which transformers' forward skips; the swapped forward raised SignatureError."""
    mod = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    cfg = transformers.MixtralConfig(hidden_size=16, intermediate_size=8, num_local_experts=4, num_experts_per_tok=2)
    cfg._experts_implementation = "eager"
    experts = mod.MixtralExperts(cfg).to(torch.bfloat16)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.5)
    parent = torch.nn.Module()
    parent.top_k = 2
    parent.experts = experts
    from tunedb.families.group_gemm import moe

    assert moe.swap_experts(parent) == ["experts"]  # the generic experts are still the family's
    experts._is_expert_parallel = True
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 4], [4, 2], [1, 3]])
    w = torch.rand(3, 2).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(experts(x, idx, w), type(experts).forward(experts, x, idx, w))
