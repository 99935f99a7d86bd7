"""A fused pair's caller rule reads the parent class's code when optimize() fuses the pair: a
forward patched onto the class afterwards (a fused-SwiGLU patch that applies the activation itself,
`h = self.fc(x); return self.act(h) + h`) is another caller, and the Linear must give its own
output there, not the fused one."""
from __future__ import annotations

import copy

import torch

import tunedb


def test_a_forward_patched_onto_the_class_after_optimize_gets_plain_outputs():
    from fusion_models_s51 import PatchedLater

    torch.manual_seed(0)
    plain = PatchedLater().eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), families="all")
    assert tuned.fc.__dict__.get("act") == "gelu"  # fused
    original = PatchedLater.forward

    def patched(self, x):
        h = self.fc(x)
        return self.act(h) + h

    PatchedLater.forward = patched
    try:
        x = torch.randn(4, 16)
        with torch.no_grad():
            assert torch.equal(tuned(x), plain(x))
    finally:
        PatchedLater.forward = original
    with torch.no_grad():
        assert torch.equal(tuned(x), plain(x))  # its own forward again: fused, plain's bits on the CPU
