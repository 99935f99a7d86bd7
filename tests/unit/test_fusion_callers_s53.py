"""A fused Linear reached by model code outside its pair's parent (an outer module's
attrgetter("block.fc"), a helper in another file) gives that caller its own output in compiled
and jit-traced code too, as run_by gives it eagerly (session 53's probe: torch.compile and
torch.jit.trace of the whole model handed it the activation's output); the parent's own calls
stay fused in the trace, across a graph break in its forward as well."""
from __future__ import annotations

import copy

import pytest
import torch

import tunedb
from tunedb.families.gemm import fused_pair


@pytest.mark.parametrize("name", ["TapByGetter", "TapByHelper"])
@pytest.mark.parametrize("how", ["eager", "compile", "jit.trace"])
def test_a_caller_outside_the_parent_gets_the_linears_own_output(name, how):
    import fusion_models_s53

    torch.manual_seed(0)
    plain = getattr(fusion_models_s53, name)().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert isinstance(tuned.block.act, fused_pair.FusedActivation)  # fused: the outside call is the risk
    x = torch.randn(2, 8)
    with torch.no_grad():
        if how == "compile":
            torch._dynamo.reset()
            run = torch.compile(tuned, backend="eager")
        elif how == "jit.trace":
            run = torch.jit.trace(tuned, x, check_trace=False)
        else:
            run = tuned
        torch.testing.assert_close(run(x), plain(x), rtol=0, atol=0)


def test_the_parents_own_calls_stay_fused_in_the_trace_across_a_graph_break(monkeypatch):
    from fusion_models_s53 import Stack

    seen = []
    real = fused_pair.called_by_parent

    def spy(kind):
        seen.append((kind.split("|")[0].rsplit(".", 1)[1], real(kind)))
        return seen[-1][1]

    spy._dynamo_marked_constant = True
    monkeypatch.setattr(fused_pair, "called_by_parent", spy)
    torch.manual_seed(0)
    plain = Stack().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert all(isinstance(b.act, fused_pair.FusedActivation) for b in tuned.blocks)
    torch._dynamo.reset()
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(tuned, backend="eager")(x), plain(x), rtol=0, atol=0)
    # both sides of both pairs asked in the traces (BrokenBlock's from its resumed forward): fused
    assert set(seen) == {("Block", True), ("BrokenBlock", True)}


def test_a_resume_function_of_another_class_is_not_the_parents_code():
    from fusion_models_s53 import BrokenBlock, TapByGetter

    from tunedb.families.gemm import callers

    fake = compile("pass", BrokenBlock.forward.__code__.co_filename, "exec").replace(
        co_name=f"torch_dynamo_resume_in_forward_at_{BrokenBlock.forward.__code__.co_firstlineno + 3}")
    assert callers.resumes(fake, BrokenBlock)
    assert not callers.resumes(fake, TapByGetter)  # the same file and name, another method's lines


def test_jit_trace_runs_and_keeps_a_forward_set_on_a_swapped_linears_instance():
    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).eval()

    plain, tuned = build(), tunedb.optimize(build(), families="all")
    for m in (plain, tuned):  # as accelerate's add_hook_to_module wraps it
        orig = m[0].forward
        m[0].forward = lambda x, orig=orig: orig(x) * 2
    x = torch.randn(3, 8)
    with torch.no_grad():
        traced = torch.jit.trace(tuned, x, check_trace=False)
        torch.testing.assert_close(traced(x), plain(x), rtol=0, atol=0)
        assert "forward" in tuned[0].__dict__
        torch.testing.assert_close(tuned(x), plain(x), rtol=0, atol=0)
