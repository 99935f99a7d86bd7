"""The GEMM family's cost_model and calibrate hooks: the analytic model (costmodel.py) and its
fit (calibration.py) behind the contract's CostModel interface.

rank() prunes the build's candidates to a top-k, predict() prices an arm for the dry-run
estimate and --simulate's timer, pick() is the selector's model tier; calibrate() fits the
parameters that the database file's `model` object ships. Pure Python, no torch.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from tunedb import settings
from tunedb.families.gemm import calibration, confidence, configs_gemv, costmodel
from tunedb.records import ArchProfile, Config, Measurement, Signature, Status


def params_of(raw: Mapping[str, Any] | costmodel.ModelParams | None) -> costmodel.ModelParams | None:
    """ModelParams from a database file's `model` object; None when absent or written by another
    version (the uncalibrated structure then ranks)."""
    if raw is None or isinstance(raw, costmodel.ModelParams):
        return raw
    if not raw:
        return None
    try:
        return costmodel.ModelParams.from_json(raw)
    except Exception:  # a model of another version: rank with the uncalibrated structure
        return None


class GemmCostModel:
    """The analytic model on one arch profile, calibrated by `params` (None: uncalibrated)."""

    def __init__(self, family: Any, profile: ArchProfile, params: Any = None) -> None:
        self.family, self.profile = family, profile
        self.params = params_of(params)
        self._default = lambda sig, _arch=None: family.default_config(sig, profile)
        self._decide = costmodel.make_decider(profile, self.params, family.invalid_reason, self._default)

    def rank(self, sig: Signature, m: int, configs: Sequence[Config], k: int) -> list[str]:
        """The k configs predicted fastest at (sig, m), fastest first, then (M <= 16) every `gv`
        config among `configs` that the predicate admits here and the k left out: the family's
        few GEMV slabs (configs_gemv.SPACE_IDS, at most 7 a point) are always measured at decode
        sizes, as scaled_mm measures its seeds, so a build finds where they win whatever the
        model's guess."""
        ids = [c.id for c, _ in costmodel.rank(configs, m, sig.get("N"), sig.get("K"), self.profile, k, None,
                                               self.params, dt=sig.dt, default_config=self._default, sig=sig)]
        if m <= configs_gemv.MAX_M:
            have = set(ids)
            ids += [c.id for c in configs if configs_gemv.is_gemv(c) and c.id not in have
                    and self.family.invalid_reason(c, sig, m, self.profile) is None]
        return ids

    def predict(self, sig: Signature, m: int, config_id: str) -> float | None:
        """Predicted ms of one arm; None where the model cannot price it."""
        try:
            ms = costmodel.predict(self.family.parse_config(config_id), (sig, m), self.profile, self.params,
                                   default_config=self._default)
        except Exception:  # an arm the model cannot price: no estimate for it
            return None
        return None if isinstance(ms, Status) else ms

    def decide(self, sig: Signature, m: int, candidates: tuple[Config, ...]) -> confidence.Decision | None:
        """The model tier's decision (confidence.serve): what serves, the predicted gain, the
        regime's error band and whether a faster-predicted config was declined."""
        return self._decide(sig, m, candidates)

    def pick(self, sig: Signature, m: int, candidates: tuple[Config, ...]) -> Config | None:
        """The selector's model tier: the predicted-fastest candidate where its predicted gain
        over the fallback exceeds the regime's calibrated error band, else the fallback."""
        d = self._decide(sig, m, candidates)
        return d.config if d is not None else None


def calibrate(profile: ArchProfile, measurements: Iterable[Measurement], configs: Mapping[str, Config],
              old: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """This run's fit, with its error bands calibrated leave-one-signature-out, merged into the
    file's old model: the `model` object to write."""
    rows = list(measurements)
    new = calibration.with_bands(calibration.fit(rows, configs, profile), rows, configs, profile)
    return calibration.merge(params_of(old), new).to_json()


# Kernels a config's launcher issues per call (runtime/host_bound.py): split-K runs a partial and
# a reduce kernel (and allocates their workspace); every other lane one, with bias and activation
# in its epilogue.
LAUNCHES = {"triton_splitk": 2}


def eager_fallback(sig: Signature, m: int, config: Config, profile: ArchProfile, params: Any = None,
                   fallback: str = "torch") -> str | None:
    """The GEMM family's eager_fallback hook. Outside a graph a call costs about the larger of its
    host issue time (launches x profile.launch_us_eager) and its kernel time. `fallback` serves the
    shape's eager calls where its predicted kernel is shorter than the config's host time: then
    the config's call is host-bound and its GPU saving buys nothing, while its extra launches cost,
    and so does a Triton launch against cuBLAS's at equal counts (+1.3 us a call in a loop of its
    own; a tensor-parallel shard's four served one-row q_proj calls made its eager step 7.5% slower
    than the same calls as F.linear, session 43 call 1, H100). Past that, torch serves eagerly
    every shape whose kernel is shorter than TUNEDB_EAGER_KERNEL_US (64 us): a decode GEMM's kernel
    is, and an eager decode step is host-bound as a whole, so the config's GPU saving buys nothing
    while its launch costs the host more (session 45, H100: Llama-3-8B layers at batch 1 eagerly
    1.110x slower than plain with the decode configs served, 0.990x with them as F.linear, where
    each kernel alone was longer than a launch). That holds for a config with the activation fused
    too, one Triton launch against torch's GEMM and elementwise kernels: HF Llama-3-8B layers
    eagerly at batch 1 ran 0.895x of plain with the fused gate/SiLU pair served, 0.951x with it
    given back to F.linear and the model's SiLU (session 57, H100, bench/eager_bisect.py). None:
    the config serves."""
    if config.is_sentinel:
        return None
    host_cfg = LAUNCHES.get(config.lane, 1) * profile.launch_us_eager
    from tunedb import families

    family = families.get("gemm")
    ms = costmodel.predict(Config.sentinel(fallback), (sig, m), profile, params_of(params),
                           default_config=lambda s, _arch=None: family.default_config(s, profile))
    if isinstance(ms, Status):
        return None
    return fallback if ms * 1000.0 < max(host_cfg, settings.eager_kernel_us()) else None
