"""A Linear carrying a user attribute of a name the swapped layer holds itself (`act`,
`approximate`; session 56 probe): optimize() overwrote it with its own value, and writing it back
broke the forward. Such a Linear is left as it is, its attributes readable and its output torch's."""
from __future__ import annotations

import torch
from torch import nn

import tunedb


def test_a_linear_with_its_own_act_attribute_is_left_as_written():
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    lin.act, lin.approximate = "tag", 0.5
    plain = nn.Sequential(lin, nn.GELU())
    x = torch.randn(2, 8)
    want = plain(x)
    model = tunedb.optimize(plain, families="all", inplace=False)
    assert type(model[0]) is nn.Linear and (model[0].act, model[0].approximate) == ("tag", 0.5)
    assert torch.equal(model(x), want)
    model[0].act = "other"  # the user's attribute, which no forward reads
    assert torch.equal(model(x), want)


def test_a_plain_linear_beside_it_is_still_swapped():
    torch.manual_seed(0)
    tagged = nn.Linear(8, 8)
    tagged.approximate = True
    model = tunedb.optimize(nn.Sequential(tagged, nn.Linear(8, 8)), families="all")
    assert type(model[0]) is nn.Linear and type(model[1]).__name__ == "TunedLinear"
