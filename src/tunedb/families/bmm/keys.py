"""Batched-product signatures: the static key of a call c[B, M, N] = a[B, M, K] @ b[B, K, N]
(from tensors or meta tensors), its layout, its work, and the census rule.

    bmm|op=bmm|dt=half|B=64|N=1500|K=64|lay=nt      whisper-base's q @ k^T, M = 1500
    bmm|op=bmm|dt=half|B=64|N=64|K=1500|lay=nn      its softmax(scores) @ v

The size axis is M (rows of one product). `lay` says which operand dimension is contiguous
(configs.LAYOUTS): the kernels take any strides, but a transposed operand is a different memory
access pattern, so it is a different key. A census records dt=half for fp16 and bf16 (one key
serves both, as GEMM's); a run-time call keys its concrete dtype, served by its own entry or the
half one (Signature.lookup_keys). Duck-typed on .shape / .stride() / .dtype: no torch import.
"""
from __future__ import annotations

from typing import Any

from tunedb.errors import OperandMismatchError, SignatureError
from tunedb.families.key_rules import check_one_device, check_tensors, size
from tunedb.families.bmm.configs import DTYPES, FAMILY, LAYOUTS, OPS, elem_bytes
from tunedb.families.contract import SignatureSchema
from tunedb.records import Signature

SCHEMA = SignatureSchema(key=(("B", int), ("N", int), ("K", int), ("lay", str)), size="M", ladder="m",
                         choices=(("lay", LAYOUTS),), dtypes=DTYPES)
_DT = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}
SERVED_DTYPES = frozenset(_DT)  # str(torch dtype) of the operands the family has kernels for


def make_signature(b: int, n: int, k: int, dt: str = "half", lay: str = "nn") -> Signature:
    return SCHEMA.make(FAMILY, "bmm", dt, B=b, N=n, K=k, lay=lay)


def _major(t: Any) -> str:
    """'t' when the last two dimensions are stored column-major (dim -2 contiguous), else 'n'.
    A dimension of size 1 has any stride: such an operand counts as row-major."""
    shape, stride = tuple(t.shape), tuple(t.stride())
    if shape[-1] > 1 and shape[-2] > 1 and stride[-2] == 1 and stride[-1] != 1:
        return "t"
    return "n"


def layout_of(a: Any, b: Any) -> str:
    return _major(a) + _major(b)


def keyed_as(sig: Signature, m: int) -> Signature:
    """The key a call of `sig`'s shapes at size `m` is served under, as `signature_of` reads its
    operands. An operand with a dimension of size 1 is stored as a row-major one whatever view
    made it (one row of a transposed `a` has strides (K, 1, 1)), so `_major` reads it as 'n':
    at M = 1 lay tn keys as nn and tt as nt. M is the size axis, so a transposed `a`'s M = 1
    calls are served by the row-major key's entry (the same memory access pattern)."""
    bt, n, k = sig.get("B"), sig.get("N"), sig.get("K")
    lay = sig.get("lay", "nn")
    a_major = "n" if m == 1 or k == 1 else lay[0]
    b_major = "n" if k == 1 or n == 1 else lay[1]
    if a_major + b_major == lay:
        return sig
    return make_signature(bt, n, k, sig.dt, a_major + b_major)


def dt_name(dtype: Any) -> str:
    dt = _DT.get(str(dtype))
    if dt is None:
        raise SignatureError(f"bmm serves torch.float16, torch.bfloat16 and torch.float32 operands, got {dtype} "
                             f"(the bmm() entry point computes torch.matmul for two operands of another dtype)")
    return dt


def signature_of(op: str, a: Any, b: Any) -> tuple[Signature, int]:
    """(Signature, M) of a [B, M, K] @ b [B, K, N] (2-D operands: B = 1), concrete dtype."""
    batch, m, n, k, dt = check_call(op, a, b)
    if min(batch, m, n, k) < 1:
        raise SignatureError(f"bmm needs non-empty operands; got B={batch}, M={m}, N={n}, K={k}")
    return make_signature(batch, n, k, dt, layout_of(a, b)), m


def check_call(op: str, a: Any, b: Any) -> tuple[int, int, int, int, str]:
    """(B, M, N, K, dt) of a call, SignatureError naming a bad shape or dtype: every check but
    emptiness (an empty product has no key, but is a valid call)."""
    if op not in OPS:
        raise SignatureError(f"unknown bmm op {op!r}; ops are {', '.join(OPS)}")
    try:
        sa, sb = tuple(a.shape), tuple(b.shape)
    except AttributeError:  # a None or a number where a tensor belongs: named (nothing paid on a good call)
        check_tensors("bmm", a=a, b=b)
        raise
    check_one_device("bmm", a=a, b=b)
    for name, t in (("a", a), ("b", b)):
        layout = getattr(t, "layout", None)
        if layout is not None and str(layout) != "torch.strided":  # torch.bmm computes a sparse product; no arm here reads one
            raise SignatureError(f"bmm's {name} must be a dense (strided) tensor, got layout {layout}: "
                                 f"pass {name}.to_dense(), or call torch.bmm for a sparse product")
    # operands that do not fit together: OperandMismatchError, also the RuntimeError torch.bmm
    # raises for the same call (a ValueError before, s42 audit)
    if len(sa) != len(sb) or len(sa) not in (2, 3):
        raise OperandMismatchError(f"bmm needs a [B, M, K] and b [B, K, N] (or both 2-D; the bmm() entry point "
                                   f"also takes [..., M, K] and [..., K, N] with equal leading dimensions); "
                                   f"got a {list(sa)}, b {list(sb)}")
    if len(sa) == 2:
        sa, sb = (1, *sa), (1, *sb)
    if sa[0] != sb[0] or sa[2] != sb[1]:
        raise OperandMismatchError(f"bmm shapes do not match: a {list(sa)} @ b {list(sb)} (need a [B, M, K], "
                                   f"b [B, K, N])")
    if str(a.dtype) != str(b.dtype):  # before the served dtype: fp32 @ fp64 is a mismatch, as torch says
        raise OperandMismatchError(f"bmm operands must share a dtype: a is {a.dtype}, b is {b.dtype}")
    dt = dt_name(a.dtype)
    batch, m, k = (size(d) for d in sa)
    return batch, m, size(sb[2]), k, dt


def work(sig: Signature, m: int) -> tuple[float, float]:
    """(2*B*M*N*K flops, bytes of a + b + c)."""
    bt, n, k = sig.get("B"), sig.get("N"), sig.get("K")
    return 2.0 * bt * m * n * k, float(bt * (m * k + k * n + m * n) * elem_bytes(sig.dt))
