"""optimize() of a model part of which was optimized before (an encoder first, then the whole model;
the re-run prewarm / autotune / swap_left make) fuses a Linear + activation pair as on a fresh
model. Session 55 probe: the source rule read tunedb's own FusedActivation class among the model's
classes, found it reaching into its pair, and refused every class-rule fusion of the model."""
from __future__ import annotations

import copy

import torch
from torch import nn

import tunedb
from tunedb.families.gemm.fusion_source import model_outside_reads, model_reached_reads


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.fc1 = nn.Linear(32, 32)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.fc1(self.ff(x)))


def test_a_part_optimized_first_leaves_the_source_rule_as_on_a_fresh_model():
    fresh = _Block().eval()
    before = (model_reached_reads(fresh), model_outside_reads(fresh))
    tunedb.optimize(fresh.ff, families="all")
    assert (model_reached_reads(fresh), model_outside_reads(fresh)) == before


def test_the_parent_fuses_its_pair_after_a_part_was_optimized():
    torch.manual_seed(0)
    plain = _Block().eval()
    direct = tunedb.optimize(copy.deepcopy(plain), families="all")
    staged = copy.deepcopy(plain)
    tunedb.optimize(staged.ff, families="all")
    tunedb.optimize(staged, families="all")
    assert type(staged.act) is type(direct.act) and type(direct.act) is not nn.SiLU  # the fused slot
    assert staged.fc1.act == direct.fc1.act == "silu"
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert torch.equal(staged(x), plain(x)) and torch.equal(direct(x), plain(x))
