"""The linalg family's keys: `linalg|op=potrf|dt=fp32|n=8`, sized by the batch of problems.

Each op works on a batch of independent small problems laid out as `[batch, n, n]` matrices and
`[batch, n]` vectors (the caller's layout is taken as given):

    dot(x, y)    -> [batch]          x . y per problem
    gemv(A, x)   -> [batch, n]       A @ x
    gemm(A, B)   -> [batch, n, n]    A @ B
    potrf(A)     -> (L, info)        lower Cholesky factor, info[i] != 0 where A[i] is not SPD
    trsv(L, b)   -> [batch, n]       solve L x = b, L lower triangular (non-unit diagonal)
    posv(A, b)   -> (x, info)        solve A x = b for SPD A (Cholesky, then two triangular solves)

Pure Python: shapes and dtypes are read from tensors or metas without importing torch here.
"""
from __future__ import annotations

from typing import Any

from tunedb.errors import SignatureError
from tunedb.families.key_rules import check_one_device, size
from tunedb.records import Signature

FAMILY = "linalg"
OPS: tuple[str, ...] = ("dot", "gemv", "gemm", "potrf", "trsv", "posv")
SIZE_AXIS = "batch"
ARG_NAMES = {"dot": ("x", "y"), "gemv": ("A", "x"), "gemm": ("A", "B"), "potrf": ("A",), "trsv": ("L", "b"),
             "posv": ("A", "b")}
N_MIN, N_MAX = 2, 128
FLOAT_DTYPES: tuple[str, ...] = ("fp32", "fp64")
HALF_OPS: tuple[str, ...] = ("dot", "gemv", "gemm")  # the ops that also take fp16 / bf16
# Ops whose solver path overwrites its working copy of the input: measured on a ring of fresh
# systems (InputPolicy RING), never on their own output.
SOLVER_OPS: tuple[str, ...] = ("potrf", "posv")
# Ops whose inputs must be symmetric positive definite / lower triangular (the problem factory).
SPD_OPS: tuple[str, ...] = ("potrf", "posv")

_TORCH_NAMES = {"torch.float32": "fp32", "torch.float64": "fp64", "torch.float16": "fp16",
                "torch.bfloat16": "bf16",
                # torch's own aliases, as names ("double": torch.double is torch.float64)
                "torch.float": "fp32", "torch.double": "fp64", "torch.half": "fp16"}
_ELEMENT_BYTES = {"fp32": 4, "fp64": 8, "fp16": 2, "bf16": 2}


def dtypes_for(op: str) -> tuple[str, ...]:
    """The dtypes `op` serves."""
    return FLOAT_DTYPES + (("fp16", "bf16") if op in HALF_OPS else ())


def check(op: Any, dt: Any, n: Any) -> None:
    """SignatureError naming the bad value and what is allowed."""
    if op not in OPS:
        raise SignatureError(f"unknown linalg op {op!r}; allowed: {', '.join(OPS)}")
    if dt not in dtypes_for(op):
        raise SignatureError(f"linalg op {op} does not take dtype {dt!r}; allowed: {', '.join(dtypes_for(op))}")
    if not isinstance(n, int) or isinstance(n, bool) or not N_MIN <= n <= N_MAX:
        raise SignatureError(f"linalg n={n!r} must be an int from {N_MIN} to {N_MAX}")


def make_signature(op: str, dt: str, n: int) -> Signature:
    check(op, dt, n)
    return Signature(FAMILY, op, dt, (("n", n),))


def check_signature(sig: Signature) -> None:
    """The schema check of a parsed signature: family, key fields, op, dtype and n."""
    if not isinstance(sig, Signature) or sig.family != FAMILY:
        raise SignatureError(f"{sig!r} is not a linalg signature (linalg|op=OP|dt=DT|n=N)")
    keys = tuple(k for k, _ in sig.params)
    if keys != ("n",):
        raise SignatureError(f"linalg signature {sig} must have exactly the key field n, got {keys}")
    check(sig.op, sig.dt, sig.get("n"))


def dtype_key(dtype: Any) -> Any:
    """A dtype as the short name the keys use (fp32, fp64, fp16, bf16): a torch dtype or its
    name (torch.float32, "float32", "torch.float32") maps to it; anything else is returned as
    given, for check() to name."""
    if isinstance(dtype, str) and dtype in _ELEMENT_BYTES:
        return dtype
    text = str(dtype)
    return _TORCH_NAMES.get(text if text.startswith("torch.") else f"torch.{text}", dtype)


def dtype_name(dtype: Any) -> str:
    name = _TORCH_NAMES.get(str(dtype))
    if name is None:
        raise SignatureError(f"linalg ops take float32, float64 (and float16/bfloat16 for dot, gemv, gemm); "
                             f"got {dtype}")
    return name


def _shape(t: Any) -> tuple[Any, ...]:
    return tuple(size(d) for d in t.shape)


def _matrix(name: str, t: Any) -> tuple[int, int]:
    shape = _shape(t)
    if len(shape) != 3 or shape[1] != shape[2]:
        raise SignatureError(f"{name} must be a batch of square matrices [batch, n, n], got shape {shape}")
    return shape[0], shape[1]


def _vector(name: str, t: Any, batch: int, n: int) -> None:
    if _shape(t) != (batch, n):
        raise SignatureError(f"{name} must have shape [batch, n] = [{batch}, {n}], got {_shape(t)}")


def signature_of(op: str, *args: Any) -> tuple[Signature, int]:
    """(signature, batch) of one call from its tensors (or metas); SignatureError on bad shapes
    or dtypes, naming the value and what is allowed."""
    dt, n, batch = check_call(op, *args)
    return make_signature(op, dt, int(n)), int(batch)


def check_call(op: str, *args: Any, n_range: bool = True) -> tuple[str, Any, Any]:
    """(dtype name, n, batch) of one call after every check signature_of makes, with no traced
    size made concrete (the fake kernels' and the gradient form's check: a torch.compile'd call
    with a changing batch keeps one graph). n_range=False: every check but n's range (the entry
    points' calls past the family, which torch's forms run)."""
    if op not in OPS:
        raise SignatureError(f"unknown linalg op {op!r}; allowed: {', '.join(OPS)}")
    want = {"dot": 2, "gemv": 2, "gemm": 2, "potrf": 1, "trsv": 2, "posv": 2}[op]
    if len(args) != want:
        raise SignatureError(f"linalg {op} takes {want} tensor(s), got {len(args)}")
    for name, t in zip(ARG_NAMES[op], args):  # the dispatcher hands a None given for a Tensor through
        if getattr(t, "is_nested", False):  # strided layout too, but no sizes (torch's "Internal error")
            raise SignatureError(f"linalg {op}'s {name} must be a dense tensor, got a nested tensor; stack its "
                                 f"problems into one [batch, ...] tensor (torch.stack(t.unbind())) first")
        if not (hasattr(t, "shape") and hasattr(t, "dtype")):
            raise SignatureError(f"linalg {op}'s {name} must be a tensor, got {'None' if t is None else type(t).__name__}")
    check_one_device(f"linalg {op}", **dict(zip(ARG_NAMES[op], args)))
    for name, t in zip(ARG_NAMES[op], args):  # a sparse tensor failed deep in torch, or ran silently
        layout = getattr(t, "layout", None)
        if layout is not None and str(layout) != "torch.strided":
            raise SignatureError(f"linalg {op}'s {name} must be a dense (strided) tensor, got layout {layout}; "
                                 f"call .to_dense() first")
    first = args[0]
    if op == "dot":
        shape = _shape(first)
        if len(shape) != 2:
            raise SignatureError(f"dot's x must have shape [batch, n], got {shape}")
        batch, n = shape
        _vector("dot's y", args[1], batch, n)
    else:
        batch, n = _matrix(f"{op}'s {'L' if op == 'trsv' else 'A'}", first)
        if op == "gemm":
            if _shape(args[1]) != (batch, n, n):
                raise SignatureError(f"gemm's B must have shape [{batch}, {n}, {n}], got {_shape(args[1])}")
        elif op != "potrf":
            _vector(f"{op}'s {'x' if op == 'gemv' else 'b'}", args[1], batch, n)
    dts = {dtype_name(t.dtype) for t in args}
    if len(dts) != 1:
        raise SignatureError(f"linalg {op}'s tensors must share one dtype, got {sorted(dts)}")
    dt = dts.pop()
    if dt not in dtypes_for(op):
        raise SignatureError(f"linalg op {op} does not take dtype {dt!r}; allowed: {', '.join(dtypes_for(op))}")
    if n_range and not N_MIN <= n <= N_MAX:  # a traced n is guarded on the range, not specialised
        raise SignatureError(f"linalg {op}: n={n} (shape {_shape(first)}) is outside the family's range; "
                             f"n must be from {N_MIN} to {N_MAX}")
    return dt, n, batch


def work(sig: Signature, batch: int) -> tuple[float, float]:
    """(FLOPs, fewest bytes moved) of one call over `batch` problems: the memory floor's bytes
    read each input once (a triangular input: its lower triangle) and write each output once."""
    n, e = sig.get("n"), _ELEMENT_BYTES[sig.dt]
    tri = n * (n + 1) // 2
    flops, elems, extra = {
        "dot": (2 * n, 2 * n + 1, 0),
        "gemv": (2 * n * n, n * n + 2 * n, 0),
        "gemm": (2 * n ** 3, 3 * n * n, 0),
        "potrf": (n ** 3 / 3, tri + n * n, 4),  # L written whole (zeros above), int32 info
        "trsv": (n * n, tri + 2 * n, 0),
        "posv": (n ** 3 / 3 + 2 * n * n, tri + 2 * n, 4),
    }[sig.op]
    return float(flops * batch), float((elems * e + extra) * batch)
