"""Timing whole forwards for bench/e2e.py: CUDA-event medians, graph capture with an output check,
and paired rounds (a variant and its anchor alternating, so drift hits both alike)."""
from __future__ import annotations

import contextlib
import math
import statistics
from typing import Any, Callable


def output_tensor(out: Any) -> Any:
    """The tensor a forward returned (transformers' ModelOutput: its first field)."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    for attr in ("last_hidden_state", "logits"):
        if getattr(out, attr, None) is not None:
            return getattr(out, attr)
    if isinstance(out, (tuple, list)) and out:
        return output_tensor(out[0])
    raise TypeError(f"cannot find the output tensor of a {type(out).__name__}")


def cell(status: str, ms: float | None = None, **extra) -> dict:
    return {"status": status, "ms": ms, **extra}


def rel_err(out, ref) -> float:
    a, b = output_tensor(out).float(), ref.float()
    if a.shape != b.shape:
        return math.inf
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def sync() -> None:
    __import__("torch").cuda.synchronize()


def quiet_compile_workers() -> None:
    """Shut Inductor's compile-worker pool down (the next compile starts a new one): after a
    compile its workers stay up until they quiesce, and a host-bound eager row timed beside them
    read 1.5x slower (BENCHMARKS.md, session 4). Called after each compile, before timing."""
    from torch._inductor import async_compile

    shutdown = getattr(async_compile, "shutdown_compile_workers", None)
    if shutdown is not None:
        shutdown()


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic collector off for a timed block, back on (if it was) after it. An eager
    forward of a transformers model is host-bound (2.6 ms on the host for 0.45 ms of GPU work at
    Llama b1), so a collection that lands inside one timed forward moves that sample by
    milliseconds; with it off, collections run between blocks."""
    import gc

    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def median_ms(step: Callable[[], Any], n: int) -> float:
    """Median of n CUDA-event times of step(), each bracketed by its own pair of events."""
    import torch

    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    sync()
    with gc_paused():
        for start, end in ev:
            start.record()
            step()
            end.record()
        sync()
    return statistics.median(s.elapsed_time(e) for s, e in ev)


def time_eager(fn, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    return median_ms(fn, iters)


def graph_of(fn, warmup: int, keep: list | None = None):
    """fn captured in a CUDA graph after `warmup` calls on a side stream (fn's output of the
    captured call is appended to `keep` when given)."""
    from tunedb.measure.cudagraph import capture

    return capture(fn, warmup=warmup, keep=keep)


def capture(fn, warmup: int, ref, tol: float):
    """(graph, err) of fn captured after warm-up on a side stream, or a failure cell."""
    outs: list = []
    try:
        graph = graph_of(fn, warmup, outs)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be captured is reported, not fatal
        return cell("n/a", note=f"capture failed: {type(exc).__name__}: {str(exc)[:120]}")
    out = outs[0]
    graph.replay()
    sync()
    err = rel_err(out, ref)
    if not err < tol:
        return cell("wrong", err=err, note="captured graph output")
    return graph, err


def time_graph(fn, replays: int, warmup: int, ref, tol: float) -> dict:
    got = capture(fn, warmup, ref, tol)
    if isinstance(got, dict):
        return got
    graph, err = got
    return cell("ok", median_ms(graph.replay, replays), err=err)


def paired_rounds(steps: dict[str, Callable[[], Any]], rounds: int, time_block: Callable[[Any], float],
                  seed: int = 0, warmup: int = 0) -> dict[str, list[float]]:
    """Each step's `rounds` block times (time_block(step)); every round times every step once, in
    a seeded shuffled order, so clock, thermal and host drift during the run hit all alike. With
    `warmup`, each block is preceded by that many untimed calls of its step: the first call after
    switching from another step (its caches, the allocator's blocks) is not timed."""
    import random

    from tunedb.measure.stats import round_order

    rng = random.Random(seed)
    names = list(steps)
    per: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(rounds):
        names = round_order(names, rng)
        for k in names:
            for _ in range(warmup):
                steps[k]()
            per[k].append(time_block(steps[k]))
    return per


def paired_ms(steps: dict[str, Callable[[], Any]], rounds: int, per_round: int, seed: int = 0,
              warmup: int = 0) -> dict[str, float]:
    """Each step's median over `rounds` of its per-round median CUDA-event time (paired_rounds)."""
    per = paired_rounds(steps, rounds, lambda step: median_ms(step, per_round), seed, warmup)
    return {k: statistics.median(v) for k, v in per.items()}


def round_ratios(per: dict[str, list[float]], anchor: str) -> dict[str, list[float]]:
    """Per round, anchor's block time over each other step's: ratios of two blocks timed next to
    each other, so drift between rounds (the host's clock, a busy neighbour) cancels in each."""
    return {k: [a / v for a, v in zip(per[anchor], per[k])] for k in per if k != anchor}


def paired_speedups(steps: dict[str, Callable[[], Any]], anchor: str, rounds: int, per_round: int,
                    seed: int = 0, warmup: int = 1) -> tuple[dict[str, float], dict[str, list[float]]]:
    """({step: median block ms}, {step: per-round anchor/step ratios}) of paired_rounds with a
    warm-up call before each block; a step's speedup over the anchor is the median of its ratios."""
    per = paired_rounds(steps, rounds, lambda step: median_ms(step, per_round), seed, warmup)
    return {k: statistics.median(v) for k, v in per.items()}, round_ratios(per, anchor)


@contextlib.contextmanager
def pinned(config_id: str):
    """Serve every tuned shape with one config (a launch-table override) while open; yields it."""
    from tunedb.families.gemm import FAMILY
    from tunedb.runtime import launch_table

    cfg = FAMILY.parse_config(config_id)
    with launch_table.overriding(lambda fam, sig, m: (cfg, "pinned")):
        yield cfg


def rounds_args(doc: str, argv=None, models: tuple[str, ...] = ()):
    """The paired-round benches' arguments (--out, --rounds, --per-round; chain_pdl_e2e.py,
    sibling_fusion_probe.py; with `models`, --model: one of them, the first by default), parsed."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    if models:
        ap.add_argument("--model", choices=models, default=models[0])
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per-round", type=int, default=20)
    return ap.parse_args(argv)


def run_env(label: str, t0: float) -> dict:
    """The GPU, torch version, wall seconds since t0 and the bench model's label (a result's env)."""
    import time

    import torch

    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "wall_s": round(time.time() - t0, 1),
            "model": label}


def write_result(out: str | None, env: dict, rows: dict) -> None:
    """Print env; with --out, write {"env", "rows"} there as JSON."""
    import json

    print(env)
    if out:
        with open(out, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1, default=str)
