"""The build over the conv family on the CPU (a fake timer with hand-set truths): the validity
predicate decides which arms a key gets (the direct kernel only for depthwise keys, implicit GEMM
only for dense ones, cuDNN's variants for every key), torch is the fallback a config must beat
by the gate, and the written entry's regions run over M = B * T_out."""
from __future__ import annotations

import pytest

from tunedb import database, pipeline, settings
from tunedb.families.conv import keys
from tunedb.measure.timers import FakeTimer
from tunedb.records import Point, ShapeSet

DW = keys.make_signature("conv1d", "half", 512, 512, 31, 1, 15, 1, 512, True)
PW = keys.make_signature("conv1d", "half", 512, 1024, 1, lay="ntc")
SEEN: set[tuple[str, int, str]] = set()


def truth(sig, m, cid):
    SEEN.add((sig.get("k"), m, cid))
    base = 0.010 * m / 1000
    if cid == "torch":
        return base
    if sig == DW and cid == "dw_t64_c64_w4" and m <= 1000:
        return base / 1.5  # the direct kernel wins at small M ...
    if cid == "cudnn_bench" and m > 1000:
        return base / 1.2  # ... cuDNN's autotuned algorithm at large M
    return base * (1.02 + (sum(map(ord, cid)) % 7) * 0.01)


@pytest.fixture
def cache(tmp_path):
    with settings.override(CACHE_DIR=str(tmp_path / "cache"), USER_DB=str(tmp_path / "user")):
        yield tmp_path


def test_simulated_build_regions_and_arms(cache):
    SEEN.clear()
    shapes = ShapeSet(tuple(Point(sig, m, weight=1.0, calls=10) for sig in (DW, PW) for m in (250, 1000, 6000)))
    out = cache / "out"
    opts = pipeline.BuildOptions(out=str(out), family="conv", simulate=True, fresh=False, fill=False)
    res = pipeline.build([("c", shapes)], opts, timer=FakeTimer(truth, noise_sigma=0.001, seed=2))
    assert res.arms_measured > 0
    db = database.load(out / "sm90" / "conv.json", "conv", "sm90")
    assert [r.to_json() for r in db.entries[DW].regions] == [[1000, "dw_t64_c64_w4"], [6000, "cudnn_bench"],
                                                             [None, "torch"]]
    assert [r.to_json() for r in db.entries[PW].regions][-2:] == [[6000, "cudnn_bench"], [None, "torch"]]
    dw_arms = {cid for k, _, cid in SEEN if k == 31}
    pw_arms = {cid for k, _, cid in SEEN if k == 1}
    assert any(c.startswith("dw_") for c in dw_arms) and not any(c.startswith("ig_") for c in dw_arms)
    assert any(c.startswith("ig_") for c in pw_arms) and not any(c.startswith("dw_") for c in pw_arms)
    assert {"torch", "cudnn_bench", "cudnn_cl", "cudnn_cl_bench"} <= dw_arms & pw_arms
