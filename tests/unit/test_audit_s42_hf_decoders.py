"""Session 42 audit: transformers decoder-only LMs (tiny configs, random weights) through optimize().

What a user relies on, per architecture, with optimize(model) and optimize(model, families="all"):
logits bitwise the plain model's on the CPU (fp32 and bf16), greedy generate() with and without
the KV cache, a training step's gradients, save_pretrained/from_pretrained, state_dict keys,
deepcopy and pickle, tuning_report(), and the census of such a model.

Bug found: transformers 5.x runs MoE experts through its `grouped_mm` form by default, which
weights each slot in the promoted dtype (Mixtral's router keeps fp32 weights) and rounds once
after the sum over k; the swapped experts (group_gemm) rounded each weighted slot to bf16 first,
so a bf16 Mixtral's logits differed from plain (3.9e-3). Its `eager` form rounds every index_add_
in expert order, which a sum over k > 2 did not (group_gemm/moe.py, tuned_forward).
"""
from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch

import tunedb
from audit_hf_decoders_s42 import CONFIGS, build, ids

pytestmark = pytest.mark.usefixtures("swap_unmeasured")  # the Linears swap too: the harder case

ARCHS = list(CONFIGS)
FAMILIES = [None, "all"]
DTYPES = [torch.float32, torch.bfloat16]


def _opt(model, families):
    return tunedb.optimize(copy.deepcopy(model), **({} if families is None else {"families": families}))


def _swapped(plain, tuned):
    """optimize() replaced something (else the comparison proves nothing)."""
    return any(type(a) is not type(b) or "forward" in vars(b)
               for a, b in zip(plain.modules(), tuned.modules()))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_greedy_generation_are_the_plain_models(arch, dtype):
    plain = build(arch, dtype)
    x = ids()
    with torch.no_grad():
        want = plain(x).logits
    for families in FAMILIES:
        tuned = _opt(plain, families)
        assert _swapped(plain, tuned)
        with torch.no_grad():
            assert torch.equal(tuned(x).logits, want), (arch, families)
    # generate with families="all" (the most modules swapped), KV cache on and off
    for use_cache in (True, False):
        kw = dict(max_new_tokens=5, do_sample=False, use_cache=use_cache)
        assert torch.equal(tuned.generate(x, **kw), plain.generate(x, **kw)), (arch, use_cache)


def _grads(model, x):
    model.train()
    torch.manual_seed(1)  # the same dropout masks (GPT-2 and OPT configs keep dropout on)
    out = model(x, labels=x)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ARCHS)
def test_a_training_step_gives_the_plain_gradients(arch):
    plain = build(arch)
    x = ids(seed=1)
    tuned = _opt(plain, "all")
    loss_p, grads_p = _grads(plain, x)
    loss_t, grads_t = _grads(tuned, x)
    assert torch.equal(loss_t, loss_p)
    assert grads_t.keys() == grads_p.keys()
    assert [n for n in grads_p if not torch.equal(grads_t[n], grads_p[n])] == []


@pytest.mark.parametrize("arch, dtype", [("gpt2", torch.float32), ("gptj", torch.bfloat16), ("falcon", torch.float32),
                                         ("gemma2", torch.float32), ("mamba", torch.float32),
                                         ("recurrent_gemma", torch.bfloat16), ("mixtral", torch.bfloat16)])
def test_save_reload_state_dict_deepcopy_and_pickle(arch, dtype, tmp_path):
    plain = build(arch, dtype)
    tuned = _opt(plain, "all")
    x = ids()
    assert list(tuned.state_dict()) == list(plain.state_dict())
    plain.save_pretrained(tmp_path / "plain")
    tuned.save_pretrained(tmp_path / "tuned")
    kw = dict(attn_implementation="eager", dtype=dtype)
    # compared with the plain model's own round trip: GPT-J rebuilds its rotary table on load
    reloaded_p = type(plain).from_pretrained(tmp_path / "plain", **kw).eval()
    reloaded_t = type(plain).from_pretrained(tmp_path / "tuned", **kw).eval()
    with torch.no_grad():
        assert torch.equal(reloaded_t(x).logits, reloaded_p(x).logits)
        want = plain(x).logits
        assert torch.equal(copy.deepcopy(tuned)(x).logits, want)
        assert torch.equal(pickle.loads(pickle.dumps(tuned))(x).logits, want)
    report = tunedb.tuning_report()
    assert isinstance(report, str) and report


def test_bf16_mixtral_experts_are_swapped_and_keep_the_grouped_mm_numerics():
    """The default (grouped_mm) experts form with the router's fp32 weights: the case that differed."""
    plain = build("mixtral", torch.bfloat16)
    assert plain.config._experts_implementation != "eager"
    tuned = _opt(plain, None)
    assert getattr(tuned.model.layers[0].mlp.experts, "_tunedb_group_gemm", False)
    x = ids(batch=3, length=9, seed=2)
    with torch.no_grad():
        assert torch.equal(tuned(x).logits, plain(x).logits)


@pytest.mark.parametrize("impl", ["eager", "grouped_mm", "batched_mm"])
@pytest.mark.parametrize("top_k", [2, 3])
@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16], ids=["fp32-weights", "bf16-weights"])
def test_swapped_experts_compute_each_transformers_form(impl, top_k, weights):
    """Each experts implementation a config can name, top-2 and top-3, fp32 or bf16 routing weights."""
    transformers = pytest.importorskip("transformers")
    mod = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    from tunedb.families.group_gemm import moe

    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_local_experts=4,
                                     num_experts_per_tok=top_k)
    cfg._experts_implementation = impl
    torch.manual_seed(0)
    experts = mod.MixtralExperts(cfg).to(torch.bfloat16)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.5)
    parent = torch.nn.Module()
    parent.top_k, parent.experts = top_k, experts
    want_fn = type(experts).forward
    assert moe.swap_experts(parent) == ["experts"]
    x = torch.randn(12, 64, dtype=torch.bfloat16)
    idx = torch.stack([torch.randperm(4)[:top_k] for _ in range(12)])
    w = torch.rand(12, top_k).softmax(-1).to(weights)
    with torch.no_grad():
        assert torch.equal(experts(x, idx, w), want_fn(experts, x, idx, w))


def test_census_of_a_transformers_lm(tmp_path):
    """`tunedb census mod:make --unit tokens`: on meta tensors transformers' mask builder reads
    values, which the census says in one error naming --device cpu; on the CPU it records the
    model's GEMMs, fused as optimize() calls them."""
    from tunedb.census.presets import TEXT, workload
    from tunedb.census.probe import take_census
    from tunedb.errors import CensusError

    w = workload("audit_hf_decoders_s42:census_gpt2", unit=TEXT, max_length=8)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"tokens": n}) + "\n" for n in (4, 8)))
    with pytest.raises(CensusError, match="--device cpu"):
        take_census(w, "offline", 1, manifest=manifest, fused=True)
    census = take_census(w, "offline", 1, manifest=manifest, fused=True, device="cpu")
    sigs = {p.signature.format() for p in census.points}
    assert census.points and all(p.m >= 1 for p in census.points)
    assert any("N=256" in s for s in sigs), sigs  # the LM head (vocab 256)
