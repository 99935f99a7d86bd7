"""The analytic GEMM cost model: pure Python, no torch (calibration.py fits its parameters, which
model_params.py holds).

    T(c; M,N,K) = sum over waves of max(c * (a_c + b_c * k), a_c + k * lat / (stages - 1))
                  + R_c + launches * (L + kernel_us),                    T >= bytes / BW

A full wave of ``sms * r`` tiles puts c = r CTAs on each SM; the partial wave c = ceil(rem / sms),
because its CTAs spread over free SMs instead of sharing one. A wave is throughput-bound (its c
CTAs share the SM) or latency-bound (a CTA keeps stages - 1 loads in flight, so one K iteration
waits at least lat / (stages - 1), and co-resident CTAs overlap their waits). a_c is a CTA's fixed
cost (prologue + epilogue), b_c the cost of one K iteration (the slower of its tensor-core work at
one SM's share of the peak and its tile traffic at one SM's share of the L2 bandwidth). R_c is the
split-K reduction (workspace written and read at DRAM bandwidth plus one launch); launches is 1, or
2 with split-K. The calibration fits (a_c, b_c) per measured config over its throughput-bound
points, a global scale for every config it did not fit, and the vendor arms' level and overhead.
Sentinels: 'torch' and 'fused' are the best of a few vendor-like tiles (split-K ones for skinny
shapes) at their own fitted level; 'default' and 'heuristic' are the family's default_config.
An activation (gemm_act, act != none) adds torch's separate elementwise kernel to 'torch' and its
fused epilogue to every Triton CTA (act_cost.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Sequence, Union

from tunedb import settings
from tunedb.errors import ConfigError
from tunedb.families.gemm import act_cost, confidence, configs_gemv, decode_cost
from tunedb.families.gemm.model_params import ModelParams
from tunedb.families.gemm.configs import VENDOR_LANES
from tunedb.records import ArchProfile, Config, Signature, Status

Shape = tuple[int, int, int]
ShapeArg = Union[Shape, tuple[Signature, int]]
Validity = Callable[[Config, Signature, "int | None", ArchProfile], "str | None"]
DefaultOf = Callable[[Signature, ArchProfile], Config]  # family.default_config

# bytes per element of a signature's dt (the build's weight working set uses it too)
ELEM_BYTES = {"half": 2, "fp16": 2, "bf16": 2, "fp32": 4, "int8": 1, "fp8": 1}
_MAX_WARPS_PER_SM = 64
_MAX_CTAS_PER_SM = 32
_MAX_REGS_PER_THREAD = 255

# Tiles a vendor library would pick from; 'torch' costs the best of them at the 'torch' lane's
# efficiency. cuBLAS splits K for skinny, deep problems, so the small tiles come split as well.
_TORCH_TILES: tuple[tuple[int, int, int, int], ...] = (
    (64, 64, 64, 4), (64, 128, 64, 4), (128, 128, 64, 8), (128, 256, 64, 8),
)
_TORCH_SPLITS: tuple[int, ...] = (2, 4, 8, 16)


@dataclass(frozen=True)
class _Tile:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int
    split_k: int
    lane: str


def _tile_of(config: Config) -> _Tile:
    block = config.param("block")
    if not (isinstance(block, (list, tuple)) and len(block) == 3
            and all(isinstance(v, int) and v > 0 for v in block)):
        raise ConfigError(f"config {config.id!r} needs block=(bm, bn, bk) of positive ints, got {block!r}")
    values = {}
    for key, default in (("warps", 4), ("stages", 2), ("split_k", 1)):
        v = config.param(key, default)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"config {config.id!r} has {key}={v!r}; expected a positive int")
        values[key] = v
    return _Tile(block[0], block[1], block[2], values["warps"], values["stages"],
                 values["split_k"], config.lane)


def _shape_of(shape: ShapeArg) -> tuple[int, int, int, str, Signature | None]:
    if len(shape) == 2 and isinstance(shape[0], Signature):
        sig, m = shape
        n, k = sig.get("N"), sig.get("K")
        if not isinstance(n, int) or not isinstance(k, int):
            raise ConfigError(f"signature {sig} needs integer N and K for the cost model")
        return int(m), n, k, sig.dt, sig
    if len(shape) == 3 and all(isinstance(v, int) for v in shape):
        m, n, k = shape
        return m, n, k, "half", None
    raise ConfigError(f"shape must be (M, N, K) ints or (Signature, M), got {shape!r}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def occupancy(t: _Tile, arch: ArchProfile, elem: int) -> int | Status:
    """Resident CTAs per SM from shared memory, warps and an accumulator register estimate."""
    smem = t.stages * (t.bm + t.bn) * t.bk * elem
    if smem > arch.smem_per_block:
        return Status.INFEASIBLE
    threads = 32 * t.warps
    regs_thread = min(_MAX_REGS_PER_THREAD, _cdiv(t.bm * t.bn, threads) + 64)
    by_regs = arch.regs_per_sm // (regs_thread * threads)
    r = min(arch.smem_per_sm // max(smem, 1), _MAX_WARPS_PER_SM // t.warps, by_regs, _MAX_CTAS_PER_SM)
    return max(1, r)


def default_line(t: _Tile, arch: ArchProfile, params: ModelParams, elem: int) -> tuple[float, float]:
    """(a_us, b_us) derived from the arch profile: a CTA's fixed cost and its cost per K iteration."""
    eff = params.lane_eff.get(t.lane, params.lane_eff.get("triton_mma", 0.55))
    peak = (arch.bf16_tflops if elem == 2 else arch.fp16_tflops) * 1e6  # flops per us
    flop_us = 2.0 * t.bm * t.bn * t.bk / (peak / arch.sms * eff)
    sm_bw = arch.dram_bw_gbs * 1e3 * params.l2_bw_factor / arch.sms  # bytes per us per SM
    mem_us = (t.bm + t.bn) * t.bk * elem / sm_bw
    b = max(flop_us, mem_us) if t.stages >= 2 else flop_us + mem_us
    epilogue_us = t.bm * t.bn * elem / (arch.dram_bw_gbs * 1e3 / arch.sms)
    return params.setup_us + epilogue_us, b


@dataclass(frozen=True)
class Terms:
    """The decomposition of one prediction (useful to tests and to the calibration)."""

    wave_slots: int  # W_eff: CTA times along the critical path
    k_iters: int
    fixed_us: float  # R_c + launches * L: what the per-config line does not scale
    floor_us: float
    full_waves: int = 0  # waves of sms * r tiles ...
    resident: int = 1  # ... r CTAs per SM each
    partial: int = 0  # CTAs per SM in the last, partial wave (0: none)
    stages: int = 2

    def line_us(self, a: float, b: float, latency_us: float) -> float:
        """The waves' time for a CTA line (a, b). A wave is throughput-bound (its c CTAs per SM
        share the SM: c * (a + b * k)) or latency-bound: with `stages` buffers a CTA keeps
        stages - 1 loads in flight, so one K iteration takes at least latency / (stages - 1), and
        CTAs sharing an SM overlap those waits instead of adding them (decode GEMMs streaming weights)."""
        if latency_us <= 0 or (self.full_waves == 0 and self.partial == 0):
            return self.wave_slots * (a + b * self.k_iters)
        one = a + b * self.k_iters
        waiting = a + latency_us / max(self.stages - 1, 1) * self.k_iters
        out = self.full_waves * max(self.resident * one, waiting)
        return out + (max(self.partial * one, waiting) if self.partial else 0.0)

    def throughput_bound(self, a: float, b: float, latency_us: float) -> bool:
        return self.line_us(a, b, latency_us) <= self.wave_slots * (a + b * self.k_iters) * (1 + 1e-9)


def terms(config: Config, shape: ShapeArg, arch: ArchProfile) -> Terms | Status:
    m, n, k, dt, _ = _shape_of(shape)
    t = _tile_of(config)
    elem = ELEM_BYTES.get(dt, 2)
    k_tiles = _cdiv(k, t.bk)
    if t.split_k > k_tiles:
        return Status.INFEASIBLE
    r = occupancy(t, arch, elem)
    if isinstance(r, Status):
        return r
    tiles = _cdiv(m, t.bm) * _cdiv(n, t.bn) * t.split_k
    slots = arch.sms * r
    full, rem = divmod(tiles, slots)
    wave_slots = full * r + _cdiv(rem, arch.sms)
    bw = arch.dram_bw_gbs * 1e3  # bytes per us
    fixed = arch.launch_us_graph
    if t.split_k > 1:
        workspace = t.split_k * m * n * 4  # fp32 partials, written then read by the reduction
        r_c = 2 * workspace / bw + arch.launch_us_graph
        fixed += r_c + arch.launch_us_graph  # R_c + the second launch
    floor = ((m * k + n * k) * elem + m * n * elem) / bw
    return Terms(wave_slots, _cdiv(k_tiles, t.split_k), fixed, floor, full, r, _cdiv(rem, arch.sms), t.stages)


def _line(config: Config, arch: ArchProfile, params: ModelParams, elem: int) -> tuple[float, float]:
    if config.id in params.per_config:
        return params.per_config[config.id]
    a, b = default_line(_tile_of(config), arch, params, elem)
    return a * params.scale, b * params.scale


def _predict_us(config: Config, shape: ShapeArg, arch: ArchProfile, params: ModelParams) -> float | Status:
    if configs_gemv.is_gemv(config):
        return _gemv_us(config, shape, arch, params)
    tm = terms(config, shape, arch)
    if isinstance(tm, Status):
        return tm
    m, _, _, dt, sig = _shape_of(shape)
    t = _tile_of(config)
    act = act_cost.act_of(sig)
    # the fused activation: each CTA's epilogue on its tile
    epi = act_cost.epilogue_us(act, t.bm, t.bn, params.act_epilogue) if act is not None else 0.0
    fixed = tm.fixed_us + params.kernel_us * launches(config)
    if m <= decode_cost.DECODE_M and params.decode:
        dec = decode_cost.predict_us(params.decode, weight_bytes(shape), decode_flight(config, shape, arch),
                                     arch.dram_bw_gbs * 1e3)
    else:
        dec = None
    a, b = _line(config, arch, params, ELEM_BYTES.get(dt, 2))
    us = max(tm.line_us(a + epi, b, params.latency_us) + fixed, tm.floor_us)
    return us if dec is None else max(us, dec + tm.wave_slots * epi + fixed)


def _gemv_us(config: Config, shape: ShapeArg, arch: ArchProfile, params: ModelParams) -> float | Status:
    """A `gv` config: its weight read at the rate session 16 measured (decode_cost.gemv_us), plus
    the fused activation once per CTA slab on the busiest SM. Infeasible past M = 16 or with more
    splits than K tiles: where the family's predicate (its gemv part) refuses it, for callers
    that rank without the predicate."""
    m, n, k, dt, sig = _shape_of(shape)
    t = _tile_of(config)
    if configs_gemv.gemv_reason(config, n, k, m, dt) is not None:
        return Status.INFEASIBLE
    dot = bool(config.param("dot"))
    mp = configs_gemv.rows_padded(m, dot)
    us = decode_cost.gemv_us(n, k, mp, t.bn, t.bk, t.stages, t.warps, t.split_k, dot,
                             configs_gemv.smem_bytes(config), ELEM_BYTES.get(dt, 2), arch.sms,
                             arch.smem_per_sm, arch.dram_bw_gbs * 1e3)
    act = act_cost.act_of(sig)
    if act is not None:
        us += _cdiv(_cdiv(n, t.bn) * t.split_k, arch.sms) * act_cost.epilogue_us(act, mp, t.bn, params.act_epilogue)
    return us


def weight_bytes(shape: ShapeArg) -> float:
    """Bytes a call reads and writes: the weight, the activation and the output."""
    m, n, k, dt, _ = _shape_of(shape)
    return float((n * k + m * k + m * n) * ELEM_BYTES.get(dt, 2))


def decode_flight(config: Config, shape: ShapeArg, arch: ArchProfile) -> float:
    """Bytes the config keeps in flight at this shape (decode_cost.in_flight): CTAs resident at once."""
    m, n, _, dt, _ = _shape_of(shape)
    t = _tile_of(config)
    elem = ELEM_BYTES.get(dt, 2)
    r = occupancy(t, arch, elem)
    tiles = _cdiv(m, t.bm) * _cdiv(n, t.bn) * t.split_k
    resident = min(tiles, arch.sms * (r if isinstance(r, int) else 1))
    return decode_cost.in_flight(resident, t.stages, t.bm, t.bn, t.bk, m, elem)


def launches(config: Config) -> int:
    """Kernels a Triton config launches: the GEMM, and with split-K the reduction."""
    return 2 if _tile_of(config).split_k > 1 else 1


@lru_cache(maxsize=4)
def _torch_tiles(lane: str) -> tuple[Config, ...]:
    out = []
    for bm, bn, bk, w in _TORCH_TILES:
        for split in (1, *_TORCH_SPLITS) if bm == 64 else (1,):
            out.append(Config(f"{lane}_b{bm}x{bn}x{bk}_w{w}_k{split}", "torch",
                              (("block", (bm, bn, bk)), ("warps", w), ("stages", 4), ("split_k", split))))
    return tuple(out)


def _vendor_parts(name: str, shape: ShapeArg, arch: ArchProfile,
                  params: ModelParams) -> list[tuple[float, float, float]]:
    """(line_us, fixed_us, floor_us) of each feasible vendor tile: the line is unscaled."""
    elem = ELEM_BYTES.get(_shape_of(shape)[3], 2)
    out = []
    for c in _torch_tiles(name):
        tm = terms(c, shape, arch)
        if isinstance(tm, Status):
            continue
        a, b = default_line(_tile_of(c), arch, params, elem)
        out.append((tm.line_us(a, b, params.latency_us), tm.fixed_us, tm.floor_us))
    return out


def _vendor_us(parts: Sequence[tuple[float, float, float]], scale: float, overhead: float) -> float:
    return min(max(line * scale + fixed, floor) for line, fixed, floor in parts) + overhead


def _sentinel_fit(params: ModelParams, name: str) -> tuple[float, float]:
    """(scale, overhead_us) of a vendor arm: its own fit, else the torch arm's, else the global scale."""
    return params.sentinel.get(name) or params.sentinel.get("torch") or (params.scale, 0.0)


def predict(config: Config, shape: ShapeArg, arch: ArchProfile, params: ModelParams | None = None,
            *, default_config: DefaultOf | None = None) -> float | Status:
    """Predicted time in ms of `config` at shape (M, N, K) or (Signature, M); a Status when infeasible."""
    params = params or ModelParams()
    m, n, k, dt, sig = _shape_of(shape)
    if min(m, n, k) < 1:
        raise ConfigError(f"shape M={m}, N={n}, K={k} must be positive")
    if not config.is_sentinel:
        _tile_of(config)  # a malformed config: ConfigError naming the field, before the predicate
        if _invalid(config, sig or Signature.make("gemm", "gemm", dt, N=n, K=k), m, arch):
            return Status.INFEASIBLE  # THE validity predicate's no: a status, never a time
    else:
        if config.id in VENDOR_LANES:
            parts = _vendor_parts(config.id, shape, arch, params)
            if not parts:
                return Status.INFEASIBLE
            extra = act_cost.vendor_pass_us(config.id, act_cost.act_of(sig), m, n, ELEM_BYTES.get(dt, 2),
                                            arch, params.sentinel)
            return (_vendor_us(parts, *_sentinel_fit(params, config.id)) + extra) / 1000.0
        if default_config is None:
            raise ConfigError(f"predicting sentinel {config.id!r} needs default_config=family.default_config")
        config = default_config(sig or Signature.make("gemm", "gemm", dt, N=n, K=k), arch)
    us = _predict_us(config, shape, arch, params)
    return us if isinstance(us, Status) else us / 1000.0


def _invalid(config: Config, sig: Signature, m: int, arch: ArchProfile) -> str | None:
    """The family's validity predicate (configs.invalid_reason) on a Triton config at (sig, m)."""
    from tunedb.families.gemm import configs  # lazily: configs is the predicate's module

    return configs.invalid_reason(config, sig, m, arch)


def rank(configs: Iterable[Config], M: int, N: int, K: int, arch: ArchProfile, k: int = 16,
         validity: Validity | None = None, params: ModelParams | None = None, *, dt: str = "half",
         default_config: DefaultOf | None = None, sig: Signature | None = None) -> list[tuple[Config, float]]:
    """The k fastest predicted configs that the validity predicate accepts, fastest first
    (ties by config id). Sentinels go through the predicate too ('fused' does not serve every
    signature); 'default' and 'heuristic' are skipped when no default_config is given. `sig`,
    when the caller has it, is the op the predicate judges (else a plain GEMM of N, K, dt)."""
    sig = sig or Signature.make("gemm", "gemm", dt, N=N, K=K)
    m, k_top = M, k
    scored = []
    for c in configs:
        if c.id in ("default", "heuristic") and default_config is None:
            continue
        if validity is not None and validity(c, sig, m, arch) is not None:
            continue
        ms = predict(c, (sig, m), arch, params, default_config=default_config)
        if not isinstance(ms, Status):
            scored.append((ms, c.id, c))
    scored.sort(key=lambda x: (x[0], x[1]))
    return [(c, ms) for ms, _, c in scored[:k_top]]


def make_decider(arch: ArchProfile, params: ModelParams | None, validity: Validity | None,
                 default_config: DefaultOf | None = None,
                 fallback: str = "torch") -> Callable[[Signature, int, tuple[Config, ...]], "confidence.Decision | None"]:
    """The model tier's decision at (sig, m) among candidates: confidence.serve() over the
    candidates ranked by predicted time. When the fallback is a candidate, a config serves only
    where the shape lies near one its regime's band was measured on and its predicted speedup
    over the fallback, less that band, exceeds params.torch_margin (or, with
    TUNEDB_MODEL_LOCAL_BAND=1, its local band does); a model without bands declines every config."""
    p = params or ModelParams()

    def decide(sig: Signature, m: int, candidates: tuple[Config, ...]) -> "confidence.Decision | None":
        n, k = sig.get("N"), sig.get("K")
        if not isinstance(n, int) or not isinstance(k, int):
            return None
        ranked = rank(candidates, m, n, k, arch, len(candidates), validity, params, dt=sig.dt,
                      default_config=default_config, sig=sig)
        return confidence.serve(ranked, fallback, p.uncertainty, (m, n, k, ELEM_BYTES.get(sig.dt, 2)),
                                p.torch_margin, support=p.support,
                                epilogue=confidence.epilogue_kind(sig.get("act")),
                                local=p.local if settings.model_local_band_enabled() else None)
    return decide


def make_ranker(arch: ArchProfile, params: ModelParams | None, validity: Validity | None,
                default_config: DefaultOf | None = None) -> Callable[[Signature, int, tuple[Config, ...]], Config | None]:
    """The selector's cost-model tier: ranker(sig, m, candidates) -> the config make_decider's
    rule serves (the predicted-fastest valid config, or 'torch' where the model does not know)."""
    decide = make_decider(arch, params, validity, default_config)

    def ranker(sig: Signature, m: int, candidates: tuple[Config, ...]) -> Config | None:
        d = decide(sig, m, candidates)
        return d.config if d is not None else None
    return ranker
