"""Fusion rule 2 fuses a Linear with the activation after it only where the class's code reaches
its children as `self.<name>`: a class that hands `self` to other code or takes its children
whole may run the Linear a second time, and that caller must get the Linear's own output, not
the activation's (session 52's probe: a tapped feature came back through GELU). And the slot a
fused activation leaves reads and writes the activation's settings as the plain module did."""
from __future__ import annotations

import copy

import pytest
import torch

import tunedb
from tunedb.families.gemm.fused_pair import FusedActivation

TAPS = ("TapByPath", "TapByGetter", "TapByVars", "TapByDict", "TapByHelper", "TapByGetattrModules")


@pytest.mark.parametrize("name", TAPS)
def test_a_second_use_reached_by_a_computed_path_gets_the_linears_own_output(name):
    import fusion_models_s52

    torch.manual_seed(0)
    plain = getattr(fusion_models_s52, name)().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    x = torch.randn(3, 16)
    with torch.no_grad():
        (out_p, tap_p), (out_t, tap_t) = plain(x), tuned(x)
    assert torch.equal(out_t, out_p) and torch.equal(tap_t, tap_p)
    assert not isinstance(tuned.act, FusedActivation)  # not fused at all


def test_a_block_that_names_its_children_only_as_attributes_still_fuses():
    from fusion_models_s52 import PlainPair

    tuned = tunedb.optimize(PlainPair().eval(), families="all")
    assert isinstance(tuned.act, FusedActivation) and tuned.proj.__dict__.get("act") == "gelu"


def _fused_mlp():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(approximate="tanh"),
                                torch.nn.Linear(32, 16)).eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert isinstance(tuned[1], FusedActivation)
    return plain, tuned


def test_the_slot_reads_the_activations_settings():
    _, tuned = _fused_mlp()
    assert tuned[1].approximate == "tanh"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tuned[1].nothing  # noqa: B018


def test_changing_the_activations_setting_after_optimize_changes_the_output_as_plain():
    plain, tuned = _fused_mlp()
    pair = tuned[1].__dict__["_tunedb_fused"]
    assert pair.intact()
    plain[1].approximate = "none"
    tuned[1].approximate = "none"
    assert tuned[1].activation.approximate == "none"
    assert not pair.intact()  # the fused kernel applied tanh: the pair is unfused for good
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(tuned(x), plain(x))
        assert torch.equal(copy.deepcopy(tuned)(x), plain(x))


def test_writing_the_same_setting_or_a_new_attribute_keeps_the_pair():
    _, tuned = _fused_mlp()
    pair = tuned[1].__dict__["_tunedb_fused"]
    tuned[1].approximate = "tanh"
    tuned[1].note = "mine"  # not the activation's: the slot's own
    assert pair.intact() and tuned[1].note == "mine" and "note" not in tuned[1].activation.__dict__


def test_the_report_counts_no_head_another_family_swapped_and_says_when_a_model_was_cast():
    # the GEMM family left the head's Linear as written (fp32 on the CPU); gemm_log_softmax then
    # swapped it: it is not a Linear left as written any more
    from tunedb.runtime import report

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                            torch.nn.Sequential(torch.nn.Linear(16, 50), torch.nn.LogSoftmax(-1)))
    tuned = tunedb.optimize(m)
    assert type(tuned[2][0]).__name__ == "TunedLinearLogSoftmax"
    keys, why = report.left_as_written(tuned)
    assert len(keys) == 1 and "1 of them hold float32" in why
    tuned.half()
    keys, why = report.left_as_written(tuned)
    assert len(keys) == 1 and "cast to float16 since optimize()" in why and "float32" not in why


def test_the_report_counts_left_linears_that_a_sibling_group_replaced():
    # siblings.attach swaps left q/k/v Linears for members carrying their marks: all still count
    from tunedb.runtime import report

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(32, 32) for _ in range(3))

        def forward(self, x):
            return self.q(x) + self.k(x) + self.v(x)

    model = torch.nn.Sequential(Attn(), Attn())
    tuned = tunedb.optimize(model)  # fp32 on the CPU: every Linear left as written
    keys, _why = report.left_as_written(tuned)
    assert len(keys) == 6 == len(report.left_in(tuned))
