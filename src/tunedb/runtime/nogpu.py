"""The run-time APIs on a machine without a CUDA GPU: one clear warning, then nothing measured.

`confirm()` times the model's captured forward and `autotune()` measures arms with CUDA graphs;
neither can do anything without a GPU. Rather than failing deep inside torch (or doing nothing
silently), each says so once per process: what was not done, why, and where it would work.
"""
from __future__ import annotations

import threading
import warnings

from tunedb.errors import NoGPUWarning

_warned: set[str] = set()
_lock = threading.Lock()


def has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no usable torch: no GPU to measure on
        return False


def warn_no_gpu(api: str, consequence: str) -> bool:
    """True when there is no CUDA GPU, after warning once per process for `api`."""
    if has_gpu():
        return False
    with _lock:
        first = api not in _warned
        _warned.add(api)
    if first:
        warnings.warn(f"tunedb.{api}: no CUDA GPU here, so nothing was measured: {consequence}. "
                      f"Run it on the GPU the model serves on (measurements are per GPU).",
                      NoGPUWarning, stacklevel=3)
    return True
