"""A setting changed on the fused activation module itself after optimize() (found by a walk of
model.modules(), as code that turns every GELU to its tanh form does: no slot sees the write)
unfuses the pair for good, so the model gives what the plain model gives with that setting."""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import tunedb
from tunedb.families.gemm.fused_pair import FusedActivation


def _fused_mlp(approximate: str = "tanh"):
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(approximate=approximate),
                                torch.nn.Linear(32, 16)).eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert isinstance(tuned[1], FusedActivation)
    return plain, tuned


def _set_every_gelu(model: torch.nn.Module, approximate: str) -> None:
    for m in model.modules():
        if isinstance(m, torch.nn.GELU):
            m.approximate = approximate


@pytest.mark.parametrize("start,new", [("tanh", "none"), ("none", "tanh")])
def test_a_setting_changed_through_model_modules_gives_the_plain_output(start, new):
    plain, tuned = _fused_mlp(start)
    pair = tuned[1].__dict__["_tunedb_fused"]
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.allclose(tuned(x), plain(x), atol=1e-5)
        _set_every_gelu(plain, new)
        _set_every_gelu(tuned, new)
        assert torch.equal(tuned(x), plain(x))
    assert not pair.intact() and pair.shared  # for good: setting it back keeps it unfused
    _set_every_gelu(tuned, start)
    assert not pair.intact()


def test_a_copy_or_pickle_made_before_anything_ran_keeps_the_fused_setting_to_compare():
    plain, tuned = _fused_mlp("tanh")
    _set_every_gelu(plain, "none")
    _set_every_gelu(tuned, "none")
    x = torch.randn(4, 16)
    buf = io.BytesIO()
    torch.save(tuned, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        for m in (copy.deepcopy(tuned), pickle.loads(pickle.dumps(tuned)), loaded):
            assert torch.equal(m(x), plain(x))


def test_an_inplace_flag_or_the_same_value_keeps_the_pair():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    pair = tuned[1].__dict__["_tunedb_fused"]
    tuned[1].activation.inplace = True  # where it writes, not what: the fused kernel still matches
    assert pair.intact()
    _, tuned = _fused_mlp("tanh")
    pair = tuned[1].__dict__["_tunedb_fused"]
    _set_every_gelu(tuned, "tanh")
    assert pair.intact()


def test_a_compiled_model_retraces_after_the_setting_changes():
    # the slot's trace reads the setting (a guard): the retrace asks intact() again, which unfuses
    # the pair (on the CPU the trace applies the module either way; on CUDA the Linear's kernel would not)
    torch._dynamo.reset()
    plain, tuned = _fused_mlp("tanh")
    pair = tuned[1].__dict__["_tunedb_fused"]
    compiled = torch.compile(tuned, backend="eager")
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.allclose(compiled(x), plain(x), atol=1e-5)
        assert not pair.shared
        _set_every_gelu(plain, "none")
        _set_every_gelu(tuned, "none")
        assert torch.allclose(compiled(x), plain(x), atol=1e-6)
        assert pair.shared  # found by the retrace, before anything asked eagerly


def test_a_forward_set_on_the_activation_instance_unfuses_the_pair():
    import types

    _, tuned = _fused_mlp("tanh")
    pair = tuned[1].__dict__["_tunedb_fused"]
    act = tuned[1].activation
    act.forward = types.MethodType(lambda self, x: torch.tanh(x), act)  # a patch found by model.modules()
    assert not pair.intact()
