"""The tuned GEMM + log-softmax as a torch.library op and its Python entry point:

    tunedb::gemm_log_softmax(x, weight, bias=None) -> y = log_softmax(x @ weight.T + bias, -1)

x [..., K] and weight [N, K] in bf16 or fp16 (bias [N] in the same dtype); y [..., N] in x's
dtype. A CUDA call resolves through the selector (user tier, system tier, then the `torch`
default) via runtime.dispatch and launches; CPU tensors run the torch arm. No host
synchronisation per call (CUDA graphs capture it); the fake kernel gives torch.compile the shape.
Importing this module registers the op (it imports torch).
"""
from __future__ import annotations

from typing import Any

import torch

from tunedb.families.gemm_log_softmax.configs import FAMILY, OPS
from tunedb.families.gemm_log_softmax.launch import torch_arm

_lib = torch.library.Library("tunedb", "FRAGMENT")  # noqa: TOR901 - kept alive for the process
_lib.define("gemm_log_softmax(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor")


def _impl(x: Any, weight: Any, bias: Any = None) -> Any:
    from tunedb.families.gemm_log_softmax.keys import signature_of

    signature_of(OPS[0], x, weight, bias)  # clear errors for bad shapes or dtypes on every device
    if not x.is_cuda:
        return torch_arm(x, weight, bias)
    from tunedb.runtime import dispatch

    return dispatch.call(FAMILY, OPS[0], x, weight, bias)


def _fake(x: Any, weight: Any, bias: Any = None) -> Any:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_lib.impl("gemm_log_softmax", _impl, "CompositeExplicitAutograd")
torch.library.register_fake("tunedb::gemm_log_softmax", _fake, lib=_lib)


def gemm_log_softmax(x: Any, weight: Any, bias: Any = None) -> Any:
    """log_softmax(x @ weight.T + bias, dim=-1) through the tuned op (x's dtype out)."""
    return torch.ops.tunedb.gemm_log_softmax(x, weight, bias)
