"""A fused pair (Linear + activation, Linear + LogSoftmax, conv + norm + activation) runs fused only
when its modules are called by the parent's own code: a child called by other code (`head[0](h)`,
a loop over a Sequential collecting each output) gives that module's own output, and a module
deleted after optimize() leaves the rest running as the plain model does."""
from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

import tunedb
from tunedb.families.gemm import fused_pair, siblings_compile


def _pairs():
    torch.manual_seed(0)
    return [
        ("glsm", nn.Sequential(nn.Linear(8, 5), nn.LogSoftmax(dim=-1)), torch.randn(3, 8)),
        ("linear+relu", nn.Sequential(nn.Linear(8, 5), nn.ReLU()), torch.randn(3, 8)),
        ("linear+gelu", nn.Sequential(nn.Linear(8, 5), nn.GELU()), torch.randn(3, 8)),
        ("conv2d+relu", nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), torch.randn(1, 1, 6, 6)),
        ("conv1d+bn+silu", nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.BatchNorm1d(4), nn.SiLU()).eval(),
         torch.randn(2, 4, 9)),
    ]


def _optimized(seq):
    plain = copy.deepcopy(seq)
    tunedb.optimize(seq, families="all")
    return plain, seq


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _pairs()])
def test_each_child_called_alone_gives_its_own_output(case):
    _, seq, x = _pairs()[case]
    plain, opt = _optimized(seq)
    assert any(type(m) is not type(p) for m, p in zip(opt, plain))  # something was swapped
    with torch.no_grad():
        torch.testing.assert_close(opt(x), plain(x))
        y, yp = x, x
        for m, p in zip(opt, plain):  # per-layer features, as a feature extractor collects them
            y, yp = m(y), p(yp)
            torch.testing.assert_close(y, yp)
        torch.testing.assert_close(opt[0](x), plain[0](x))  # the logits, not the log-probabilities
        torch.testing.assert_close(opt[-1](plain[-2](x)), plain[-1](plain[-2](x)))  # the last slot applies its module


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _pairs()])
def test_deleting_the_last_module_after_optimize_runs_the_rest_as_written(case):
    _, seq, x = _pairs()[case]
    plain, opt = _optimized(seq)
    del opt[len(opt) - 1]
    del plain[len(plain) - 1]
    with torch.no_grad():
        torch.testing.assert_close(opt(x), plain(x))
    opt2 = _optimized(_pairs()[case][1])[1]
    opt2.pop(len(opt2) - 1)
    with torch.no_grad():
        torch.testing.assert_close(opt2(x), plain(x))


def _spy(monkeypatch):
    seen = []
    run_by = fused_pair.run_by

    def spy(parent, depth):
        seen.append(run_by(parent, depth + 1))  # one frame more: the spy's own
        return seen[-1]

    monkeypatch.setattr(fused_pair, "run_by", spy)
    return seen


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _pairs()])
def test_the_parents_own_call_still_runs_fused(monkeypatch, case):
    _, seq, x = _pairs()[case]
    _, opt = _optimized(seq)
    seen = _spy(monkeypatch)
    with torch.no_grad():
        opt(x)
    assert seen and all(seen)
    seen.clear()
    with torch.no_grad():
        opt[0](x)
    assert seen == [False]


def test_a_method_class_fusion_asks_its_class_code(monkeypatch):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    torch.manual_seed(0)
    mlp = llama.LlamaMLP(LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                     num_key_value_heads=2))
    plain = copy.deepcopy(mlp)
    tunedb.optimize(mlp, families="all")
    assert type(mlp.act_fn) is fused_pair.FusedActivation
    seen = _spy(monkeypatch)
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), plain(x))
        # the Linear asks; its slot takes the Linear's decision (fused_pair.taken, session 57)
        assert seen == [True]
        seen.clear()
        torch.testing.assert_close(mlp.gate_proj(x), plain.gate_proj(x))  # no SiLU hidden in it
        torch.testing.assert_close(mlp.act_fn(x), plain.act_fn(x))
    assert seen == [False]


def test_class_codes_reach_decorated_and_nested_functions():
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k)
        return wrapper

    class Block(nn.Module):
        @deco
        def forward(self, x):
            inner = lambda t: t
            return inner(x)

        @staticmethod
        def helper(x):
            return x

    codes = fused_pair.class_codes(Block)
    fwd = Block.__dict__["forward"]
    assert {id(fwd.__code__), id(fwd.__wrapped__.__code__), id(Block.helper.__code__)} <= codes
    nested = [c for c in fwd.__wrapped__.__code__.co_consts if hasattr(c, "co_name")]
    assert nested and all(id(c) in codes for c in nested)
    assert id(nn.Module._call_impl.__code__) not in codes


@pytest.mark.parametrize("objects", [True, False])
def test_a_compiled_fused_pair_traces_with_or_without_object_constants(monkeypatch, objects):
    """torch 2.11's Dynamo refuses an object argument to a function marked constant (every compile of
    a model with a fused pair failed on the H100); there the trace reads the pair itself."""
    monkeypatch.setattr(siblings_compile, "_OBJECTS_CONSTANT", [objects])
    torch._dynamo.reset()
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
    plain, opt = _optimized(seq)
    assert type(opt[1]) is fused_pair.FusedActivation
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(opt, backend="eager", fullgraph=True)(x), plain(x))
    torch._dynamo.reset()


def _scriptables():
    torch.manual_seed(0)
    return [
        ("conv1d", nn.Sequential(nn.Conv1d(4, 4, 3)), torch.randn(2, 4, 9)),
        ("conv2d+relu", nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), torch.randn(1, 1, 6, 6)),
        ("conv1d+bn+silu", nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.BatchNorm1d(4), nn.SiLU()).eval(),
         torch.randn(2, 4, 9)),
        ("lstm", nn.Sequential(nn.LSTM(4, 6)), torch.randn(5, 2, 4)),
        ("gru", nn.Sequential(nn.GRU(4, 6, num_layers=2)), torch.randn(5, 2, 4)),
        ("glsm", nn.Sequential(nn.Linear(8, 5), nn.LogSoftmax(dim=-1)), torch.randn(3, 8)),
        ("linear+gelu", nn.Sequential(nn.Linear(8, 5), nn.GELU()), torch.randn(3, 8)),
    ]


@pytest.mark.parametrize("case", range(7), ids=[c[0] for c in _scriptables()])
def test_torch_jit_script_of_an_optimized_model_gives_the_plain_models_output(case):
    _, seq, x = _scriptables()[case]
    plain, opt = _optimized(seq)
    scripted = torch.jit.script(opt)
    with torch.no_grad():
        want = plain(x)
        got, eager_after = scripted(x), opt(x)  # the eager model, whose slots scripting rewrote, too
    if isinstance(want, tuple):
        want, got, eager_after = want[0], got[0], eager_after[0]
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(eager_after, want)
    assert sorted(opt.state_dict()) == sorted(plain.state_dict())


def test_the_fused_head_keeps_the_linears_repr_and_attributes():
    head = nn.Sequential(nn.Linear(8, 5, bias=False), nn.LogSoftmax(dim=-1))
    head[0].my_tag = "keep"
    tunedb.optimize(head, families="all")
    assert "in_features=8, out_features=5, bias=False" in repr(head[0]) and head[0].my_tag == "keep"


@pytest.mark.parametrize("name", ["TapBlock", "DunderBlock", "FirstChildBlock"])
def test_a_block_running_its_linear_by_a_computed_name_is_not_fused(name):
    import fusion_models_s50 as models

    torch.manual_seed(0)
    plain = getattr(models, name)().eval()
    opt = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(opt.act) is not fused_pair.FusedActivation
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(opt(x), plain(x))
    from fusion_models_s40 import FusedMLP  # the rule still fuses the plain form, in a file of its own

    fused = tunedb.optimize(FusedMLP().eval(), families="all")
    assert any(type(m) is fused_pair.FusedActivation for m in fused.modules())


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _pairs()])
@pytest.mark.parametrize("wrapped", [0, -1])
def test_a_forward_wrapped_on_the_instance_unfuses_both_sides(case, wrapped):
    """accelerate's offload hooks set `module.forward` to a wrapper: the wrapper, not the parent,
    calls the module, so the caller rule would unfuse that side only (a lost activation)."""
    _, seq, x = _pairs()[case]
    plain, opt = _optimized(seq)
    module = opt[wrapped]
    inner = module.forward

    def wrapper(*args, **kwargs):
        return inner(*args, **kwargs)

    module.forward = wrapper
    with torch.no_grad():
        torch.testing.assert_close(opt(x), plain(x))


@pytest.mark.parametrize("case", range(5), ids=[c[0] for c in _pairs()])
@pytest.mark.parametrize("side", [0, -1])
def test_one_side_compiled_alone_unfuses_the_pair(case, side):
    """Module.compile() of one side: its trace cannot see who calls it while the other side's
    eager call can (the activation was applied twice in a loop over the children)."""
    _, seq, x = _pairs()[case]
    plain, opt = _optimized(seq)
    torch._dynamo.reset()
    opt[side].compile(backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(opt(x), plain(x))
        y, yp = x, x
        for m, p in zip(opt, plain):
            y, yp = m(y), p(yp)
            torch.testing.assert_close(y, yp)
    torch._dynamo.reset()


def test_jit_trace_keeps_the_fused_activation():
    for _, seq, x in _pairs():
        plain, opt = _optimized(seq)
        with torch.no_grad():
            traced = torch.jit.trace(opt, x, check_trace=False)
            torch.testing.assert_close(traced(x), plain(x))
