"""The rnn family's tensors: the two arms (cuDNN through torch, torch's native kernels with cuDNN
off), the fp32 (fp64 for fp32 inputs) reference and random inputs. Imports torch lazily.

Arguments of a call: x [B, T, I] (batch-first) or [T, B, I], h0 [L*D, B, H], c0 (LSTM only),
then the flat weights in nn.LSTM/nn.GRU order (w_ih, w_hh, b_ih, b_hh per layer and direction).
make_inputs takes them from a flattened module (one contiguous buffer: cuDNN uses it in place;
separate tensors would make cuDNN copy them into one every call; weights.py flattens bf16 too).
"""
from __future__ import annotations

import contextlib
from typing import Any

from tunedb.records import Config, Signature

TORCH_DT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def arm_flags(config: Config) -> Any:
    """The context an arm runs in: cuDNN off for `nocudnn`, torch's own settings otherwise."""
    import torch

    if config.id == "nocudnn":
        return torch.backends.cudnn.flags(enabled=False)
    return contextlib.nullcontext()


def run(sig: Signature, x: Any, h0: Any, *rest: Any) -> Any:
    """The op through torch's dispatch (cuDNN when it is enabled and applies): the output only.
    Loose weights reach cuDNN as one flat buffer (weights.cudnn_weights), as a flattened module's do."""
    import torch

    from tunedb.families.rnn.weights import cudnn_weights

    layers, bias, bidir, bf = sig.get("L"), bool(sig.get("bias")), bool(sig.get("bidir")), bool(sig.get("bf"))
    if sig.op == "lstm":
        c0, weights = rest[0], cudnn_weights(sig, rest[1:])
        return torch._VF.lstm(x, (h0, c0), weights, bias, layers, 0.0, False, bidir, bf)[0]
    return torch._VF.gru(x, h0, cudnn_weights(sig, rest), bias, layers, 0.0, False, bidir, bf)[0]


def persistent(config: Config, sig: Signature, x: Any, h0: Any, c0: Any, *weights: Any,
               states: bool = False) -> Any:
    """The `triton_persistent` arm (kernels.py): per layer and direction, the input projection as
    one GEMM (in the input dtype, as torch's native path, then fp32 with both biases), then one
    launch that walks every step. The output y; with states=True, (y, (h_n, c_n)) as nn.LSTM."""
    import torch

    from tunedb.families.rnn import kernels

    bb, bh, bk, warps = (config.param(k) for k in ("bb", "bh", "bk", "warps"))
    layers, d, h, bias = sig.get("L"), 1 + sig.get("bidir"), sig.get("H"), sig.get("bias")
    per = 4 if bias else 2
    inp = x if sig.get("bf") else x.transpose(0, 1)
    b, t = inp.shape[0], inp.shape[1]
    h_n, c_n = [], []
    for layer in range(layers):
        y = torch.empty((b, t, d * h), dtype=x.dtype, device=x.device)
        for direction in range(d):
            ld = layer * d + direction
            w_ih, w_hh = weights[ld * per], weights[ld * per + 1].contiguous()
            xp = torch.nn.functional.linear(inp, w_ih).float()
            if bias:
                xp += (weights[ld * per + 2].float() + weights[ld * per + 3].float())
            c = c0[ld].float().contiguous()
            yd = y[..., direction * h:(direction + 1) * h]
            kernels._lstm_seq_kernel[(-(-b // bb),)](
                xp, w_hh, h0[ld].contiguous(), yd, c, b, t, h, xp.stride(0), xp.stride(1), yd.stride(0), yd.stride(1),
                REVERSE=direction == 1, BB=bb, BH=bh, BK=bk, num_warps=warps, num_stages=2)
            h_n.append(yd[:, 0 if direction else t - 1])
            c_n.append(c)
        inp = y
    y = y if sig.get("bf") else y.transpose(0, 1)
    if not states:
        return y
    return y, (torch.stack(h_n), torch.stack(c_n).to(x.dtype))


def launch(config: Config, sig: Signature, x: Any, h0: Any, *rest: Any, out: Any = None) -> Any:
    if config.lane == "triton_persistent":
        y = persistent(config, sig, x, h0, *rest)
    else:
        with arm_flags(config):
            y = run(sig, x, h0, *rest)
    if out is None:
        return y
    out.copy_(y)  # both arms alike: the measured launches write one preallocated output
    return out


def reference(sig: Signature, x: Any, h0: Any, *rest: Any, dtype: Any = None) -> Any:
    """The output in fp32 (fp64 for fp32 inputs) on upcast inputs, native kernels, no TF32."""
    import torch

    dtype = dtype or (torch.float64 if sig.dt == "fp32" else torch.float32)
    up = [t.to(dtype) for t in (x, h0, *rest)]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=False):
            return run(sig, *up)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def make_module(sig: Signature, device: Any, seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    cls = torch.nn.LSTM if sig.op == "lstm" else torch.nn.GRU
    mod = cls(sig.get("I"), sig.get("H"), sig.get("L"), bias=bool(sig.get("bias")), batch_first=bool(sig.get("bf")),
              bidirectional=bool(sig.get("bidir")))
    mod = mod.to(device=device, dtype=getattr(torch, TORCH_DT[sig.dt])).eval()
    if str(device).startswith("cuda"):
        from tunedb.families.rnn.weights import flatten_module

        flatten_module(mod)  # bf16 too, which nn's flatten_parameters() skips
    return mod


def make_inputs(sig: Signature, t: int, device: Any, seed: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """((x, h0[, c0], *flat weights), {}): nn.LSTM/GRU's own initialisation (uniform +-1/sqrt(H)),
    normal inputs and states (never zeros)."""
    import torch

    mod = make_module(sig, device, seed)
    dt = getattr(torch, TORCH_DT[sig.dt])
    b, layers, d, h = sig.get("B"), sig.get("L"), 1 + sig.get("bidir"), sig.get("H")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shape = (b, t, sig.get("I")) if sig.get("bf") else (t, b, sig.get("I"))
    x = torch.randn(shape, generator=gen, device=device).to(dt)
    h0 = (0.5 * torch.randn((layers * d, b, h), generator=gen, device=device)).to(dt)
    states = (h0, (0.5 * torch.randn((layers * d, b, h), generator=gen, device=device)).to(dt)) \
        if sig.op == "lstm" else (h0,)
    return (x, *states, *[w.detach() for w in mod._flat_weights]), {}
