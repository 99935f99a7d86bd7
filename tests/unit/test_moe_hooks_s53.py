"""A hook on the experts' activation module (registered after optimize(), to collect or change
activations) sees what the plain model hands it: the swapped experts run the model's own forward
while one watches (session 53's probe: it saw [T, k, I] in slot order, and an output-changing
hook changed the logits)."""
from __future__ import annotations

import pytest
import torch

import tunedb

T = pytest.importorskip("transformers")


def _mixtral():
    T.logging.set_verbosity_error()
    cfg = T.MixtralConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                          vocab_size=100, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    m = T.MixtralForCausalLM(cfg)
    m.config._attn_implementation = "eager"
    return m.bfloat16().eval()


def test_a_hook_on_the_experts_activation_sees_and_changes_what_it_does_on_the_plain_model():
    ids = torch.randint(0, 100, (2, 9))
    seen, logits = {}, {}
    for name, m in (("plain", _mixtral()), ("tuned", tunedb.optimize(_mixtral(), families="all"))):
        experts = m.model.layers[0].mlp.experts
        assert ("forward" in experts.__dict__) == (name == "tuned")  # swapped: moe.tuned_forward

        def hook(mod, i, o, name=name):
            seen.setdefault(name, o.detach().clone())
            return o - o.mean(-2, keepdim=True)

        experts.act_fn.register_forward_hook(hook)
        with torch.no_grad():
            logits[name] = m(ids).logits
    assert seen["tuned"].shape == seen["plain"].shape
    assert torch.equal(seen["tuned"], seen["plain"])
    assert torch.equal(logits["tuned"], logits["plain"])
