"""A Llama-3-8B-shaped model cut to 2 layers (random weights from the config: hidden 4096,
intermediate 14336, 32 heads, 8 KV heads, vocab 128256; bf16), as a `tunedb census` workload
(module:callable) and as the model of bench/scaled_mm_e2e.py.

    tunedb census bench.quant_llama:make --unit tokens --quantization fp8-rowwise ... (PYTHONPATH=.)
"""
from __future__ import annotations

from typing import Any

CONFIG = dict(hidden=4096, intermediate=14336, layers=2, heads=32, kv_heads=8, vocab=128256)


def make(device: Any = "meta", seed: int = 0) -> tuple[Any, Any, Any]:
    """(model, input_factory(batch, length), decode_factory(batch)) on `device`."""
    import torch

    from tunedb.census.models import LlamaMirror

    c = CONFIG
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaMirror(c["hidden"], c["intermediate"], c["layers"], c["heads"], c["kv_heads"], c["vocab"])
    model = model.to(torch.bfloat16).eval()

    def ids(batch: int, length: int) -> Any:
        return torch.randint(0, c["vocab"], (batch, length), device=device)

    return model, (lambda b, n: (ids(b, n),)), (lambda b: (ids(b, 1),))
