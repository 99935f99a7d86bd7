"""Whether torch.autocast changes a call's operands: the one rule the tuned ops share for when a
call under autocast must take torch's own path (its casts and cache) and when the served kernel
still computes exactly what the plain model computes.

Autocast's lower-precision ops (linear, conv, matmul, the RNNs) cast every floating operand to the
autocast dtype. A call whose operands are all in that dtype already (a bf16 model under bf16
autocast) is cast to nothing: torch computes what it would without autocast, so the tuned kernel
serves it as it would outside autocast. Tested in tests/unit/test_gemm_autocast.py.
"""
from __future__ import annotations

from typing import Any


def enabled(device_type: str) -> bool:
    """torch.is_autocast_enabled(device_type), False for a device autocast has no key for (meta:
    a census on meta tensors, where torch raises "unknown device type for autocast")."""
    import torch

    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


def casts(device_type: str, *tensors: Any) -> bool:
    """Autocast is on for `device_type` and would cast one of `tensors` (None skipped)."""
    import torch

    if not enabled(device_type):
        return False
    dtype = torch.get_autocast_dtype(device_type)
    return any(t is not None and t.dtype != dtype for t in tensors)
