"""A TunedLinear's memo of the sizes its served config yields to F.linear outside graph capture.

The GEMM family's eager rule (runtime/host_bound.py) serves a shape's eager calls with torch where
the tuned config's kernel is shorter than its launch's host time; the bound launcher then asks
per call whether the stream is capturing and calls torch's arm. That path (the entry checks, the
call key, the capture question, the arm's frame) cost +5.3 us a call in place in a
tensor-parallel shard's decode step, against +1.4 us in a loop of its own (session 44 call 1,
H100, bench/tp_shard_trace.py: CPU caches are cold between layers of a real model, so each Python
step costs more there). Once such a size has run eagerly (the first eager call primes the tuned
kernel: host_bound.graph_only), the layer remembers it here and answers its later eager calls on a
default stream with F.linear straight away (what the torch arm computes for a GEMM without an
activation), counting the call on the same Bound so that tuning_report() still sees it. A size
whose config is the torch arm itself (the bound's `direct` is F.linear) is remembered at its first
eager call likewise (session 45): the memo's lookup costs less than the call key and the entry
checks it replaces. A Linear fused with the activation after it (fused_pair.py) keeps such sizes
too (session 58): answered by F.linear, its slot then applies the model's activation module, the
two kernels the torch arm of the fused key runs, with none of the fused call's host path.

A memo holds for one generation of the launch table's call memo (launch_table.generation: a new
epoch, an override, a recorder each start a new one) and one weight Parameter, held by its id()
so that the memo never keeps a replaced weight alive (an id reused by a later Parameter can only
send that layer's eager calls to F.linear, which computes the same thing). Only a layer whose
weight is a Parameter in its own _parameters keeps one: a parametrization's weight is a new
tensor every call. A sibling member keeps only sizes its group declines eagerly on a default
stream (the group's `quiet` set: it launches for none of those outside a capture). A
compiler's trace never reads the memo (its fields would become guards). Never pickled or copied:
a copy starts empty.
"""
from __future__ import annotations

from typing import Any


class EagerSizes:
    """(x.shape, x.dtype, bias is None) -> the Bound whose eager calls F.linear answers, for one
    generation and weight."""

    __slots__ = ("generation", "weight", "bounds")

    def __init__(self, generation: int = -1, weight: int = 0) -> None:
        self.generation = generation
        self.weight = weight  # id() of the weight Parameter
        self.bounds: dict[tuple[Any, Any], Any] = {}

    def __reduce__(self) -> tuple[Any, tuple[()]]:  # pickle and deepcopy: an empty memo
        return (EagerSizes, ())


def note(d: dict[str, Any], x: Any, weight: Any, bias: Any, bound: Any, generation: int) -> None:
    """Remember x's shape (with its dtype and whether the call has a bias: the call key's op) in the
    layer's memo (its __dict__ `d`) as answered by F.linear eagerly."""
    memo = d.get("_eager_sizes")
    if memo is None or memo.generation != generation or memo.weight != id(weight):
        memo = d["_eager_sizes"] = EagerSizes(generation, id(weight))
    memo.bounds[(x.shape, x.dtype, bias is None)] = bound
