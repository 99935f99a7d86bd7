"""The ranking prior of the small batched linear-algebra configs: which valid configs a capped
ladder or bench measures first (candidates). Pure Python.

It decides what is measured, never what is compiled or launched, so it sits outside the family's
KERNEL_SOURCES (the impl_hash the shipped table is stamped with): a change to the prior does not
make the shipped table stale. The space and THE validity predicate are kernels_space.py's.
"""
from __future__ import annotations

import math

from tunedb.families.linalg import kernels_space as space

# candidates()' turns per packing (a packing with no valid config is skipped)
# With reg (session 14) every packing keeps its place in the first nine turns of the others:
# a cap of 11 spends the old cap of 9 as before plus two reg configs; where reg has no valid
# config (n > 16 in fp32, n > 12 in fp64, other ops) the first nine are the old nine.
# rows (session 15) takes two turns after those eleven: a cap of 13 spends the old cap of 11 as
# before plus two rows configs; where rows has no valid config the first eleven are the old ones.
ROTATION = ("lane", "reg", "warp", "block", "thread", "lane", "warp", "lane", "reg", "warp", "block", "rows", "rows")
# shfl (session 18, one config per n, potrf/posv n <= 32 only) stays out of the rotation: a cap
# below SHFL_TURN picks exactly what it picked before, and a cap of SHFL_TURN or more spends one
# turn less on the rotation and then takes the shfl config (so 14 = the old 13 plus shfl: the
# shipped stage of bench/device_s17_linalg.sh tunes potrf/posv n <= 32 at 14).
SHFL_TURN = 14
# panel (session 20, n >= 16) goes first where the tiles stop fitting (NP >= PANEL_FIRST_NP, i.e.
# n >= 33: potrf/posv had one or two Triton configs there, block_w8 spilling; trsv's warp
# configs sat 3-6x above the floor, so its panel config is worth the first turn too); there a
# cap spends its first turns on panel and the rest on the rotation. Below, it stays out of the
# rotation like shfl: a cap of PANEL_TURN or more spends one turn less on the rotation and then
# takes the panel configs (15 = the old 14 plus panel_w1), so a smaller cap picks what it did.
PANEL_TURN = 15
PANEL_FIRST_NP = 64


def candidates(op: str, n: int, dtype: str, cap: int | None = None, batch: int | None = None,
               sms: int = 132) -> list[space.KernelConfig]:
    """The valid configs, best-first by a coarse prior (for a per-cell cap in the bench).

    The prior: thread packing wants about one problem per lane, warp and block a tile of
    about 16 elements per thread, fewer warps breaking ties; with `batch`, a config that leaves
    fewer than two programs per SM pays for the missing programs. Packings then take turns in
    ROTATION (warp, block, thread, warp, warp, block, ...: the H200 ladder of 2026-12-01 had
    warp configs win most cells and thread configs none), so a cap of 3 or more keeps each
    packing's best guess and spends the rest mostly on warp configs. shfl and, below NP = 64,
    panel come after the rotation (SHFL_TURN, PANEL_TURN); from NP = 64 the panel configs come
    first (PANEL_FIRST_NP).
    """
    def score(c: space.KernelConfig) -> tuple[float, int]:
        if c.packing == "shfl":  # one config per n
            base = 0.0
        elif c.packing in ("panel", *space.PDOT_PACKINGS):  # two rows a thread first (pdot: the budget's most)
            best = 1 if c.packing == "panel" else math.log2(space.PDOT_ROWS[dtype == "fp64"])
            base = abs(math.log2(max(1, space.panel_rows(n, op) // (32 * c.warps))) - best)
        elif c.packing == "reg":  # one problem per thread, one or two warps per program
            base = math.log2(c.problems / (32 * c.warps)) + 0.25 * abs(c.warps - 1.5)
        elif c.packing == "rows":  # the fewest threads per problem the budget allows, one warp
            base = math.log2(32 * c.warps / c.problems) - math.log2(max(2, space.next_pow2(n) ** 2 // (
                space.ROWS_BUDGET[op][dtype == "fp64"]))) + 0.5 * math.log2(c.warps)
        elif c.packing == "lane":  # one warp per program and one or two columns per lane
            cols = c.problems * space.next_pow2(n) / (32 * c.warps)
            base = abs(math.log2(cols) - 0.5) + 0.5 * math.log2(c.warps)
        elif c.packing == "thread":
            base = abs(math.log2(c.problems / (32 * c.warps))) + 0.25 * abs(c.warps - 2)
        else:
            per = space.tile_elements(op, c.packing, c.problems, n) / (32 * c.warps)
            base = abs(math.log2(max(per, 1)) - 4)
        if batch:
            programs = -(-batch // c.problems)
            base += max(0.0, math.log2(2 * sms / programs))
        return base, c.warps

    valid = space.config_space(op, n, dtype)
    by_pack = {p: sorted((c for c in valid if c.packing == p), key=score) for p in space.PACKINGS}
    shfl = by_pack.pop("shfl")
    panel = by_pack.pop("panel")
    pdot = [c for p in ("pdottf", "pdot") for c in by_pack.pop(p)]  # only from PDOT_MIN_N (> 32)
    late = shfl if cap is None or cap >= SHFL_TURN else []
    limit = len(valid) if cap is None else min(cap, len(valid))
    if space.next_pow2(n) >= PANEL_FIRST_NP:  # the packings built for these n go first
        picked = (pdot + panel)[:limit]
    else:
        picked = []
        late = late + (panel if cap is None or cap >= PANEL_TURN else [])
    turns = min(len(picked) + sum(map(len, by_pack.values())), max(0, limit - len(late)))
    while len(picked) < turns:
        for p in ROTATION:
            if by_pack[p] and len(picked) < turns:
                picked.append(by_pack[p].pop(0))
    return picked + late[:max(0, limit - len(picked))]
