"""Tiny random-weight transformers causal LMs for the s42 decoder audit (no downloads).

`build(arch, dtype)` returns the plain model in eval mode, or skips the test when this
transformers lacks the architecture. Every config is 2 layers, hidden 64, vocab 256, eager
attention, so a forward costs milliseconds on a CPU.
"""
from __future__ import annotations

import functools

import pytest
import torch

VOCAB = 256
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)

# arch -> (config class name, overrides of _COMMON; None drops a key)
CONFIGS: dict[str, tuple[str, dict]] = {
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, n_inner=128)),
    "gpt_neox": ("GPTNeoXConfig", dict(num_key_value_heads=None)),
    "gptj": ("GPTJConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, rotary_dim=8, n_inner=128)),
    "falcon": ("FalconConfig", dict(num_key_value_heads=None, intermediate_size=None)),
    "phi": ("PhiConfig", dict(num_key_value_heads=None)),
    "phi3": ("Phi3Config", dict()),
    "gemma": ("GemmaConfig", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", dict(head_dim=16)),
    "gemma3_text": ("Gemma3TextConfig", dict(head_dim=16)),
    "mistral": ("MistralConfig", dict()),
    "qwen2": ("Qwen2Config", dict()),
    "qwen3": ("Qwen3Config", dict(head_dim=16)),
    "opt": ("OPTConfig", dict(ffn_dim=128, word_embed_proj_dim=64, intermediate_size=None, num_key_value_heads=None)),
    "bloom": ("BloomConfig", dict(n_head=4, n_layer=2, intermediate_size=None, num_key_value_heads=None)),
    "starcoder2": ("Starcoder2Config", dict()),
    "olmo2": ("Olmo2Config", dict()),
    "granite": ("GraniteConfig", dict()),
    "cohere": ("CohereConfig", dict()),
    "stablelm": ("StableLmConfig", dict()),
    "gpt_bigcode": ("GPTBigCodeConfig", dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, n_inner=128)),
    "mamba": ("MambaConfig", dict(state_size=8, num_attention_heads=None, num_key_value_heads=None)),
    "recurrent_gemma": ("RecurrentGemmaConfig", dict(lru_width=64, attention_window_size=16, head_dim=16,
                                                     num_key_value_heads=1, block_types=["recurrent", "attention"])),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(head_dim=16, num_experts=4, **_MOE)),
}


@functools.lru_cache(maxsize=None)
def _plain(arch: str, dtype: torch.dtype, extra: tuple = ()) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    cls_name, overrides = CONFIGS[arch]
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    kwargs = {**_COMMON, **overrides, **dict(extra)}
    config = cls(**{k: v for k, v in kwargs.items() if v is not None})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
    return model.eval()


def build(arch: str, dtype: torch.dtype = torch.float32, **extra) -> torch.nn.Module:
    """A fresh plain model (a deep copy of the cached one: tests may train or optimize it)."""
    import copy

    return copy.deepcopy(_plain(arch, dtype, tuple(sorted(extra.items()))))


def ids(batch: int = 2, length: int = 6, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=gen)


def census_factory(arch: str):
    """A module:callable workload for `tunedb census` (f(device) -> (model, input_factory)): the
    model built on `device` (meta by default: no weights), called with input_ids only, as a user
    would write it."""
    def make(device):
        transformers = pytest.importorskip("transformers")
        cls_name, overrides = CONFIGS[arch]
        kwargs = {k: v for k, v in {**_COMMON, **overrides}.items() if v is not None}
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls_name)(**kwargs),
                                                                  attn_implementation="eager").eval()
        return model, lambda batch, length: (torch.randint(3, VOCAB, (batch, length), device=device),)
    return make


census_gpt2 = census_factory("gpt2")
census_mistral = census_factory("mistral")
census_mamba = census_factory("mamba")
