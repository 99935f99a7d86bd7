"""What a user does with a model after optimize(): module surgery (a LoRA-style wrapper or a new
Linear set in a fused Linear's slot, a new activation, a hook added later), copying one layer,
torch.fx.symbolic_trace (FX quantization, feature extraction), nested tensors, complex weights.
Each gives what the plain model gives."""
from __future__ import annotations

import copy
import pickle
from typing import Tuple

import pytest
import torch
from torch import nn

from fusion_models_s40 import EveryFamily, FusedMLP, LoraLike
from tunedb.families.gemm.patching import TunedLinear, optimize

pytestmark = pytest.mark.usefixtures("swap_unmeasured")


def _pair(seed=0):
    torch.manual_seed(seed)
    plain = FusedMLP().eval()
    tuned = optimize(copy.deepcopy(plain))
    fc1 = tuned._modules["fc1"]
    assert type(fc1) is TunedLinear and fc1.__dict__["act"] == "gelu"  # fused: what the tests below undo
    assert isinstance(tuned._modules["act"], nn.Identity)
    return plain, tuned


def _same(plain, tuned, x):
    with torch.no_grad():
        want, got = plain(x), tuned(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _set(model, name, module):
    model._modules[name] = module


@pytest.mark.parametrize("surgery", ["new linear", "lora wrapper", "new activation", "activation removed"])
def test_module_surgery_after_optimize_gives_the_plain_result(surgery):
    plain, tuned = _pair()
    x = torch.randn(3, 16)
    for model in (plain, tuned):
        torch.manual_seed(1)
        old = model._modules["fc1"]
        if surgery == "new linear":
            _set(model, "fc1", nn.Linear(16, 32))
        elif surgery == "lora wrapper":
            _set(model, "fc1", LoraLike(old, 16, 32))
        elif surgery == "new activation":
            _set(model, "act", nn.ReLU())
        else:
            _set(model, "act", nn.Identity())
    _same(plain, tuned, x)


def test_a_hook_added_after_optimize_sees_the_linears_own_output():
    plain, tuned = _pair()
    x = torch.randn(3, 16)
    seen = {}
    for name, model in (("plain", plain), ("tuned", tuned)):
        model._modules["fc1"].register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o.clone()))
    _same(plain, tuned, x)
    torch.testing.assert_close(seen["tuned"], seen["plain"], rtol=0, atol=0)
    assert (seen["plain"] < 0).any()  # the pre-activation, not GELU's output


def test_a_hook_on_the_activations_slot_sees_its_input():
    plain, tuned = _pair()
    x = torch.randn(3, 16)
    seen = {}
    for name, model in (("plain", plain), ("tuned", tuned)):
        model._modules["act"].register_forward_pre_hook(lambda m, i, name=name: seen.__setitem__(name, i[0].clone()))
    _same(plain, tuned, x)
    torch.testing.assert_close(seen["tuned"], seen["plain"], rtol=0, atol=0)


def test_copies_keep_or_drop_the_fusion_as_the_slots_do():
    plain, tuned = _pair()
    x = torch.randn(3, 16)
    for copied in (copy.deepcopy(tuned), pickle.loads(pickle.dumps(tuned))):
        assert copied._modules["fc1"].__dict__["_tunedb_fused"].intact()  # the whole model: still fused
        _same(plain, copied, x)
    alone = copy.deepcopy(tuned._modules["fc1"])  # one layer copied: a Linear, as nn.Linear's copy is
    with torch.no_grad():
        torch.testing.assert_close(alone(x), plain._modules["fc1"](x), rtol=0, atol=0)
    _same(plain, tuned, x)  # the original is untouched


def test_symbolic_trace_records_the_plain_forms_of_every_family():
    import tunedb

    torch.manual_seed(0)
    plain = EveryFamily().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    kinds = {type(m).__name__ for m in tuned.modules()}
    assert {"TunedConv2d", "TunedConv1d", "TunedLSTM", "TunedLinear", "TunedLinearLogSoftmax"} <= kinds, kinds
    x = torch.randn(2, 1, 9, 9)
    traced = torch.fx.symbolic_trace(tuned)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), plain(x), rtol=1e-5, atol=1e-5)
    assert any(n.op == "call_module" and n.target == "lstm" for n in traced.graph.nodes)


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_nested_tensors_run_as_through_nn_linear(layout):
    plain, tuned = _pair()
    for name, width in (("fc1", 16), ("fc2", 32)):  # fused with GELU, and not
        parts = [torch.randn(3, width), torch.randn(5, width)]
        with torch.no_grad():
            want = plain._modules[name](torch.nested.nested_tensor(parts, layout=layout))
            got = tuned._modules[name](torch.nested.nested_tensor(parts, layout=layout))
        # called alone (not by its block's forward), fused fc1 gives nn.Linear's output too (session 50)
        for a, b in zip(got.unbind(), want.unbind()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_non_tensor_input_raises_nn_linears_own_type_error():
    _, tuned = _pair()
    with pytest.raises(TypeError):
        tuned._modules["fc2"]([1.0] * 32)


def test_complex_gradients_are_the_conjugate_ones():
    from tunedb.families.gemm import ops

    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.complex128, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.complex128, requires_grad=True)
    b = torch.randn(5, dtype=torch.complex128, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: ops.gemm_act(x, w, b, "none"), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: ops.gemm(x, w), (x, w))


def _noop_hook(module: nn.Module, inputs: Tuple[torch.Tensor], output: torch.Tensor) -> None:
    return None  # a hook TorchScript compiles (torch.jit.script scripts a module's hooks)


@pytest.mark.parametrize("surgery", ["none", "hook on the linear", "lora wrapper"])
def test_torch_jit_script_and_trace_give_the_plain_result_and_leave_the_model_as_it_was(surgery):
    plain, tuned = _pair()
    x = torch.randn(3, 16)
    for model in (plain, tuned):
        if surgery == "hook on the linear":
            model._modules["fc1"].register_forward_hook(_noop_hook)
        elif surgery == "lora wrapper":
            torch.manual_seed(1)
            _set(model, "fc1", LoraLike(model._modules["fc1"], 16, 32))
    with torch.no_grad():
        want = plain(x)
        for compiled in (torch.jit.script(tuned), torch.jit.trace(tuned, x, check_trace=False)):
            torch.testing.assert_close(compiled(x), want, rtol=1e-6, atol=1e-6)
        assert type(tuned._modules["act"]).__name__ == "FusedActivation"  # scripting replaced nothing
        torch.testing.assert_close(tuned(x), want, rtol=0, atol=0)



@pytest.mark.parametrize("surgery", ["new activation", "activation dropped", "hook on the conv"])
def test_a_fused_conv2d_unfuses_after_surgery_too(surgery):
    import tunedb

    torch.manual_seed(0)
    plain = EveryFamily().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned.c2[0]).__name__ == "TunedConv2d" and type(tuned.c2[1]).__name__ == "FusedActivation"
    seen = {}
    for name, model in (("plain", plain), ("tuned", tuned)):
        if surgery == "new activation":
            model.c2[1] = nn.Tanh()
        elif surgery == "activation dropped":
            model.c2[1] = nn.Identity()
        else:
            model.c2[0].register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o.min().item()))
    x = torch.randn(2, 1, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), plain(x), rtol=1e-5, atol=1e-5)
    if seen:
        assert seen["tuned"] == pytest.approx(seen["plain"]) and seen["plain"] < 0  # the conv's own output


def test_a_dropped_fused_model_is_freed_without_the_cyclic_gc():
    import gc
    import weakref

    _, tuned = _pair()
    weight = weakref.ref(tuned._modules["fc1"].weight)
    gc.disable()
    try:
        del tuned
        assert weight() is None  # the pair holds the parent, Linear and slot weakly: no cycle
    finally:
        gc.enable()


def test_prewarm_of_a_compiled_model_finds_the_points_of_the_model_it_wraps():
    import tunedb
    from tunedb.errors import UncoveredShapeError

    model = tunedb.optimize(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(torch.bfloat16))
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    compiled = torch.compile(model)  # never called: prewarm records the wrapped module eagerly
    eager = tunedb.prewarm(model, (x,), budget_s=0)
    assert eager.points  # bf16 GEMMs no table measured
    got = tunedb.prewarm(compiled, (x,), budget_s=0)
    assert got.points == eager.points
    with pytest.raises(UncoveredShapeError):
        tunedb.prewarm(compiled, (x,), budget_s=0, strict=True)


def test_the_conv1d_norm_activation_triple_unfuses_for_a_hook_and_is_freed_without_the_gc():
    import gc
    import weakref

    import tunedb

    torch.manual_seed(0)
    plain = EveryFamily().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert type(tuned.c1[1]).__name__ == "AbsorbedBatchNorm1d"
    seen = {}
    for name, model in (("plain", plain), ("tuned", tuned)):
        model.c1[0].register_forward_hook(lambda m, i, o, name=name: seen.__setitem__(name, o.clone()))
    x = torch.randn(2, 1, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), plain(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(seen["tuned"], seen["plain"], rtol=1e-5, atol=1e-5)  # the conv's own output
    fusion = tuned.c1[0].__dict__["_tunedb_fusion"]
    old_state = {"seq": tuned.c1, "names": fusion.names, "conv": tuned.c1[0], "bn": tuned.c1[1],
                 "act": tuned.c1[2], "cache": None}  # a _Fusion pickled before session 40
    restored = fusion.__class__.__new__(fusion.__class__)
    restored.__setstate__(old_state)
    assert restored.conv is tuned.c1[0] and restored.names == fusion.names
    fresh = tunedb.optimize(copy.deepcopy(plain), families="all")
    weight = weakref.ref(fresh.c1[0].weight)
    gc.disable()
    try:
        del fresh
        assert weight() is None
    finally:
        gc.enable()
