"""GEMM signatures: the static key of a call (from tensors or meta tensors) and its work.

Duck-typed on `.shape` and `.dtype`, so it needs no torch import and works on meta tensors.
"""
from __future__ import annotations

import math
from typing import Any

from tunedb.census import unpatched
from tunedb.errors import SignatureError
from tunedb.families.gemm.configs import ACTS, ELEMENT_BYTES, FAMILY, OPS, sig_reason
from tunedb.records import Signature

_DT_OF_TORCH = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}

# Each op's key fields besides op and dt, in order, with their types. bmm (attention's batched
# products) and unpatched (calls optimize() does not swap, census/unpatched.py) are recorded by
# a census though the family tunes neither: a census file holding them must read back.
KEY_FIELDS: dict[str, tuple[tuple[str, type], ...]] = {
    "gemm": (("N", int), ("K", int)),
    "gemm_act": (("N", int), ("K", int), ("act", str), ("bias", int)),
    "bmm": (("B", int), ("N", int), ("K", int)),
    unpatched.UNPATCHED: (("N", int), ("K", int), ("src", str)),
}


SIZE_MAX = 2**31 - 1  # as the census's M: past any dimension a GEMM is launched with (32-bit)


def check_key(sig: Signature) -> None:
    """Refuse a GEMM-family key (a census's or a database's) whose fields are missing, extra or
    of the wrong type, or whose sizes are not positive: SignatureError naming the field."""
    fields = KEY_FIELDS.get(sig.op)
    if fields is None:
        raise SignatureError(f"signature {sig.format()!r}: op {sig.op!r} is not one of {', '.join(KEY_FIELDS)}")
    given = dict(sig.params)
    want = ", ".join(f"{name}=<{kind.__name__}>" for name, kind in fields)
    for name, kind in fields:
        if name not in given:
            raise SignatureError(f"signature {sig.format()!r}: missing {name}; op={sig.op} needs {want}")
        value = given[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise SignatureError(f"signature {sig.format()!r}: {name}={value!r} must be "
                                 f"{'a positive integer' if kind is int else 'a ' + kind.__name__}")
        if kind is int and name != "bias" and not 1 <= value <= SIZE_MAX:
            raise SignatureError(f"signature {sig.format()!r}: {name}={value} must be a positive integer "
                                 f"at most {SIZE_MAX} (a tensor dimension a kernel is launched with)")
    extra = [k for k in given if k not in dict(fields)]
    if extra:
        raise SignatureError(f"signature {sig.format()!r}: unknown field(s) {', '.join(extra)}; "
                             f"op={sig.op} takes {want}")
    order = [name for name, _ in fields]
    if [k for k, _ in sig.params] != order:  # a key is matched as text: another order never serves
        canonical = "|".join(f"{k}={given[k]}" for k in order)
        raise SignatureError(f"signature {sig.format()!r}: fields out of order; op={sig.op} keys read "
                             f"{sig.family}|op={sig.op}|dt={sig.dt}|{canonical}")
    # the key's shape only: whether its dtype is served is the validity predicate's question
    if sig.op == "gemm_act" and given["act"] not in ACTS:
        raise SignatureError(f"signature {sig.format()!r}: act={given['act']!r} is not one of {', '.join(ACTS)}")
    if sig.op == "gemm_act" and given["bias"] not in (0, 1):
        raise SignatureError(f"signature {sig.format()!r}: bias={given['bias']!r} must be 0 or 1")
    if sig.op == unpatched.UNPATCHED and given["src"] not in unpatched.WHY:
        raise SignatureError(f"signature {sig.format()!r}: src={given['src']!r} is not one of "
                             f"{', '.join(unpatched.WHY)}")


def make_signature(op: str, dt: str, n: int, k: int, act: str = "none", bias: bool = False) -> Signature:
    """`gemm|op=gemm|dt=..|N=..|K=..` or `gemm|op=gemm_act|dt=..|N=..|K=..|act=..|bias=0/1`."""
    if op not in OPS:
        raise SignatureError(f"unknown GEMM op {op!r}; ops are {', '.join(OPS)}")
    if op == "gemm":
        if act != "none" or bias:
            raise SignatureError(f"op=gemm has no bias or activation (got act={act!r}, bias={bias}); use gemm_act")
        sig = Signature.make(FAMILY, op, dt, N=n, K=k)
    else:
        sig = Signature.make(FAMILY, op, dt, N=n, K=k, act=act, bias=int(bool(bias)))
    why = sig_reason(sig)
    if why:
        raise SignatureError(f"bad GEMM signature {sig.format()!r}: {why}")
    return sig


def dtype_name(dtype: Any) -> str:
    name = _DT_OF_TORCH.get(str(dtype))
    if name is None:
        raise SignatureError(f"GEMM dtype {dtype} is not served; use torch.float16 or torch.bfloat16")
    return name


def signature_of(op: str, x: Any, weight: Any, bias: Any = None, act: str = "none") -> tuple[Signature, int]:
    """(Signature, M) of y = act(x @ weight.T + bias), x [..., K], weight [N, K]; M = prod(x.shape[:-1])."""
    if op not in OPS:
        raise SignatureError(f"unknown GEMM op {op!r}; ops are {', '.join(OPS)}")
    if act not in ACTS:
        raise SignatureError(f"unknown activation act={act!r}; allowed: {', '.join(ACTS)}")
    xs, ws = tuple(x.shape), tuple(weight.shape)
    if len(xs) < 1 or len(ws) != 2:
        raise SignatureError(f"GEMM needs x [..., K] and weight [N, K]; got x {list(xs)}, weight {list(ws)}")
    n, k = ws
    if xs[-1] != k:
        raise SignatureError(f"GEMM x has K={xs[-1]} but weight [N, K] has K={k}")
    dt = dtype_name(x.dtype)
    if dtype_name(weight.dtype) != dt:
        raise SignatureError(f"GEMM x is {x.dtype} but weight is {weight.dtype}; they must match")
    if bias is not None:
        if tuple(bias.shape) != (n,):
            raise SignatureError(f"GEMM bias must have shape [{n}], got {list(bias.shape)}")
        if dtype_name(bias.dtype) != dt:
            raise SignatureError(f"GEMM bias is {bias.dtype} but x is {x.dtype}; they must match")
    m = math.prod(xs[:-1])
    return make_signature(op, dt, int(n), int(k), act, bias is not None), int(m)


def work(sig: Signature, m: int) -> tuple[float, float]:
    """(2*M*N*K flops, bytes of x + W + y (+ bias)) of one call."""
    n, k = sig.get("N"), sig.get("K")
    flops = 2.0 * m * n * k
    moved = (m * k + n * k + m * n + (n if sig.get("bias") == 1 else 0)) * ELEMENT_BYTES
    return flops, float(moved)


def serving_keys(sig: Signature) -> tuple[Signature, ...]:
    """Entries that may serve `sig`, most specific first: its own (concrete dtype, then dt=half),
    then, for gemm_act, the plain GEMM of the same N, K. A bias/activation epilogue adds a few
    element-wise ops per output to the same tile loop, so the tile measured fastest for the GEMM
    is the one to run for its fused form until gemm_act itself is measured (censuses record the
    aten-level linear, so the shipped tier holds op=gemm entries)."""
    keys = sig.lookup_keys()
    if sig.op == "gemm_act":
        plain = Signature(sig.family, "gemm", sig.dt, (("N", sig.get("N")), ("K", sig.get("K"))))
        keys += plain.lookup_keys()
    return keys



# Two lines of at most 80 characters each: the legend of short_signature's forms.
SHORT_LEGEND = ("signature: NxK = op=gemm, N outputs, K inputs; NxK ACT[+b] = op=gemm_act\n"
                "(activation, +b: with bias); bmm BxNxK = op=bmm; :bf16/:fp16 = dtype (else half)")


def short_signature(sig: Signature) -> str:
    """`2048x512 gelu+b` (N x K, the activation, +b for a bias), `512x512` for a plain GEMM,
    `bmm 8x64x1500` (B x N x K), and `:bf16` / `:fp16` when the dtype is not the generic half:
    for tables on narrow terminals."""
    dt = "" if sig.dt == "half" else f":{sig.dt}"
    n, k = sig.get("N"), sig.get("K")
    if sig.op == "gemm_act":
        return f"{n}x{k} {sig.get('act')}{'+b' if sig.get('bias') else ''}{dt}"
    if sig.op == "bmm":
        return f"bmm {sig.get('B')}x{n}x{k}{dt}"
    if sig.op == "gemm":
        return f"{n}x{k}{dt}"
    return f"{sig.op} " + " ".join(f"{key}={value}" for key, value in sig.params) + dt
