"""The ladder timer's new capture (GraphTimer.refresh, session 17): a further block of rounds of
`tune --pick low` runs on new CUDA graphs over new buffers, and still times every arm on fresh
valid systems. Run: pytest -m gpu tests/gpu/test_linalg_refresh_gpu.py (about 10-20 s, most of it
compiling two kernels)."""
from __future__ import annotations

import math

import pytest
import torch

from tunedb.families.linalg import FAMILY, ladder
from tunedb.families.linalg.gputimer import GraphTimer
from tunedb.families.linalg.ladder import Cell

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CELL = Cell("potrf", "fp32", 8, 256)
ARMS = ("torch", "warp_p2_w1")


def test_refresh_recaptures_on_new_buffers_and_times_the_same():
    timer = GraphTimer(FAMILY, seed=0)
    try:
        for arm in ARMS:
            assert timer.gate(CELL, arm)[0].value == "ok"
        first = [timer.sample(CELL, ARMS) for _ in range(3)]
        st = timer._state
        old_graphs = dict(st["graphs"])
        old_ptrs = {t.data_ptr() for args in st["working"] for t in args}
        timer.refresh(CELL)
        second = [timer.sample(CELL, ARMS) for _ in range(3)]
        st = timer._state
        assert set(st["graphs"]) == set(ARMS) and all(st["graphs"][a] is not old_graphs[a] for a in ARMS)
        assert not old_ptrs & {t.data_ptr() for args in st["working"] for t in args}  # other addresses
        for arm in ARMS:
            a = sorted(s[arm] for s in first)[1]
            b = sorted(s[arm] for s in second)[1]
            assert math.isfinite(a) and math.isfinite(b) and 0.5 < a / b < 2.0, (arm, a, b)
        # the working sets a refreshed graph consumes are restored from the pristine ones
        st["inputs"].restore()
        for src, dst in zip(st["pristine"], st["working"]):
            assert all(torch.equal(s, d) for s, d in zip(src, dst))
    finally:
        timer.close()


def test_a_low_tune_cell_records_its_blocks_on_the_gpu():
    timer = GraphTimer(FAMILY, seed=1)
    try:
        res = ladder.measure_cell(timer, CELL, ARMS, decide="low", max_rounds=18)
    finally:
        timer.close()
    blocks = [r["block"] for r in res.rounds]
    assert blocks[:9] == [0] * 9 and set(blocks) <= {0, 1}
    assert all(math.isfinite(v) and v > 0 for s in res.samples.values() for v in s)
    assert res.pick.stat == "q25" and set(res.pick.times) == set(ARMS)
