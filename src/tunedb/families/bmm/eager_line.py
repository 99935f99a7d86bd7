"""The eager kernel line for the product mode (serving.py): which tile-served products run as the
model wrote them outside a CUDA-graph capture.

An eager forward under the product mode pays a Python hop on every torch call it makes, and a
tile's launch costs the host more than torch.matmul's; a product whose torch kernel is shorter
than TUNEDB_EAGER_KERNEL_US (64 us) buys nothing eagerly with its GPU saving, as the GEMM family's
line says for its own shapes (families/gemm/model.eager_fallback; session 45, H100: Llama-3-8B
layers at batch 1 eagerly 1.110x slower than plain with the decode configs served, 0.990x with
them as F.linear). Such a product counts as a candidate, not as served: a forward that served
nothing else backs its mode off for up to 8 forwards, so the hop is paid on one eager forward in
nine, and never retires it (a capture always runs the mode and gets the tile). Session 46: T5-like
encoder-decoder, eager 1.015x plain with its attention products tiled (H100, unseen_zoo.py).

The prediction is a roofline of the product's own bytes and FLOPs at the arch profile's measured
bandwidth and tensor throughput; no profile, the line at 0, or TUNEDB_EAGER_FALLBACK=0: no
product yields.
"""
from __future__ import annotations

from typing import Any

_DT = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def short_eagerly(a3: Any, b3: Any) -> bool:
    """Whether torch's kernel for a3 @ b3 ((B, M, K) @ (B, K, N)) is predicted shorter than
    TUNEDB_EAGER_KERNEL_US on this arch."""
    from tunedb import settings
    from tunedb.runtime import selector

    if not settings.eager_fallback_enabled():
        return False
    line = settings.eager_kernel_us()
    try:
        profile = selector.current_arch()[1]
    except Exception:  # an arch that cannot be read: the rule is off, never the product
        return False
    if not line or profile is None:
        return False
    batch, m, k = (int(d) for d in a3.shape)
    n = int(b3.shape[-1])
    moved = (batch * m * k + batch * k * n + batch * m * n) * a3.element_size()
    flops = 2.0 * batch * m * n * k
    tflops = profile.peak_tflops(_DT.get(str(a3.dtype), "bf16"))
    us = max(moved / (profile.dram_bw_gbs * 1e3), flops / (tflops * 1e6) if tflops > 0 else 0.0)
    return us < line
