"""What bench/e2e.py measures: the models, how one variant is checked and timed, and the tuning costs.

Models come from the census presets (tunedb.census.presets), built at reduced depth: the GEMM
shapes of one layer do not depend on how many layers there are, and the whole benchmark must fit
one 8-minute device call. The depth is lowered by editing the preset's published config for the
duration of one build (the preset reads it at build time) and checked on the built module, so
a preset that stops reading it fails loudly here instead of silently benchmarking 32 layers.

- whisper-large-v3: the encoder (conv front end + 4 of 32 layers), one 30 s window, batches 1, 8.
- llama-3-8b: embedding + 2 decoder layers + final norm, one decode step (one token per
  sequence, no KV cache: every Linear at M = batch), batches 1, 16, 64. The LM head is replaced
  by nn.Identity: the issue asks for two decoder layers, and the 128256x4096 head would be half
  of the time at batch 1.
- conformer: Conv2d subsampling front end + 4 of 16 Conformer layers, 30 s of 80-bin log-mel
  frames (749 positions), batch 8.

Measurements: measure (correctness, then eager and CUDA-graph timing of one variant; the tune is
e2e_tune.py), triton_autotune_cost, host_overhead, gpu_clocks; fresh_env points
the compilers' caches at empty directories so compile costs are cold, as on a new deployment.
"""
from __future__ import annotations

import contextlib
import math
import os
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from e2e_timing import (capture, cell, output_tensor, paired_ms, paired_speedups, pinned, rel_err,  # noqa: F401
                        sync, time_eager, time_graph)
from tunedb.census import presets
from tunedb.records import Point, ShapeSet

MODES = ("eager", "graph")


@dataclass(frozen=True)
class Spec:
    preset: str
    table: dict  # the preset's published config (edited for the duration of a build)
    depth_key: str
    layers: int
    quick_layers: int
    batches: tuple[int, ...]
    quick_batches: tuple[int, ...]
    length: int = 0  # input frames per sequence; 0: a decode step
    what: str = ""


SPECS: dict[str, Spec] = {
    "whisper-large-v3": Spec("whisper-large-v3", presets.WHISPER["whisper-large-v3"], "encoder_layers", 4, 2,
                             (1, 8), (1,), presets.WHISPER_FRAMES, "encoder, 30 s window (M = 1500 x batch)"),
    "llama-3-8b": Spec("llama-3-8b", presets.LLAMA_3_8B, "layers", 2, 2, (1, 16, 64), (1, 64), 0,
                       "2 decoder layers, decode step, no LM head (M = batch)"),
    "llama-3.2-3b": Spec("llama-3.2-3b", presets.LLAMA_3_2_3B, "layers", 2, 2, (1, 16, 64), (1, 16), 0,
                         "2 decoder layers, decode step, no LM head (M = batch)"),
    "conformer": Spec("conformer", presets.CONFORMER, "num_layers", 4, 2, (8,), (8,), 3000,
                      "encoder, 30 s of frames (M = 749 x batch)"),
}


@contextlib.contextmanager
def _depth(spec: Spec, layers: int) -> Iterator[None]:
    old, spec.table[spec.depth_key] = spec.table[spec.depth_key], layers
    try:
        yield
    finally:
        spec.table[spec.depth_key] = old


@dataclass
class BenchModel:
    """A plain module on a device, how to call it, and its inputs per benchmarked batch."""

    name: str
    impl: str
    layers: int
    full_layers: int
    batches: tuple[int, ...]
    module: Any  # the plain nn.Module (bf16, eval)
    runner: Callable[[Any], Callable[..., Any]]  # module (plain, optimized, compiled) -> model(*inputs)
    inputs: dict[int, tuple]

    @property
    def label(self) -> str:
        return f"{self.name} ({self.layers} of {self.full_layers} layers, {SPECS[self.name].what}, {self.impl})"

    def call(self, module: Any, batch: int) -> Callable[[], Any]:
        run, args = self.runner(module), self.inputs[batch]
        return lambda: run(*args)


def build(name: str, device: str, impl: str = "auto", quick: bool = False, seed: int = 0,
          attn: str = "sdpa", batches: tuple[int, ...] | None = None, layers: int | None = None) -> BenchModel:
    """The model `name` (a key of SPECS) at its benchmark depth on `device` (meta: no weights).

    layers: its depth, when not the spec's (a deeper model is less host-bound).
    attn: the attention a transformers model runs. The census preset asks for "eager" (so a
    census sees attention's matmuls); a deployment runs transformers' default, "sdpa"."""
    import torch
    from torch import nn

    if name not in SPECS:
        raise ValueError(f"unknown model {name!r}; models are {', '.join(SPECS)}")
    spec = SPECS[name]
    if layers is not None and (type(layers) is not int or layers < 1):
        raise ValueError(f"layers must be a positive int, got {layers!r}")
    layers = layers or (spec.quick_layers if quick else spec.layers)
    if batches is None:
        batches = spec.quick_batches if quick else spec.batches
    elif not batches or any(type(b) is not int or b < 1 for b in batches):
        raise ValueError(f"batches must be positive ints, got {batches!r}")
    torch.manual_seed(seed)
    with _depth(spec, layers):
        built = presets.workload(spec.preset).build(torch.device(device), impl)
    module, runner = built.model, (lambda m: m)
    if not isinstance(module, nn.Module):  # the preset wraps a transformers LM in a runner class
        module, runner = built.model.model, type(built.model)
    if hasattr(module, "lm_head"):
        module.lm_head = nn.Identity()
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "_attn_implementation"):
        config._attn_implementation = attn  # read at every forward
    else:
        attn = ""
    found = max((len(m) for m in module.modules() if isinstance(m, nn.ModuleList)), default=0)
    if found != layers:
        raise RuntimeError(f"{name}: built {found} layers, wanted {layers}; the preset no longer reads "
                           f"{spec.depth_key!r} from its config at build time")
    inputs = {}
    for b in batches:
        torch.manual_seed(seed + b)
        inputs[b] = built.decode_inputs(b) if spec.length == 0 else built.inputs(b, spec.length)
    impl = f"{built.impl}, {attn} attention" if attn else built.impl
    return BenchModel(name, impl, layers, spec.table[spec.depth_key], batches, module, runner, inputs)


def plain_and_tuned(name: str, device: str, batch: int, pin: str | None = None, compiled: bool = False,
                    plain_mode: str | None = None, tuned_options: dict | None = None,
                    plain_options: dict | None = None) -> tuple[BenchModel, Any, Any, contextlib.ExitStack]:
    """For the profiling benches: the model, its plain and tunedb.optimize()d modules (both
    torch.compile'd, default mode, when `compiled`; the plain one in `plain_mode` when given,
    e.g. max-autotune-no-cudagraphs; each with its Inductor options when given: torch.compile
    takes a mode or options, not both), and a context that serves every tuned shape with config
    `pin` while open (empty without one). ValueError names a batch not benchmarked."""
    import torch

    import tunedb

    bm = build(name, device, quick=False)
    if batch not in bm.inputs:
        raise ValueError(f"batch {batch} not benchmarked for {name}; choose from {sorted(bm.inputs)}")
    plain, tuned = bm.module, tunedb.optimize(bm.module, inplace=False)
    if compiled:
        plain = torch.compile(plain, dynamic=False, mode=plain_mode, options=plain_options or None)
        tuned = torch.compile(tuned, dynamic=False, options=tuned_options or None)
    stack = contextlib.ExitStack()
    if pin:
        stack.enter_context(pinned(pin))
    return bm, plain, tuned, stack


def tuned_points(bm: BenchModel, tuned_module: Any) -> ShapeSet:
    """The census of the benchmarked batches: every tuned-op call one forward per batch makes.

    Recorded from `tuned_module` (tunedb.optimize of the model), so the signatures are the ones
    the runtime resolves (fused gemm_act included). Every point is must-tune (graph rows capture
    it); eager_share is 0.5 because every batch is timed once eagerly and once captured."""
    import torch

    from tunedb.runtime import launch_table

    calls: Counter = Counter()
    with torch.no_grad():
        for b in bm.batches:
            with launch_table.recording() as seen:
                bm.call(tuned_module, b)()
            calls.update((sig, m) for fam, sig, m in seen if fam == launch_table.FAMILY)  # the family it tunes
    total = sum(calls.values())
    points = tuple(Point(sig, m, weight=n / total, calls=n, must_tune=True, eager_share=0.5)
                   for (sig, m), n in sorted(calls.items(), key=lambda kv: (kv[0][0].format(), kv[0][1])))
    # forwards: one per batch, so a build measures behind the model's whole weight working set
    return ShapeSet(points, bm.name, (("mode", "e2e"), ("batches", ",".join(map(str, bm.batches))),
                                      ("forwards", str(len(bm.batches)))))


def gemm_shapes(shapes: ShapeSet) -> list[tuple[int, int, int]]:
    """Distinct (M, N, K) of a census, largest work first: what Triton's autotuner keys on."""
    mnk = {(p.m, p.signature.get("N"), p.signature.get("K")) for p in shapes.points}
    return sorted(mnk, key=lambda s: (-s[0] * s[1] * s[2], s))


def mma_configs(shapes: ShapeSet, arch: Any) -> list[Any]:
    """The triton_mma configs of the space valid for every signature of the census."""
    from tunedb.families.gemm import configs

    sigs = shapes.signatures()
    return [c for c in configs.config_space(arch.arch_family, ("triton_mma",))
            if all(configs.invalid_reason(c, s, None, arch) is None for s in sigs)]


def triton_autotune_cost(shapes: list[tuple[int, int, int]], cfgs: list[Any], sample: int,
                         time_left: Callable[[], float]) -> dict[str, Any]:
    """Wall time of triton.autotune over `cfgs` (key M, N, K) on every shape, or an extrapolation.

    A fresh JITFunction of tunedb's triton_mma kernel (no in-memory binaries) under the caller's
    fresh TRITON_CACHE_DIR (no disk cache), so every config compiles as it would for a user. With
    `sample` < len(cfgs), an evenly spaced sample is autotuned: the first shape pays compile +
    benchmark, later shapes benchmark only; both scale linearly with the number of configs, so
    total = n_cfg * (first - later) / k + n_shapes * n_cfg * later / k, labeled extrapolated."""
    import torch
    import triton

    from tunedb.families.gemm import configs as gcfg
    from tunedb.families.gemm.kernels_common import NO_SPECIALIZE
    from tunedb.families.gemm.kernels_mma import gemm_mma_kernel

    step = max(1, math.ceil(len(cfgs) / max(1, sample)))
    chosen = cfgs[::step]
    tconfigs = []
    for c in chosen:
        bm, bn, bk = gcfg.blocks(c)
        tconfigs.append(triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": c.param("group_m")},
                                      num_warps=c.param("warps"), num_stages=c.param("stages")))
    kernel = triton.autotune(configs=tconfigs, key=["M", "N", "K"])(
        triton.jit(do_not_specialize=NO_SPECIALIZE)(gemm_mma_kernel.fn))
    walls: list[float] = []
    for i, (m, n, k) in enumerate(shapes):
        if i >= 2 and time_left() < 2 * (walls[-1] if walls else 0.0):
            break  # two shapes separate compile from benchmark; the rest are extrapolated
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kernel[lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)](x, w, y, x, m, n, k, 0, 0)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        del x, w, y
    k_cfg, n_cfg, n_shapes = len(chosen), len(cfgs), len(shapes)
    if k_cfg == n_cfg and len(walls) == n_shapes:
        return {"seconds": sum(walls), "how": f"measured: {n_cfg} configs x {n_shapes} shapes", "walls": walls}
    later = sum(walls[1:]) / len(walls[1:]) if len(walls) > 1 else walls[0]
    compile_s = max(0.0, walls[0] - later)
    total = n_cfg * compile_s / k_cfg + n_shapes * n_cfg * later / k_cfg
    return {"seconds": total, "walls": walls,
            "how": (f"extrapolated from {k_cfg} of {n_cfg} configs on {len(walls)} of {n_shapes} shapes "
                    f"(compile {compile_s / k_cfg:.2f} s/config, benchmark {later / k_cfg:.3f} s/config/shape)")}


def served(seen: list) -> dict:
    """How the tuned-op shapes one forward made were served: counts per tier and per config."""
    from tunedb.runtime import launch_table

    shapes = {(sig, m) for _fam, sig, m in seen}
    tiers: Counter = Counter()
    configs: Counter = Counter()
    for _key, bound in launch_table.entries():
        if (bound.signature, bound.m) in shapes:
            tiers[bound.tier] += 1
            configs[bound.config.id] += 1
    return {"tiers": dict(tiers), "configs": dict(configs)}


def measure(bm, module, batch: int, ref, args, anchor=None) -> dict:
    """{mode: cell} for one variant at one batch: correctness first, then eager and graph timing.
    args: tol, iters, warmup, replays, rounds. A tunedb variant's cells also say which tier and
    config served each of its shapes. With `anchor` (the plain model) each mode is timed paired:
    the variant and the anchor alternate in shuffled rounds, and the cell carries the anchor's
    time from those same rounds as plain_ms (its speedup never mixes two moments of the run)."""
    import torch

    from tunedb.runtime import launch_table

    fn = bm.call(module, batch)
    with torch.no_grad():
        try:
            with launch_table.recording() as seen:
                out = fn()
            sync()
        except Exception as exc:  # noqa: BLE001 - one variant failing is reported, not fatal
            bad = cell("error", note=f"{type(exc).__name__}: {str(exc)[:160]}")
            return {m: bad for m in MODES}
        err = rel_err(out, ref)
        del out
        if not err < args.tol:
            return {m: cell("wrong", err=err) for m in MODES}
        extra = served(seen) if seen else {}
        if anchor is None:
            eager = cell("ok", time_eager(fn, args.iters, args.warmup), err=err, **extra)
            return {"eager": eager, "graph": time_graph(fn, args.replays, args.warmup, ref, args.tol)}
        base = bm.call(anchor, batch)
        rounds = max(1, args.rounds)
        for _ in range(args.warmup):
            base()
            fn()
        t, ratios = paired_speedups({"v": fn, "plain": base}, "plain", rounds, max(1, args.iters // rounds), args.seed)
        eager = cell("ok", t["v"], err=err, plain_ms=t["plain"], **paired_ratio(ratios["v"]), **extra)
        got, got_base = capture(fn, args.warmup, ref, args.tol), capture(base, args.warmup, ref, args.tol)
        if isinstance(got, dict) or isinstance(got_base, dict):
            graph = got if isinstance(got, dict) else cell("n/a", note="the plain model's capture failed")
        else:
            t, ratios = paired_speedups({"v": got[0].replay, "plain": got_base[0].replay}, "plain", rounds,
                                        max(1, args.replays // rounds), args.seed)
            graph = cell("ok", t["v"], err=got[1], plain_ms=t["plain"], **paired_ratio(ratios["v"]))
        return {"eager": eager, "graph": graph}


def paired_ratio(ratios: list[float]) -> dict:
    """A cell's speedup over plain: the median of its per-round ratios, and their spread."""
    import statistics

    return {"ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}


def host_overhead(calls: int) -> dict:
    """ops.gemm (selection + launch) against bound.call (the launch alone) on a host-bound shape;
    the selection's cost is their paired difference (host_overhead.paired_overhead_us)."""
    import torch
    import torch.nn.functional as F
    from host_overhead import paired_overhead_us, per_call_us

    from tunedb.families.gemm import ops

    from tunedb.runtime import launch_table

    m, n, k = 8, 256, 256
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
    with torch.no_grad():
        for _ in range(20):
            ops.gemm(x, w)
        bound = launch_table.launcher("gemm", x, w, None, "none", m)
        rows = {"F.linear": lambda: F.linear(x, w), "bound launcher": lambda: bound.call(x, w, None, None),
                "tunedb.families.gemm.ops.gemm": lambda: ops.gemm(x, w)}
        us = {name: per_call_us(fn, calls, 5, sync) for name, fn in rows.items()}
        selection = paired_overhead_us(rows["tunedb.families.gemm.ops.gemm"], rows["bound launcher"], calls, 20, sync)[2]
    return {"shape": [m, n, k], "config": bound.config.id, "tier": bound.tier, "us_per_call": us,
            "selection_us": selection}


@contextlib.contextmanager
def fresh_env(**paths: str):
    """Point cache variables (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) at fresh dirs, then restore."""
    saved = {k: os.environ.get(k) for k in paths}
    os.environ.update(paths)
    try:
        yield
    finally:
        os.environ.update({k: v for k, v in saved.items() if v is not None})
        for k in [k for k, v in saved.items() if v is None]:
            del os.environ[k]


def gpu_clocks() -> str:
    q = "name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active"
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip() or "n/a"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"n/a ({type(exc).__name__})"
