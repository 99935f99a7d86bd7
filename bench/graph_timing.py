"""The benches' CUDA-graph timing: n calls captured in one graph, median per-call time over replays.

    from graph_timing import replay_ms
    ms = replay_ms(lambda i: fn(x, weights[i % len(weights)]), n)

The caller warms its calls up first (compiles, allocator, rotation copies). One replay runs
before timing; each of `reps` replays is timed by CUDA events around it. A bench that captures
its own graph (to keep its output, or the graph) times it with replayed_ms(graph, reps, per).
"""
from __future__ import annotations

import statistics
from typing import Callable


def replay_ms(body: Callable[[int], object], n: int, reps: int = 7) -> float:
    """body(0) .. body(n - 1) captured in one CUDA graph; the median over `reps` timed replays of
    the replay's time / n, in milliseconds."""
    import torch

    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            body(i)
    g.replay()
    torch.cuda.synchronize()
    return replayed_ms(g, reps, n)


def replayed_ms(graph: object, reps: int, per: int = 1) -> float:
    """The median over `reps` replays of `graph` (captured and warmed by the caller), each timed
    by CUDA events around it, divided by `per` (the calls captured in it), in milliseconds."""
    import torch

    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / per)
    return statistics.median(times)
