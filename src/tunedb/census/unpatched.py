"""Calls a census sees that no module optimize() swaps reaches: keyed, never served.

A family's census rule keys such a call with op UNPATCHED and a `src` field saying why (one of
WHY's keys). No family lists the op, so a build measures nothing for it and `tunedb tune`
lists it as seen, not patched, with WHY's words, instead of planning a gain that is never served.
The GEMM family keys its products this way (families/gemm/census_rules.py; docs/unseen_shapes.md).
"""
from __future__ import annotations

UNPATCHED = "unpatched"
WHY: dict[str, str] = {
    "conv1d": "a Conv1D-style [in, out] weight (the kernels read [out, in]; a copy per call)",
    "call": "F.linear, a packed in-projection (nn.MultiheadAttention) or a hooked/subclassed "
            "nn.Linear (no module optimize() swaps)",
}
