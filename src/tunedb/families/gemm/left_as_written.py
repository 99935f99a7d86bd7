"""Linears optimize() leaves as written because torch would serve them at every size, and the
report's words for why (patching.py asks, per key, once per optimize() call): measured so in a
tier, or a key no table measured that the cost model declines at every probed size (GUESSED:
autotune() or prewarm measures those), or a weight of a dtype the GEMM family does not tune.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tunedb import settings
from tunedb.errors import SettingsError
from tunedb.runtime.fallback_everywhere import GUESSED, MEASURED


LEFT_WHY = "torch serves every size"
LEFT_WHY_GUESSED = ("{n} of them because no table measured their key and the cost model declines it: "
                    "autotune() or tunedb.prewarm(model, inputs) measures them")


LEFT_WHY_WIDE = ("{n} of them hold {dtypes} weights, which the GEMM family serves only once the model "
                 "is cast to fp16 or bf16 (prewarm and autotune find nothing to measure before)")


LEFT_WHY_CAST = ("{n} of them were cast to {dtypes} since optimize() decided: run tunedb.optimize(model) "
                 "again to serve them")


def _dtype_now(item: Any) -> Any:
    """The weight dtype of a left (module, key, guessed) item as the module holds it now."""
    weight = getattr(item[0], "weight", None)
    return weight.dtype if isinstance(weight, torch.Tensor) else item[1][1]


def left_why(left: Any) -> str:
    """Why the (module, key, guessed) items are left, read when the report is made: a model cast
    after optimize() (`.half()`) says so rather than the dtype its keys were made in."""
    left = list(left)
    half = (torch.float16, torch.bfloat16)
    cast = [item for item in left if _dtype_now(item) != item[1][1]]  # key: (op, dtype, n, k, act, has_bias)
    left = [item for item in left if item not in cast]
    wide = [item for item in left if item[1][1] not in half]
    guessed = sum(1 for item in left if item[2] and item[1][1] in half)
    why = LEFT_WHY + (f"; {LEFT_WHY_GUESSED.format(n=guessed)}" if guessed else "")
    if wide:
        dtypes = "/".join(sorted({str(item[1][1]).replace("torch.", "") for item in wide}))
        why += f"; {LEFT_WHY_WIDE.format(n=len(wide), dtypes=dtypes)}"
    if cast:
        dtypes = "/".join(sorted({str(_dtype_now(item)).replace("torch.", "") for item in cast}))
        why += f"; {LEFT_WHY_CAST.format(n=len(cast), dtypes=dtypes)}"
    return why


def key_of(linear: nn.Linear, act: str) -> tuple[Any, ...]:
    """The table_key() a TunedLinear of `linear` (fused with `act`) would have."""
    has_bias = linear.bias is not None
    op = "gemm" if not has_bias and act == "none" else "gemm_act"
    n, k = linear.weight.shape
    return (op, linear.weight.dtype, n, k, act, has_bias)


class TorchEverywhere:
    """Why tunedb would serve a Linear (fused with an act) with torch at every size, from the
    tiers present now (runtime/fallback_everywhere.left_reason: MEASURED, GUESSED, or None to
    swap), memoised per key for one optimize() call. The weight's dtype decides where it is
    fp16/bf16; any other dtype (an fp32 model cast after optimize()) must get torch under both.
    Never while optimize() patches everything (the census of `tunedb tune` must see every Linear
    as the run-time call it would make); GUESSED counts as swap with TUNEDB_LEAVE_UNMEASURED=0."""

    def __init__(self) -> None:
        from tunedb.runtime import patching

        self.off = patching.patching_everything()
        self.swap_guessed = not settings.leave_unmeasured()
        self.memo: dict[tuple[Any, ...], str | None] = {}

    def __call__(self, linear: nn.Linear, act: str) -> str | None:
        if self.off:
            return None
        key = key_of(linear, act)
        if key not in self.memo:
            self.memo[key] = torch_everywhere(key)
        got = self.memo[key]
        return None if got == GUESSED and self.swap_guessed else got


def torch_everywhere(key: tuple[Any, ...]) -> str | None:
    from tunedb.families.gemm import signatures
    from tunedb.runtime.fallback_everywhere import left_reason

    op, dtype, n, k, act, has_bias = key
    if n == 0 or k == 0:
        return None
    dts = [signatures._DT_OF_TORCH.get(str(dtype))] if str(dtype) in signatures._DT_OF_TORCH \
        else sorted(set(signatures._DT_OF_TORCH.values()))
    try:
        reasons = [left_reason(signatures.FAMILY, signatures.make_signature(op, dt, n, k, act, has_bias)) for dt in dts]
    except SettingsError:  # a bad TUNEDB_* value is the user's to fix: named, never swallowed
        raise
    except Exception:  # a tier or model that cannot answer: swap, as before
        return None
    if None in reasons:
        return None
    return GUESSED if GUESSED in reasons else MEASURED
