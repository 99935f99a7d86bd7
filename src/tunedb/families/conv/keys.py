"""Convolution signatures: the static key of a conv1d / conv2d call, its size M, its output
geometry and its work. Duck-typed on `.shape` / `.dtype` / `.stride()`: works on meta tensors
and never imports torch.

    conv|op=conv1d|dt=half|Cin=512|Cout=512|k=31|s=1|p=15|d=1|g=512|bias=1|act=none|lay=nct
    conv|op=conv2d|dt=half|Cin=1|Cout=512|k=3|s=2|p=0|d=1|g=1|bias=1|act=relu|lay=nchw|W=80|kw=3|sw=2|pw=0|dw=1

k, s, p, d are the kernel, stride, padding and dilation along time (conv2d: the height axis);
conv2d adds the width axis's kw, sw, pw, dw after its input width W. `lay` is the memory order the model hands the call (conv1d: nct = time fastest, ntc =
channels fastest, the Conformer's transposed [B, T, C] view; conv2d: nchw or nhwc). conv2d keys
its input width W (the frequency axis of a speech front end: static), so that its size axis
M = B * H_out * W_out is one number along the time axis. conv1d: M = B * T_out.
"""
from __future__ import annotations

import math
import operator
from typing import Any

from tunedb.errors import SignatureError
from tunedb.families.key_rules import check_one_device, head_reason
from tunedb.records import Signature

FAMILY = "conv"
OPS: tuple[str, ...] = ("conv1d", "conv2d")
ACTS: tuple[str, ...] = ("none", "relu", "silu")
LAYOUTS = {"conv1d": ("nct", "ntc"), "conv2d": ("nchw", "nhwc")}
DTYPES: tuple[str, ...] = ("half", "fp16", "bf16")
_TORCH_DT = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}
ELEM_BYTES = 2


def _pair(name: str, value: Any, dims: int) -> tuple[int, ...]:
    """An int or a sequence of `dims` ints (torch's conv argument forms) as a tuple."""
    def whole(v: Any) -> int:
        # operator.index, as torch's conv takes its ints: 1.5 or None is refused, not truncated
        if isinstance(v, bool):
            raise SignatureError(f"conv {name}={value!r}: expected an int or {dims} int(s), got a bool")
        try:
            return operator.index(v)
        except TypeError:
            raise SignatureError(f"conv {name}={value!r}: expected an int or {dims} int(s), "
                                 f"got {type(v).__name__}") from None

    if isinstance(value, (list, tuple)):
        vals = tuple(whole(v) for v in value)
        if len(vals) == 1:
            vals = vals * dims
    else:
        vals = (whole(value),) * dims
    if len(vals) != dims:
        raise SignatureError(f"conv {name}={value!r}: expected {dims} value(s)")
    return vals


def check_act(act: Any) -> None:
    """SignatureError unless `act` is an activation the op fuses (checked on every device: the
    CPU path would otherwise skip an unknown one silently)."""
    if act not in ACTS:
        raise SignatureError(f"conv act={act!r} is not fused; allowed: {', '.join(ACTS)}")


def same_extra(op: str, padding: Any, kernel: Any, dilation: Any) -> list[int]:
    """padding='same' with an even d * (k - 1) on some axis: the extra element each axis pads on its
    far side (torch's own rule: half the total before, the rest after), which the op adds with
    F.pad before a symmetric padding_ints; [] when nothing is uneven."""
    if padding != "same":
        return []
    n = dims_of(op)
    ks, ds = _pair("kernel", list(kernel), n), _pair("dilation", dilation, n)
    extra = [d * (k - 1) % 2 for k, d in zip(ks, ds)]
    return extra if any(extra) else []


def padding_ints(op: str, padding: Any, kernel: Any, stride: Any, dilation: Any) -> Any:
    """torch's string paddings as ints: 'valid' is 0; 'same' (stride 1 only, as torch) is
    d * (k - 1) // 2 per axis, the symmetric part (same_extra: the rest)."""
    if not isinstance(padding, str):
        return padding
    n = dims_of(op)
    if padding == "valid":
        return [0] * n
    if padding != "same":
        raise SignatureError(f"{op} padding={padding!r}; allowed: an int, {n} int(s), 'valid' or 'same'")
    ks, ss, ds = _pair("kernel", list(kernel), n), _pair("stride", stride, n), _pair("dilation", dilation, n)
    if any(s != 1 for s in ss):
        raise SignatureError(f"{op} padding='same' needs stride 1, got stride={list(ss)}")
    return [d * (k - 1) // 2 for k, d in zip(ks, ds)]


def dims_of(op: str) -> int:
    if op not in OPS:
        raise SignatureError(f"unknown conv op {op!r}; ops are {', '.join(OPS)}")
    return 1 if op == "conv1d" else 2


GEOM = ("k", "s", "p", "d")
WIDTH_GEOM = ("kw", "sw", "pw", "dw")


def geometry(sig: Signature) -> dict[str, tuple[int, ...]]:
    """{'k', 's', 'p', 'd'}: per spatial dim tuples (conv1d: 1 value each)."""
    if sig.op == "conv1d":
        return {f: (sig.get(f),) for f in GEOM}
    return {f: (sig.get(f), sig.get(fw)) for f, fw in zip(GEOM, WIDTH_GEOM)}


def out_len(length: int, k: int, s: int, p: int, d: int) -> int:
    return (length + 2 * p - d * (k - 1) - 1) // s + 1


def sig_reason(sig: Signature) -> str | None:
    """Why `sig` is not a conv key (None when it is): the rules beyond the schema's types."""
    why = head_reason(sig, FAMILY, OPS, DTYPES)
    if why:
        return why
    wanted = GEOM + (WIDTH_GEOM if sig.op == "conv2d" else ())
    for f in wanted:
        if not isinstance(sig.get(f), int):
            return f"{f}={sig.get(f)!r} must be an int"
    if sig.op == "conv1d" and any(sig.get(f) is not None for f in WIDTH_GEOM + ("W",)):
        return "conv1d keys no W, kw, sw, pw or dw (its only spatial axis is the size axis)"
    g = geometry(sig)
    if any(v < 1 for f in ("k", "s", "d") for v in g[f]):
        return f"k, s and d must be >= 1 (k={sig.get('k')}, s={sig.get('s')}, d={sig.get('d')})"
    cin, cout, groups = sig.get("Cin"), sig.get("Cout"), sig.get("g")
    for name, v in (("Cin", cin), ("Cout", cout), ("g", groups)):
        if not isinstance(v, int) or v < 1:
            return f"{name}={v!r} must be a positive int"
    if cin % groups or cout % groups:
        return f"groups g={groups} must divide Cin={cin} and Cout={cout}"
    if sig.get("bias") not in (0, 1):
        return f"bias={sig.get('bias')!r}; allowed: 0, 1"
    if sig.get("act", "none") not in ACTS:
        return f"act={sig.get('act')!r}; allowed: {', '.join(ACTS)}"
    if sig.get("lay") not in LAYOUTS[sig.op]:
        return f"lay={sig.get('lay')!r} for {sig.op}; allowed: {', '.join(LAYOUTS[sig.op])}"
    if sig.op == "conv2d":
        w = sig.get("W")
        if not isinstance(w, int) or w < 1:
            return f"conv2d needs its input width W (a positive int), got {w!r}"
        if out_len(w, g["k"][1], g["s"][1], g["p"][1], g["d"][1]) < 1:
            return f"conv2d input width W={w} is shorter than the kernel's reach"
    return None


def make_signature(op: str, dt: str, cin: int, cout: int, kernel: Any, stride: Any = 1, padding: Any = 0,
                   dilation: Any = 1, groups: int = 1, bias: bool = True, act: str = "none",
                   lay: str | None = None, width: int | None = None) -> Signature:
    """A checked key from torch-style arguments (ints or tuples)."""
    n = dims_of(op)
    geo = [_pair(name, v, n) for name, v in (("kernel", kernel), ("stride", stride), ("padding", padding),
                                             ("dilation", dilation))]
    fields: dict[str, Any] = dict(Cin=int(cin), Cout=int(cout), k=geo[0][0], s=geo[1][0], p=geo[2][0], d=geo[3][0],
                                  g=int(groups), bias=int(bool(bias)), act=act, lay=lay or LAYOUTS[op][0])
    if op == "conv2d":
        fields["W"] = width if width is None else int(width)
        fields.update(zip(WIDTH_GEOM, (v[1] for v in geo)))
    sig = Signature.make(FAMILY, op, dt, **{k: v for k, v in fields.items() if v is not None})
    why = sig_reason(sig)
    if why:
        raise SignatureError(f"bad conv signature {sig.format()!r}: {why}")
    return sig


def dtype_name(dtype: Any) -> str:
    dt = _TORCH_DT.get(str(dtype))
    if dt is None:
        raise SignatureError(f"conv serves torch.float16 and torch.bfloat16 inputs, got {dtype}")
    return dt


def layout_of(op: str, x: Any) -> str:
    """The memory order of x: channels fastest (ntc / nhwc) when its channel stride is 1 and the
    spatial axes are not; time (width) fastest otherwise."""
    st = tuple(x.stride())
    if op == "conv1d":
        return "ntc" if st[1] == 1 and x.shape[1] > 1 and st[2] != 1 else "nct"
    return "nhwc" if st[1] == 1 and x.shape[1] > 1 and st[3] != 1 else "nchw"


def signature_of(op: str, x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, act: str = "none") -> tuple[Signature, int]:
    """(Signature, M) of one call: x [B, Cin, T] or [B, Cin, H, W]; weight [Cout, Cin/g, *k]."""
    n = dims_of(op)
    check_one_device(op, x=x, weight=weight, bias=bias)
    xs, ws = tuple(x.shape), tuple(weight.shape)
    if len(xs) != n + 2 or len(ws) != n + 2:
        raise SignatureError(f"{op} needs x and weight of rank {n + 2}; got x {list(xs)}, weight {list(ws)}")
    cin, cout = int(xs[1]), int(ws[0])
    if int(ws[1]) * int(groups) != cin:
        raise SignatureError(f"{op}: weight {list(ws)} with groups={groups} expects {int(ws[1]) * int(groups)} "
                             f"input channels, x has {cin}")
    dt = dtype_name(x.dtype)
    if str(weight.dtype) != str(x.dtype):
        raise SignatureError(f"{op}: x is {x.dtype} but weight is {weight.dtype}; they must match")
    if bias is not None and (tuple(bias.shape) != (cout,) or str(bias.dtype) != str(x.dtype)):
        # what torch's conv refuses: no arm may take it (the op falls back to torch's own error)
        raise SignatureError(f"{op}: bias {list(bias.shape)} {bias.dtype} does not fit; expected [{cout}] (Cout) "
                             f"in x's dtype {x.dtype}")
    sig = make_signature(op, dt, cin, cout, ws[2:], stride, padding, dilation, groups, bias is not None, act,
                         layout_of(op, x), int(xs[3]) if n == 2 else None)
    return sig, size_of(sig, int(xs[0]), int(xs[2]))


def out_shape(sig: Signature, batch: int, length: int) -> tuple[int, ...]:
    """The output shape for input [B, Cin, length(, W)]."""
    g = geometry(sig)
    t = out_len(length, g["k"][0], g["s"][0], g["p"][0], g["d"][0])
    if sig.op == "conv1d":
        return (batch, sig.get("Cout"), t)
    w = out_len(sig.get("W"), g["k"][1], g["s"][1], g["p"][1], g["d"][1])
    return (batch, sig.get("Cout"), t, w)


def size_of(sig: Signature, batch: int, length: int) -> int:
    """M = B * T_out (conv1d) or B * H_out * W_out (conv2d); SignatureError when empty."""
    shape = out_shape(sig, batch, length)
    m = math.prod(shape) // sig.get("Cout")
    if m < 1:
        raise SignatureError(f"{sig}: input length {length} gives an empty output {list(shape)}")
    return m


def shape_for(sig: Signature, m: int) -> tuple[int, int]:
    """(B, input length) whose output has at least m rows: B = 1, the shortest input whose
    M >= m (conv2d rounds M up to whole output rows of W_out)."""
    g = geometry(sig)
    k, s, p, d = g["k"][0], g["s"][0], g["p"][0], g["d"][0]
    per_row = 1 if sig.op == "conv1d" else out_len(sig.get("W"), g["k"][1], g["s"][1], g["p"][1], g["d"][1])
    rows = -(-m // per_row)
    length = max(1, (rows - 1) * s + d * (k - 1) + 1 - 2 * p)
    while out_len(length, k, s, p, d) < rows:
        length += 1
    return 1, length


def work(sig: Signature, m: int) -> tuple[float, float]:
    """(2 * M * Cout * (Cin/g) * taps flops, bytes of x (read once) + weight + y)."""
    g = geometry(sig)
    taps = math.prod(g["k"])
    cin, cout = sig.get("Cin"), sig.get("Cout")
    flops = 2.0 * m * cout * (cin // sig.get("g")) * taps
    stride = math.prod(g["s"])
    moved = (m * stride * cin + cout * (cin // sig.get("g")) * taps + m * cout) * ELEM_BYTES
    return flops, float(moved)
