"""The quantized families' pruning model (the contract's cost_model hook): which configs a build
measures at a point when it cannot afford all ~118 (issue 20's device budget; vLLM sweeps ~1,300
per shape offline, which is what a table saves a user from, not what a build can repeat per point).

A structural time estimate, not a fitted one: waves of CTAs x each CTA's K loop at a throughput
that grows with the tile's arithmetic intensity, against a memory floor (weight once, the
activation once per column of tiles, split-K's fp32/int32 partials written and read back), plus
a second launch for split-K. rank() keeps the k predicted-fastest, and at least the best of each
lane, so a wrong guess about one lane never removes it from the measurement. pick() answers
nothing: an unmeasured shape keeps the `heuristic` sentinel (the family's stated untuned rule),
so the model only prunes, it never serves.
"""
from __future__ import annotations

import math
from typing import Sequence

from tunedb.families.scaled_mm import configs
from tunedb.records import ArchProfile, Config, Signature

_SPLIT_LAUNCH_MS = 0.004  # the reduction kernel's launch inside a graph
_REF_INTENSITY = 128 * 256 / (128 + 256)  # the largest tile's: full throughput


class PruningModel:
    def __init__(self, profile: ArchProfile) -> None:
        self.profile = profile
        self.sms = profile.sms

    def predict(self, sig: Signature, m: int, config_id: str) -> float | None:
        """Estimated ms of one call (None for sentinels: they are always measured)."""
        c = configs.parse(config_id)
        if c.is_sentinel:
            return None
        p = dict(c.params)
        bm, bn, bk = p["block"]
        split = p.get("split_k", 1)
        n, k = sig.get("N"), sig.get("K")
        tiles = math.ceil(m / bm) * math.ceil(n / bn) * split
        waves = math.ceil(tiles / self.sms)
        intensity = bm * bn / (bm + bn)
        eff = min(1.0, intensity / _REF_INTENSITY) ** 0.7
        eff *= 1.0 if p.get("stages", 3) >= 3 else 0.8
        eff *= 1.1 if c.lane == "triton_tma" else 1.0
        eff *= min(1.0, bk / 128) ** 0.3  # short K steps pay the loop's overhead more often
        # the usual pairing (more warps and fewer stages for the larger tiles) breaks the ties
        # that warps and stages leave in this model
        big = bm * bn >= 128 * 128
        eff *= 1.0 if p.get("warps", 4) == (8 if big else 4) else 0.95
        eff *= 1.0 if p.get("stages", 3) == (3 if bm * bn >= 128 * 256 else 4) else 0.97
        peak_per_sm = self.profile.peak_tflops(sig.dt) * 1e12 / self.sms
        k_split = math.ceil(k / split)
        compute_s = waves * (2.0 * bm * bn * k_split) / (peak_per_sm * eff)
        moved = n * k + m * k * math.ceil(n / bn) + m * n * 2
        if split > 1:
            moved += 2 * m * n * 4 * split
        memory_s = moved / (self.profile.dram_bw_gbs * 1e9)
        ms = max(compute_s, memory_s) * 1e3 + self.profile.launch_us_graph / 1e3
        return ms + (_SPLIT_LAUNCH_MS if split > 1 else 0.0)

    def rank(self, sig: Signature, m: int, candidates: Sequence[Config], k: int) -> list[str]:
        """The k predicted-fastest ids, one per tile shape first (warps/stages variants of a
        tile fill what is left), plus each lane's predicted best; sentinels first."""
        timed = [(self.predict(sig, m, c.id), c) for c in candidates]
        sentinels = [c.id for t, c in timed if t is None]
        ranked = sorted(((t, c) for t, c in timed if t is not None), key=lambda tc: (tc[0], tc[1].id))
        shapes: set[tuple] = set()
        first, rest = [], []
        for _, c in ranked:
            p = dict(c.params)
            shape = (c.lane, p["block"], p.get("split_k", 1))
            (rest if shape in shapes else first).append(c.id)
            shapes.add(shape)
        keep = (first + rest)[:k]
        for lane in configs.TRITON_LANES:
            best = next((c.id for _, c in ranked if c.lane == lane), None)
            if best is not None and best not in keep:
                keep.append(best)
        return sentinels + keep

    def pick(self, sig: Signature, m: int, candidates: Sequence[Config]) -> Config | None:
        return None  # the model prunes builds; the heuristic sentinel serves unmeasured shapes
