"""Eager calls whose kernel is shorter than the host time its launches cost.

The build measures kernels in CUDA graphs, where a launch costs the host nothing. Called eagerly
(no graph), a model issues every launch from Python, and a GEMM of a few microseconds runs
host-bound: the GPU waits for the next launch whatever the kernel saves, and a config that
issues more launches than the vendor call (split-K: a partial and a reduce kernel plus a
workspace allocation) makes the model slower (measured: Llama-3-8B decode b1 eager 0.90x of plain
with one split-K key, the same keys 1.01x in graphs; BENCHMARKS.md session 10, X1).

A single launch costs the host more through Triton's launcher than through cuBLAS's (session 43,
H100: a tensor-parallel shard's four served one-row q_proj calls made its eager step 7.5% slower
than the same calls as F.linear), so the GEMM family's rule also sends a config of as many
launches as torch's to torch eagerly where torch's kernel is shorter than a launch's host time.

A family's `eager_fallback(sig, m, config, profile, params)` hook names the sentinel that should
serve a shape's eager calls (None: the config serves every call). The bound launcher then asks,
per call, whether the current stream is capturing: captured calls (a CUDA graph, what the
measurement saw) get the tuned config, eager calls the fallback. Only shapes the hook flags pay
for that query (the current stream's handle, two C calls; torch's capture query only on a side
stream).
"""
from __future__ import annotations

from typing import Any, Callable


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


def _cuda() -> bool:
    """Whether CUDA graphs exist here at all (a CPU build cannot even ask about capture)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _default_stream_check() -> Callable[[], bool] | None:
    """A C-only question "is the current device on its default stream?" (nothing is captured
    there: torch refuses a capture on it), or None where this torch build has no such getters."""
    import torch

    raw, device = (getattr(torch._C, name, None) for name in ("_cuda_getCurrentRawStream", "_cuda_getDevice"))
    if raw is None or device is None:
        return None
    return lambda: raw(device()) == 0


def graph_only(tuned: Callable[..., Any], eager: Callable[..., Any], prime: bool = False) -> Callable[..., Any]:
    """A launcher serving `tuned` inside CUDA-graph capture and `eager` outside it. An eager call
    on a default stream (the usual eager model) is told by the stream handle alone; only a side
    stream asks torch whether it is capturing. With `prime`, the first eager call runs `tuned`
    once before `eager` (its outputs dropped): a capture after an eager warm-up then finds the
    tuned kernel loaded and its workspace made, where a first launch inside the capture would
    load it there (CUDA may refuse) and allocate there (fill kernels in every replay)."""
    on_default = _default_stream_check() if _cuda() else None
    primed = [] if prime else [True]

    def call(*args: Any, **kwargs: Any) -> Any:  # kwargs: runtime.dispatch passes an op's through
        if (on_default is not None and on_default()) or not _capturing():
            if not primed:
                primed.append(True)
                tuned(*args, **kwargs)
            return eager(*args, **kwargs)
        return tuned(*args, **kwargs)

    call.tuned, call.eager = tuned, eager  # type: ignore[attr-defined]
    return call


def eager_fallback(family: Any, sig: Any, m: int, config: Any, tier: str) -> str | None:
    """The sentinel id that serves this shape's eager calls, or None. Only the selector's tiers
    are judged (an override pins what it pins: autotune() measuring, a test), never a sentinel,
    and never when TUNEDB_EAGER_FALLBACK=0. A failing hook costs the rule, not the op."""
    from tunedb import settings
    from tunedb.families.contract import has_hook, hook

    if config.is_sentinel or tier not in ("user", "system", "model") or not has_hook(family, "eager_fallback"):
        return None
    if not settings.eager_fallback_enabled() or not _cuda():
        return None
    try:
        from tunedb.runtime import selector

        _, profile = selector.current_arch()
        if profile is None:
            return None
        return hook(family, "eager_fallback")(sig, m, config, profile, selector.model_params(family.name))
    except Exception:  # a broken model costs this rule only
        return None
