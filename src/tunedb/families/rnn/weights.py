"""Recurrent weights in the one flat buffer cuDNN reads in place (imports torch lazily).

cuDNN's RNN takes its weights as one buffer in its own layout. Handed separate tensors,
torch's `_cudnn_rnn` warns ("weights are not part of single contiguous chunk of memory") and
copies them into a fresh buffer on every call. nn.RNNBase.flatten_parameters() rewires a module's
parameters into such a buffer, but it returns early for dtypes outside
`torch.backends.cudnn.CUDNN_TENSOR_DTYPES` (fp16/fp32/fp64), so every bf16 nn.LSTM / nn.GRU pays
that copy per call although cuDNN runs bf16. Here the same aten op, `_cudnn_rnn_flatten_weight`,
runs for bf16 too:

- `flatten_module(rnn)`: in place on a module's parameters (as flatten_parameters does), once;
- `cudnn_weights(sig, weights)`: for a call handed loose weight tensors, a flattened copy made
  once and cached per (tensors, versions), so an in-place update of the weights makes a new one.

The values are the same tensors' values in the layout cuDNN's own per-call copy builds, so the
outputs do not change. Nothing is flattened while a CUDA graph is being captured (the buffer
would come from the graph's private pool): such a call runs as before, with cuDNN's own copy.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any, Sequence

from tunedb.records import Signature

_MODES = {"lstm": 2, "gru": 3}  # torch.backends.cudnn.rnn.get_cudnn_mode
_CACHE_SIZE = 16
# (pointer, version, shape) of every loose weight -> (weak references to them, the flat copies)
_COPIES: "OrderedDict[tuple, tuple[tuple[Any, ...], list[Any]]]" = OrderedDict()


def cudnn_applies(weights: Sequence[Any]) -> bool:
    """Whether cuDNN would run a call with these weights: CUDA tensors of one cuDNN dtype, cuDNN
    enabled (the `nocudnn` arm and the reference turn it off) and usable."""
    import torch

    if not weights or not torch.backends.cudnn.enabled or not torch.backends.cudnn.is_available():
        return False
    dtype = weights[0].dtype
    return all(w.is_cuda and w.dtype == dtype for w in weights) and \
        dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def capturing() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def is_flat(weights: Sequence[Any]) -> bool:
    """One storage holds them all: a flattened buffer (nn's or ours)."""
    return len({w.untyped_storage().data_ptr() for w in weights}) == 1


def _flatten_(weights: list[Any], op: str, input_size: int, hidden: int, layers: int, bias: bool,
              batch_first: bool, bidir: bool) -> None:
    """Rewire `weights` in place into one cuDNN buffer (values unchanged)."""
    import torch

    with torch.no_grad():
        torch._cudnn_rnn_flatten_weight(weights, 4 if bias else 2, input_size, _MODES[op], hidden, 0, layers,
                                        batch_first, bidir)


def flatten_module(rnn: Any) -> bool:
    """flatten_parameters() for every cuDNN dtype (bf16 included), in place; True when the
    module's weights are one buffer afterwards. A no-op when they already are, off cuDNN, while
    capturing, for LSTM projections and for aliased parameters (nn's own conditions)."""
    weights = list(rnn._flat_weights)
    from tunedb.families.rnn.configs import rnn_op

    op = rnn_op(rnn)
    if op not in _MODES or getattr(rnn, "proj_size", 0) or not cudnn_applies(weights):
        return False
    if is_flat(weights):
        return True
    if capturing() or len({w.data_ptr() for w in weights}) != len(weights):
        return False
    import torch

    try:
        with torch.cuda.device_of(weights[0]):
            _flatten_(weights, op, rnn.input_size, rnn.hidden_size, rnn.num_layers, bool(rnn.bias),
                      bool(rnn.batch_first), bool(rnn.bidirectional))
    except RuntimeError as exc:  # a cuDNN that refuses this dtype: it copies per call, as before
        _refused(exc)
        return False
    return is_flat(weights)


def _refused(exc: Exception) -> None:
    import warnings

    warnings.warn(f"tunedb rnn: cuDNN refused to flatten the weights ({exc}); it copies them every call",
                  RuntimeWarning, stacklevel=3)


def cudnn_weights(sig: Signature, weights: Sequence[Any]) -> list[Any]:
    """The weights a cuDNN call should get: as given when they are one buffer already (or
    cuDNN does not run them), else their flattened copy, made once per (tensors, versions)."""
    weights = list(weights)
    if not cudnn_applies(weights) or is_flat(weights):
        return weights
    key = tuple((w.data_ptr(), w._version, tuple(w.shape)) for w in weights)
    found = _COPIES.get(key)
    if found is not None and all(ref() is w for ref, w in zip(found[0], weights)):
        _COPIES.move_to_end(key)
        return found[1]
    if capturing():
        return weights
    import torch

    copies = [w.detach().clone() for w in weights]
    try:
        with torch.cuda.device_of(copies[0]):
            _flatten_(copies, sig.op, sig.get("I"), sig.get("H"), sig.get("L"), bool(sig.get("bias")),
                      bool(sig.get("bf")), bool(sig.get("bidir")))
    except RuntimeError as exc:  # remembered: the loose weights are passed on, not retried per call
        _refused(exc)
        copies = weights
    _COPIES[key] = (tuple(weakref.ref(w) for w in weights), copies)
    while len(_COPIES) > _CACHE_SIZE:
        _COPIES.popitem(last=False)
    return copies
