"""The GEMM cost model's parameters (fitted by calibration.py, read by costmodel.py) and their
JSON form, as a tier file's `model` key stores them. Pure Python."""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any, Mapping

from tunedb.errors import ConfigError
from tunedb.families.gemm import confidence

_SCHEMA = 1


@dataclass(frozen=True)
class ModelParams:
    """Fitted or default parameters. Times in microseconds; JSON-able via to_json()/from_json()."""

    scale: float = 1.0
    lane_eff: Mapping[str, float] = field(default_factory=lambda: {
        "triton_mma": 0.55, "triton_tma": 0.8, "triton_splitk": 0.55, "torch": 0.85})
    setup_us: float = 0.4  # per-CTA prologue: the first loads' latency before the K loop
    latency_us: float = 0.5  # DRAM load latency under load: bounds a K iteration (see Terms.line_us)
    l2_bw_factor: float = 3.0  # L2 bandwidth as a multiple of DRAM bandwidth (tile re-reads hit L2)
    per_config: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # id -> (a_us, b_us)
    # 'torch' / 'fused' -> (scale of the vendor tiles' line, per-call overhead in us), fitted on
    # the sentinel's own measurements: the vendor library is not a Triton config.
    sentinel: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # The ranker answers 'torch' (when it is a candidate) unless a Triton config is predicted
    # faster by more than this share: the build's gate keeps the torch fallback the same way.
    torch_margin: float = 0.05
    fitted_on: int = 0  # ok measurements the calibration saw: merge() weighs fits by it
    # regime key (confidence.regimes) -> (error band of the predicted log speedup over torch,
    # residuals behind it), calibrated leave-one-signature-out; empty: the tier declines
    uncertainty: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    # regime key -> the (log2 M, log2 N, log2 K) points behind its band (confidence.supports); a
    # point farther than a factor 2 from all of them is declined. None: not checked (hand-made
    # params); a calibrated model always has one
    support: Mapping[str, tuple[tuple[float, float, float], ...]] | None = None
    # population ('signature', 'group') -> its held-out decisions' (epilogue kind, log2 M,
    # residual) rows: the local band (confidence.local_band); empty: no local band
    local: Mapping[str, tuple[tuple[str, float, float], ...]] = field(default_factory=dict)
    # per Triton kernel launched: its fixed cost beyond the launch (first loads from a cold L2, the
    # last stores' drain), which a tile line does not scale; fit() sets it to the vendor arm's
    # fitted overhead, measured on the same graphs. 0: hand-made params, and models fitted before it
    kernel_us: float = 0.0
    # activation -> (per-CTA us, per-element us) a Triton tile's fused activation costs (act_cost.py)
    act_epilogue: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # the decode law at M <= DECODE_M (decode_cost.py): 'stream' -> (loaded latency us, share of
    # the DRAM bandwidth), 'base' -> (fixed us, 0); empty: models fitted before it, priced by the
    # throughput line alone
    decode: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"schema": _SCHEMA, "scale": self.scale, "lane_eff": dict(self.lane_eff),
                "setup_us": self.setup_us, "latency_us": self.latency_us,
                "l2_bw_factor": self.l2_bw_factor, "per_config": {k: [a, b] for k, (a, b) in sorted(self.per_config.items())},
                "sentinel": {k: [a, b] for k, (a, b) in sorted(self.sentinel.items())},
                "torch_margin": self.torch_margin, "fitted_on": self.fitted_on,
                "uncertainty": {k: [b, n] for k, (b, n) in sorted(self.uncertainty.items())},
                "support": None if self.support is None else
                {k: [list(p) for p in pts] for k, pts in sorted(self.support.items())},
                "act_epilogue": {k: [a, b] for k, (a, b) in sorted(self.act_epilogue.items())},
                "kernel_us": self.kernel_us, "local": {k: [list(r) for r in rows] for k, rows in sorted(self.local.items())},
                "decode": {k: [a, b] for k, (a, b) in sorted(self.decode.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ModelParams":
        if not isinstance(data, Mapping) or data.get("schema") != _SCHEMA:
            raise ConfigError(f"cost-model params need an object with schema={_SCHEMA}, got {data!r:.80}")
        default = cls()
        uncertainty = {k: (b, int(n)) for k, (b, n) in _pairs(data, "uncertainty", "[band, samples]").items()}
        support = _points(data.get("support"))
        if uncertainty and support is None and data.get("support", ()) is not None:
            # bands calibrated before point supports were kept (no key, or the [min, max] work
            # range): nothing says whether a shape is near one they were measured on, so decline
            uncertainty = {}
        lane_eff = data.get("lane_eff") or {}
        if not isinstance(lane_eff, Mapping):
            raise ConfigError(f"cost-model lane_eff must be an object of lane -> efficiency, got {lane_eff!r:.80}")
        return cls(scale=_number(data, "scale", 1.0, positive=True),
                   lane_eff={**default.lane_eff, **{str(k): _number(lane_eff, k, 0.0, positive=True, what="lane_eff")
                                                    for k in lane_eff}},
                   setup_us=_number(data, "setup_us", default.setup_us),
                   # a model written before the latency term was fitted without it
                   latency_us=_number(data, "latency_us", 0.0),
                   l2_bw_factor=_number(data, "l2_bw_factor", default.l2_bw_factor, positive=True),
                   per_config=_pairs(data, "per_config", "[a_us, b_us]"),
                   sentinel=_pairs(data, "sentinel", "[scale, overhead_us]"),
                   torch_margin=_number(data, "torch_margin", default.torch_margin),
                   fitted_on=int(_number(data, "fitted_on", 0)),
                   # a model written before the bands were calibrated has none: the tier declines
                   uncertainty=uncertainty, support=support,
                   act_epilogue=_pairs(data, "act_epilogue", "[per_cta_us, per_elem_us]"),
                   kernel_us=_number(data, "kernel_us", 0.0), local=confidence.parse_local(data.get("local")),
                   decode=_pairs(data, "decode", "[value, value]"))


def _number(data: Mapping[str, Any], key: str, default: float, positive: bool = False, what: str = "") -> float:
    """data[key] as a finite number >= 0 (> 0 with positive), default when absent; else a
    ConfigError naming the field (a scale of -1e9 would rank every shape as it pleased)."""
    value = data.get(key, default)
    name = f"{what}[{key!r}]" if what else key
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value == 0):
        allowed = "a finite number > 0" if positive else "a finite number >= 0"
        raise ConfigError(f"cost-model {name} must be {allowed}, got {value!r:.80}")
    return float(value)


def _points(raw: Any) -> dict[str, tuple[tuple[float, float, float], ...]] | None:
    """A model's `support` ({regime: [[log2 M, log2 N, log2 K], ...]}); None when absent, null
    (hand-made params: not checked) or in the earlier [min, max] work-range form."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"cost-model support must be an object of regime -> points, got {raw!r:.80}")
    out = {}
    for name, pts in raw.items():
        if not (isinstance(pts, (list, tuple)) and all(
                isinstance(p, (list, tuple)) and len(p) == 3
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p) for p in pts)):
            if isinstance(pts, (list, tuple)) and len(pts) == 2 and all(isinstance(v, (int, float)) for v in pts):
                return None  # the work-range form of an earlier calibration
            raise ConfigError(f"cost-model support[{name!r}] must be [[log2 M, log2 N, log2 K], ...], got {pts!r:.80}")
        out[str(name)] = tuple((float(a), float(b), float(c)) for a, b, c in pts)
    return out


def _pairs(data: Mapping[str, Any], key: str, what: str) -> dict[str, tuple[float, float]]:
    out = {}
    for name, pair in (data.get(key) or {}).items():
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair)):
            raise ConfigError(f"cost-model {key}[{name!r}] must be {what}, got {pair!r}")
        out[str(name)] = (float(pair[0]), float(pair[1]))
    return out
