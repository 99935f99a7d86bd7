"""Compile-time selection for the tuned ops: what Inductor gets for ``tunedb::gemm`` and
``tunedb::gemm_act`` when it decomposes them (registered by the ops' fake kernels the first time a
compiler traces one on a real device).

Under torch.compile with static shapes, Inductor decomposes a tuned op whose shape the tiers
serve with a torch-level arm (torch: F.linear + activation; fused: _addmm_activation) into
those aten ops: the compiled graph then holds exactly what compiling the plain model would (the
activation fused into its neighbours, no dispatcher call per GEMM), and the op stays opaque only
where a Triton config was measured faster -- except at M=1 under coordinate-descent tuning,
where the compiler gets F.linear too (_compiler_reduces_vectors), and where the compiled forward
runs without CUDA graphs and the eager rule gives the pick's calls to torch (_yields_to_compiler,
_compiler_captures). The choice is the one a call
would get now (same tiers, kept in the launch table: the report names the tier's choice, which
for those M=1 shapes Inductor's reduction replaces in the compiled code). The entry points
pass the selection state's token (launch_table.compile_token) as the ops' `tiers` argument,
read once per trace as a constant:
it is part of the traced graph, so no compile cache (AOTAutograd's is keyed on that graph,
before this decomposition runs) returns choices made from another state; it is not guarded
on, so a compiled graph keeps its choices after tunedb.reload() (recompile to take a new
tier) and a changing tier never walks a model into Dynamo's recompile limit. Symbolic sizes,
an active autotune() or pin (overrides), census recording and TUNEDB_CAPTURE keep the op
opaque, resolved per call.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tunedb.families.gemm.configs import VENDOR_LANES
from tunedb.families.gemm.ops import ACTS, _check, _unserved
from tunedb.runtime import launch_table

registered = [False]  # the decompositions are in Inductor's table (idempotent registration)


def _decompose(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               act: str) -> Any:
    if _unserved(x):  # CPU or fp32, whatever the sizes: the torch arm is all _execute runs
        return ACTS[act](F.linear(x, weight, bias))
    if not launch_table.static_shapes(x, weight):
        return NotImplemented  # before any size comparison: a data-dependent size cannot take one
    _check(x, weight, bias, act)
    if weight.shape[1] == 0 or x.numel() == 0 or weight.shape[0] == 0:
        return ACTS[act](F.linear(x, weight, bias))  # what _execute runs for these
    bound = launch_table.traced(op, x, weight, bias, act)
    if bound is None:
        return NotImplemented  # the op stays in the graph, resolved per call
    if bound.config.id in VENDOR_LANES:  # torch ops: the compiler can take them
        return bound.call(x, weight, bias, None)
    if bound.m == 1 and _compiler_reduces_vectors():
        # an mm, which the compiler reduces (an addmm it would not); the bias is added to the
        # rounded product, one rounding more than the fused epilogue (within the dtype's tolerance)
        y = F.linear(x, weight)
        return ACTS[act](y if bias is None else y + bias)
    if not _compiler_captures() and _yields_to_compiler(op, bound, x, weight):
        # without CUDA graphs the compiled forward issues its kernels from the host one by one, as
        # an eager call does: the eager rule's torch arm (model.eager_fallback: a kernel shorter
        # than its host time) is what serves. Session 46 (H100, Llama-3-8B layers, default mode):
        # the decode picks kept as opaque ops made tunedb+compile 0.58x of compile alone
        return ACTS[act](F.linear(x, weight, bias))
    return NotImplemented  # a Triton config: the op stays in the graph


def _yields_to_compiler(op: str, bound: Any, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the eager rule gives this pick's calls to torch. For a fused epilogue it is asked
    about the bare product: Inductor fuses the bias and activation into the next pointwise kernel,
    so torch's form issues one launch there, not the two an eager call would (the rule keeps an
    epilogue pick eagerly for that launch)."""
    if bound.eager == "torch":
        return True
    if op == "gemm":
        return False
    from tunedb import families
    from tunedb.runtime import host_bound

    try:
        bare, _ = launch_table.signature_of("gemm", x, weight, None, "none")
        return host_bound.eager_fallback(families.get("gemm"), bare, bound.m, bound.config, bound.tier) == "torch"
    except Exception:  # noqa: BLE001 - the rule is lost, never the compile: the op stays
        return False


def _compiler_captures() -> bool:
    """Whether the compiled forward will run in CUDA graphs: Inductor records them
    (mode="reduce-overhead" sets triton.cudagraphs for the compile it patches), or
    TUNEDB_COMPILED_GRAPHS=1 says the user captures it by hand (otherwise such a capture gets
    cuBLAS for these shapes, as compile alone would)."""
    from torch._inductor import config as inductor_config

    from tunedb import settings

    if settings.compiled_graphs_forced():
        return True
    return bool(getattr(getattr(inductor_config, "triton", None), "cudagraphs", False))


def _compiler_reduces_vectors() -> bool:
    """Whether Inductor turns an M=1 GEMM into a reduction fused with its neighbours (its `mm`
    decomposition does under coordinate_descent_tuning, which max-autotune-no-cudagraphs sets).
    A Triton config was measured alone against cuBLAS, never against such a fusion, so at M=1
    tunedb gives the compiler the GEMM: in Llama-3-8B decode at batch 1 (H200, session 5) the
    opaque split-K picks cost 5.9 us per call beside Inductor's fused reductions. Session 6, one
    call, fresh compile caches each: with this rule the compiled forward replayed in 269.6 us
    against max-autotune's 290.9 (1.079x); keeping the picks opaque, 315.8 against 289.3."""
    from torch._inductor import config as inductor_config

    return bool(getattr(inductor_config, "coordinate_descent_tuning", False))


def _gemm_decomposition(x: torch.Tensor, weight: torch.Tensor, tiers: str = "") -> Any:
    return _decompose("gemm", x, weight, None, "none")


def _gemm_act_decomposition(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                            act: str = "none", tiers: str = "") -> Any:
    return _decompose("gemm_act", x, weight, bias, act)


def register_compile_decompositions() -> bool:
    """Add the tuned ops to Inductor's decomposition table (idempotent). Called by the fake
    kernels the first time a compiler traces a tuned op on a real device (Inductor's table
    costs ~1.5 s to import, so it is not done at import). False where this torch's Inductor has
    no such table: the ops then stay opaque, as before."""
    registered[0] = True
    from tunedb.families.gemm import siblings_compile

    decompositions = {torch.ops.tunedb.gemm.default: _gemm_decomposition,
                      torch.ops.tunedb.gemm_act.default: _gemm_act_decomposition,
                      torch.ops.tunedb.sibling.default: siblings_compile.decomposition}
    try:
        from torch._inductor import decomposition as inductor_decompositions
        from torch._inductor import lowering
    except Exception:  # an Inductor that fails to import: nothing to register with
        return False
    table = getattr(inductor_decompositions, "decompositions", None)
    if not isinstance(table, dict):
        return False
    try:  # where the decomposition keeps an op, Inductor lowers it to a call of the op (a
        # fallback kernel, with the layout constraint it would give a custom op by itself);
        # registered up front, because Inductor refuses to make one for an op it has a
        # decomposition for
        for op in (*decompositions, torch.ops.tunedb.siblings.default):
            if op not in lowering.lowerings:
                tag = lowering.get_layout_constraint_tag(op, with_default=True)
                lowering.make_fallback(op, layout_constraint=lowering.tag_to_layout_constraint(tag),
                                       override_decomp=True)
    except Exception:  # another Inductor: keep the ops opaque rather than break its lowering
        return False
    table.update(decompositions)
    cached = getattr(inductor_decompositions, "fast_random_decomps", None)  # a cached copy of it
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
    return True


