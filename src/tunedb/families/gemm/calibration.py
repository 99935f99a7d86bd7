"""The cost model's calibration from measurement logs: pure Python, no torch.

fit() takes measured medians (records.Measurement) and returns costmodel.ModelParams: per measured
config its own (a_c, b_c) over the points where the latency bound does not bind, a global scale for
every config it did not fit, and the vendor arms' (torch, fused) level and per-call overhead.
merge() combines the model a database file already ships with a new build's fit, so a file built
by several builds carries one model; geomean_error() scores a model against measurements.
loso_residuals() and with_bands() calibrate the model tier's confidence (confidence.py): the
error of its predicted speedup over torch, leave-one-signature-out and leave-one-group-out
(related_groups: signatures sharing a hidden size), per regime.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

from tunedb.families.gemm import act_cost, confidence, decode_cost
from tunedb.families.gemm.costmodel import (ELEM_BYTES, ModelParams, Terms, _predict_us, _tile_of,
                              _vendor_parts, _vendor_us, decode_flight, default_line, launches, predict,
                              terms, weight_bytes)
from tunedb.families.gemm.configs import VENDOR_LANES
from tunedb.families.gemm.configs_gemv import is_gemv
from tunedb.records import ArchProfile, Config, Measurement, Status


def _lstsq2(xs: Sequence[tuple[float, float]], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least squares y = a*x1 + b*x2 with a, b >= 0 (2x2 normal equations; one-term fits at the edges)."""
    s11 = sum(x1 * x1 for x1, _ in xs)
    s12 = sum(x1 * x2 for x1, x2 in xs)
    s22 = sum(x2 * x2 for _, x2 in xs)
    t1 = sum(x1 * y for (x1, _), y in zip(xs, ys))
    t2 = sum(x2 * y for (_, x2), y in zip(xs, ys))
    det = s11 * s22 - s12 * s12
    if det > 1e-12 * max(s11 * s22, 1e-30):
        a, b = (t1 * s22 - t2 * s12) / det, (s11 * t2 - s12 * t1) / det
        if a >= 0 and b >= 0:
            return a, b
    candidates = []
    if s22 > 0:
        candidates.append((0.0, max(t2 / s22, 0.0)))
    if s11 > 0:
        candidates.append((max(t1 / s11, 0.0), 0.0))
    if not candidates:
        return None
    return min(candidates, key=lambda ab: sum((ab[0] * x1 + ab[1] * x2 - y) ** 2 for (x1, x2), y in zip(xs, ys)))


def fit(measurements: Iterable[Measurement], configs: Mapping[str, Config] | Iterable[Config],
        arch: ArchProfile, base: ModelParams | None = None) -> ModelParams:
    """Calibrate on ok measurements: a global scale (median measured/predicted), for each config
    measured at >= 2 distinct throughput-bound shapes its own (a_c, b_c) by non-negative least
    squares, and for 'torch'/'fused' their (scale, overhead). Starts from `base` (kept where
    these measurements say nothing); merge() combines fits of separate builds."""
    base = base or ModelParams()
    by_id = dict(configs) if isinstance(configs, Mapping) else {c.id: c for c in configs}
    rows: dict[str, list[tuple[Terms, float, int]]] = {}
    decode_pts: list[tuple[Config, Any, float]] = []  # plain Triton decode points (decode_cost.py)
    vendor: dict[str, list[tuple[list[tuple[float, float, float]], float]]] = {}
    acted: list[Measurement] = []  # activation signatures: fitted on top of the plain terms
    twins: dict[tuple[Any, ...], float] = {}  # (N, K, dt, M, config) -> us of a GEMM without activation
    ratios = []
    seen = 0
    for meas in measurements:
        if meas.status is not Status.OK or meas.median_ms is None:
            continue
        seen += 1
        if act_cost.act_of(meas.signature) is not None:
            acted.append(meas)
            continue
        twins[_twin_key(meas)] = meas.median_ms * 1000.0
        if meas.config_id in VENDOR_LANES:
            parts = _vendor_parts(meas.config_id, (meas.signature, meas.m), arch, base)
            if parts and meas.median_ms > 0:
                vendor.setdefault(meas.config_id, []).append((parts, meas.median_ms * 1000.0))
            continue
        config = by_id.get(meas.config_id)
        if config is None or config.is_sentinel or is_gemv(config):
            continue  # a `gv` config is priced by its own measured rate (decode_cost.gemv_us)
        shape = (meas.signature, meas.m)
        tm = terms(config, shape, arch)
        if isinstance(tm, Status):
            continue
        us = meas.median_ms * 1000.0
        pred = _predict_us(config, shape, arch, base)
        if not isinstance(pred, Status) and pred > 0:
            ratios.append(us / pred)
        rows.setdefault(config.id, []).append((tm, us, ELEM_BYTES.get(meas.signature.dt, 2)))
        if meas.m <= decode_cost.DECODE_M:
            decode_pts.append((config, shape, us))
    ratios.sort()
    scale = base.scale * (ratios[len(ratios) // 2] if ratios else 1.0)
    sentinel = dict(base.sentinel)
    sentinel.update({name: _fit_vendor(data) for name, data in vendor.items() if len(data) >= 2})
    # a Triton kernel pays the per-kernel cost the vendor's fit measured on the same graphs
    kernel_us = sentinel["torch"][1] if "torch" in sentinel else base.kernel_us
    per = _fit_lines(rows, by_id, arch, base, scale, base.latency_us, kernel_us)
    plain = ModelParams(scale=scale, lane_eff=dict(base.lane_eff), setup_us=base.setup_us,
                        latency_us=base.latency_us, l2_bw_factor=base.l2_bw_factor,
                        per_config={**base.per_config, **per}, sentinel=sentinel,
                        torch_margin=base.torch_margin, fitted_on=seen, uncertainty=dict(base.uncertainty),
                        support=None if base.support is None else dict(base.support),
                        act_epilogue=dict(base.act_epilogue), kernel_us=kernel_us, local=dict(base.local),
                        decode=_fit_decode(decode_pts, kernel_us, arch) or dict(base.decode))
    return _fit_activations(plain, acted, by_id, arch, twins)


def _fit_decode(decode_pts: Sequence[tuple[Config, Any, float]], kernel_us: float,
                arch: ArchProfile) -> dict[str, tuple[float, float]]:
    """The decode term (decode_cost.fit_stream) from every plain Triton decode point: what it
    explains is the measured time less the fixed terms (launches, split-K reduction)."""
    data = []
    for config, shape, us in decode_pts:
        tm = terms(config, shape, arch)
        if isinstance(tm, Status):
            continue
        data.append((weight_bytes(shape), decode_flight(config, shape, arch),
                     us - tm.fixed_us - kernel_us * launches(config)))
    return decode_cost.fit_stream(data, arch.dram_bw_gbs * 1e3)


def _twin_key(meas: Measurement) -> tuple[Any, ...]:
    s = meas.signature
    return (s.get("N"), s.get("K"), s.dt, meas.m, meas.config_id)


def _fit_activations(params: ModelParams, acted: Sequence[Measurement], by_id: Mapping[str, Config],
                     arch: ArchProfile, twins: Mapping[tuple[Any, ...], float]) -> ModelParams:
    """`params` (fitted on the plain GEMMs) with the activation terms (act_cost.py) fitted on the
    act signatures' measurements: torch's pass as (traffic scale, fixed us) and per activation the
    Triton epilogue as (per-CTA us, per-element us), each CTA on the critical path paying it once.
    What a term explains is the measured time less the same arm's at the plain twin (same N, K,
    M and config, no activation) where the log has one, else less the plain terms' prediction:
    the twin's difference is the activation alone, the prediction's carries the GEMM's own error.
    Non-negative least squares of relative error (each row weighted by 1 / its time): small and
    large outputs count alike. A term with fewer than 2 distinct points keeps its base."""
    torch_x: list[tuple[float, float]] = []
    torch_y: list[float] = []
    epi: dict[str, tuple[list[tuple[float, float]], list[float]]] = {}
    plain = dataclasses.replace(params, act_epilogue={})
    for meas in acted:
        sig, us = meas.signature, meas.median_ms * 1000.0
        n, elem = sig.get("N"), ELEM_BYTES.get(sig.dt, 2)
        if meas.config_id == "torch":
            parts = _vendor_parts("torch", (sig, meas.m), arch, params)
            twin = twins.get(_twin_key(meas))
            if parts or twin is not None:
                gemm = twin if twin is not None else _vendor_us(parts, *(params.sentinel.get("torch") or (params.scale, 0.0)))
                torch_x.append((act_cost.traffic_us(meas.m, n, elem, arch) / us, 1.0 / us))
                torch_y.append((us - gemm) / us)
            continue
        config = by_id.get(meas.config_id)
        if config is None or config.is_sentinel or is_gemv(config):
            continue
        tm = terms(config, (sig, meas.m), arch)
        pred = _predict_us(config, (sig, meas.m), arch, plain)
        if isinstance(tm, Status) or isinstance(pred, Status):
            continue
        t = _tile_of(config)
        xs, ys = epi.setdefault(str(sig.get("act")), ([], []))
        twin = twins.get(_twin_key(meas))
        xs.append((tm.wave_slots / us, tm.wave_slots * t.bm * t.bn / us))
        ys.append((us - (twin if twin is not None else pred)) / us)
    sentinel = dict(params.sentinel)
    if len(set(torch_x)) >= 2:
        got = _lstsq2(torch_x, torch_y)
        if got is not None:
            sentinel[act_cost.ACT_PASS] = (round(got[0], 6), round(got[1], 6))
    epilogue = dict(params.act_epilogue)
    for act, (xs, ys) in epi.items():
        got = _lstsq2(xs, ys) if len(set(xs)) >= 2 else None
        if got is not None:
            epilogue[act] = got
    return dataclasses.replace(params, sentinel=sentinel, act_epilogue=epilogue)


def merge(old: ModelParams | None, new: ModelParams) -> ModelParams:
    """One model for a file whose entries came from several builds: `old` (the file's model, fitted
    on earlier builds' measurements) updated by `new` (fitted on this build's). A config or vendor
    arm measured now takes its new line, one measured only before keeps its old one, and the
    global scale is the geometric mean of both weighted by the measurements each fit saw."""
    if old is None or old.fitted_on <= 0:
        return new
    if new.fitted_on <= 0:
        return old
    total = old.fitted_on + new.fitted_on
    scale = math.exp((old.fitted_on * math.log(old.scale) + new.fitted_on * math.log(new.scale)) / total)
    return ModelParams(scale=scale, lane_eff=dict(new.lane_eff), setup_us=new.setup_us,
                       latency_us=new.latency_us, l2_bw_factor=new.l2_bw_factor,
                       per_config={**old.per_config, **new.per_config},
                       sentinel={**old.sentinel, **new.sentinel}, torch_margin=new.torch_margin,
                       fitted_on=total, uncertainty=_merge_bands(old.uncertainty, new.uncertainty),
                       support=_merge_supports(old.support, new.support),
                       act_epilogue={**old.act_epilogue, **new.act_epilogue}, kernel_us=new.kernel_us,
                       local=_merge_local(old.local, new.local), decode=dict(new.decode or old.decode))


def _merge_bands(old: Mapping[str, tuple[float, int]], new: Mapping[str, tuple[float, int]]) -> dict[str, tuple[float, int]]:
    """Per regime the wider band over both fits' samples: the residuals themselves are not kept,
    so where two builds disagree the file keeps the conservative one."""
    out = dict(old)
    for key, (band, n) in new.items():
        if key in out:
            out[key] = (max(out[key][0], band), out[key][1] + n)
        else:
            out[key] = (band, n)
    return out


def _merge_supports(old: Mapping[str, Sequence[confidence.Point]] | None,
                    new: Mapping[str, Sequence[confidence.Point]] | None) -> dict[str, tuple[confidence.Point, ...]] | None:
    """Per regime the union of both fits' points (the merged band covers both sample sets)."""
    if old is None or new is None:
        return new if old is None else dict(old)
    out = {key: set(pts) for key, pts in old.items()}
    for key, pts in new.items():
        out.setdefault(key, set()).update(pts)
    return {key: tuple(sorted(pts)) for key, pts in sorted(out.items())}


def _merge_local(old: Mapping[str, Sequence[Any]], new: Mapping[str, Sequence[Any]]) -> dict[str, tuple[Any, ...]]:
    """Per population the union of both fits' rows: the local band is their largest residual near
    a point, so more rows only widen it (and a population one build lacks comes from the other)."""
    return {pop: tuple(sorted(set(old.get(pop, ())) | set(new.get(pop, ())))) for pop in sorted({*old, *new})}


def related_groups(signatures: Iterable[Any]) -> dict[Any, int]:
    """{signature: group}: signatures linked (transitively) by a shared N or K value form a group.
    One model's layers share its hidden sizes, so holding a group out is holding a model out
    without knowing which model a measurement came from."""
    sigs = list(dict.fromkeys(signatures))
    parent = list(range(len(sigs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[int, int] = {}
    for i, s in enumerate(sigs):
        for dim in {s.get("N"), s.get("K")} - {None}:
            j = first.setdefault(dim, i)
            parent[root(i)] = root(j)
    return {s: root(i) for i, s in enumerate(sigs)}


def loso_residuals(measurements: Iterable[Measurement], configs: Mapping[str, Config], arch: ArchProfile,
                   fallback: str = "torch", fitter: Callable[..., ModelParams] | None = None,
                   picked: list | None = None,
                   group_of: Callable[[Any], Any] | None = None) -> list[tuple[str, int, int, int, int, float]]:
    """(lane, m, n, k, elem, residual) for every ok measurement of a known Triton config at a
    point where the fallback was measured too: residual = log(pred_fb / pred_cfg) -
    log(meas_fb / meas_cfg), the over-prediction of the speedup the model tier decides on, with
    the model fitted on every OTHER group of signatures (`group_of`: signature -> group; default
    each signature its own, leave-one-signature-out; one fit per group: a model never scores the
    signatures it was fitted on). A group alone in the log has no residuals. `picked`, when
    given, also receives the residuals of the config predicted fastest at each point."""
    fitter = fitter or fit
    group_of = group_of or (lambda s: s)
    ok = [m for m in measurements if m.status is Status.OK and m.median_ms and m.median_ms > 0]
    by_group: dict[Any, dict[Any, list[Measurement]]] = {}
    for m in ok:
        by_group.setdefault(group_of(m.signature), {}).setdefault(m.signature, []).append(m)
    out: list[tuple[str, int, int, int, int, float]] = []
    if len(by_group) < 2:
        return out
    for group, sigs in by_group.items():
        params: ModelParams | None = None
        for sig, rows in sigs.items():
            if not any(m.config_id == fallback for m in rows):
                continue
            if params is None:
                params = fitter([m for m in ok if group_of(m.signature) != group], configs, arch)
            _score(sig, rows, params, configs, arch, fallback, out, picked)
    return out


def _score(sig: Any, rows: Sequence[Measurement], params: ModelParams, configs: Mapping[str, Config],
           arch: ArchProfile, fallback: str, out: list, picked: list | None) -> None:
    """Append the residuals of one held-out signature's rows under `params` (loso_residuals)."""
    fb_config = Config.sentinel(fallback)
    fb_meas = {m.m: m.median_ms for m in rows if m.config_id == fallback}
    tested = [m for m in rows if m.m in fb_meas and m.config_id in configs
              and not configs[m.config_id].is_sentinel]
    if tested:
        n, k, elem = sig.get("N"), sig.get("K"), ELEM_BYTES.get(sig.dt, 2)
        kind = confidence.epilogue_kind(sig.get("act"))
        fb_pred: dict[int, float | Status] = {}
        first = {id(m) for m in _top_predicted(tested, configs, arch, params, 1)} if picked is not None else set()
        for meas in tested:
            if meas.m not in fb_pred:
                fb_pred[meas.m] = predict(fb_config, (sig, meas.m), arch, params)
            pred_fb = fb_pred[meas.m]
            pred_c = predict(configs[meas.config_id], (sig, meas.m), arch, params)
            if isinstance(pred_fb, Status) or isinstance(pred_c, Status) or pred_fb <= 0 or pred_c <= 0:
                continue
            r = math.log(pred_fb / pred_c) - math.log(fb_meas[meas.m] / meas.median_ms)
            out.append((configs[meas.config_id].lane + kind, meas.m, n, k, elem, r))
            if id(meas) in first:
                picked.append(out[-1])


def _top_predicted(rows: Sequence[Measurement], configs: Mapping[str, Config], arch: ArchProfile,
                   params: ModelParams, top: int) -> list[Measurement]:
    """Per point the `top` measured configs the model predicts fastest: the ones a decision uses."""
    by_m: dict[int, list[tuple[float, str, Measurement]]] = {}
    for meas in rows:
        ms = predict(configs[meas.config_id], (meas.signature, meas.m), arch, params)
        if not isinstance(ms, Status):
            by_m.setdefault(meas.m, []).append((ms, meas.config_id, meas))
    return [meas for group in by_m.values() for _, _, meas in sorted(group, key=lambda x: x[:2])[:top]]


def with_bands(params: ModelParams, measurements: Iterable[Measurement], configs: Mapping[str, Config],
               arch: ArchProfile, fallback: str = "torch") -> ModelParams:
    """`params` with its per-regime error bands and supports calibrated from these measurements:
    per regime the widest band (confidence.bands) over four residual sets, every measured config's
    and the predicted-fastest config's at each point (the one a decision serves: the argmax of a
    noisy prediction is over-predicted more often than a config picked at random), each held out
    by signature and by group (related_groups: the error of a model that never saw the layer's
    hidden sizes, as a user's new model is). The sample count is the leave-one-signature-out
    predicted-fastest set's: one per held-out point, what a regime's band is a statement about;
    the support is that set's points. The two predicted-fastest sets are also kept whole, as the
    local band's rows (confidence.local_band; no group set where the log holds one group only)."""
    rows = list(measurements)
    top: list[tuple[str, int, int, int, int, float]] = []
    sets = [loso_residuals(rows, configs, arch, fallback, picked=top), top]
    local = {"signature": confidence.local_rows(top)}
    groups = related_groups(m.signature for m in rows)
    if len(set(groups.values())) >= 2:
        group_top: list[tuple[str, int, int, int, int, float]] = []
        sets += [loso_residuals(rows, configs, arch, fallback, picked=group_top, group_of=groups.__getitem__),
                 group_top]
        local["group"] = confidence.local_rows(group_top)
    widest = [confidence.bands(s) for s in sets]
    return dataclasses.replace(params, uncertainty={
        key: (max(b[key][0] for b in widest if key in b), n) for key, (_band, n) in widest[1].items()},
        support=confidence.supports(top), local=local)


def _scaled_line(config: Config, arch: ArchProfile, base: ModelParams, scale: float, elem: int) -> tuple[float, float]:
    a, b = default_line(_tile_of(config), arch, base, elem)
    return a * scale, b * scale


def _fit_lines(rows: Mapping[str, Sequence[tuple[Terms, float, int]]], by_id: Mapping[str, Config], arch: ArchProfile, base: ModelParams,
               scale: float, latency: float, kernel_us: float = 0.0) -> dict[str, tuple[float, float]]:
    """Each config's own (a_c, b_c) by non-negative least squares over its throughput-bound
    points (>= 2 distinct (waves, K iterations)); a latency-bound point says nothing about them."""
    per: dict[str, tuple[float, float]] = {}
    for cid, data in rows.items():
        ab = _scaled_line(by_id[cid], arch, base, scale, data[0][2])
        for _ in range(3):  # which points are latency-bound depends on the line: settle it
            used = [(tm, us) for tm, us, _ in data if tm.throughput_bound(*ab, latency)]
            if len({(tm.wave_slots, tm.k_iters) for tm, _ in used}) < 2:
                break
            fitted = _lstsq2([(float(tm.wave_slots), float(tm.wave_slots * tm.k_iters)) for tm, _ in used],
                             [max(us - tm.fixed_us - kernel_us * launches(by_id[cid]), 0.0) for tm, us in used])
            if fitted is None or fitted == ab:
                break
            ab = per[cid] = fitted
    return per


def _golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 40) -> float:
    """The minimiser of a unimodal f on [lo, hi] by golden-section search."""
    g = (math.sqrt(5.0) - 1.0) / 2.0
    for _ in range(iters):
        c, d = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, d) if f(c) <= f(d) else (c, hi)
    return (lo + hi) / 2.0


def _fit_vendor(data: Sequence[tuple[Sequence[tuple[float, float, float]], float]]) -> tuple[float, float]:
    """(scale, overhead_us) minimising the mean |log(pred / measured)| of a vendor arm: the
    library's kernels are neither Triton's nor one tile, so only their level is fitted."""
    def loss(scale: float, overhead: float) -> float:
        return sum(abs(math.log(_vendor_us(parts, scale, overhead) / us)) for parts, us in data)

    scale, overhead = 1.0, 0.0
    for _ in range(4):  # coordinate descent: the two terms barely interact
        scale = math.exp(_golden(lambda x: loss(math.exp(x), overhead), math.log(0.05), math.log(20.0)))
        overhead = _golden(lambda o: loss(scale, o), 0.0, min(us for _, us in data))
    return round(scale, 6), round(overhead, 6)


def geomean_error(params: ModelParams, measurements: Iterable[Measurement],
                  configs: Mapping[str, Config], arch: ArchProfile) -> float:
    """exp(mean |log(predicted / measured)|) - 1 over the ok measurements of known configs."""
    logs = []
    for meas in measurements:
        config = configs.get(meas.config_id)
        if config is None or meas.status is not Status.OK or not meas.median_ms:
            continue
        ms = predict(config, (meas.signature, meas.m), arch, params)
        if not isinstance(ms, Status) and ms > 0:
            logs.append(abs(math.log(ms / meas.median_ms)))
    return math.exp(sum(logs) / len(logs)) - 1.0 if logs else 0.0
