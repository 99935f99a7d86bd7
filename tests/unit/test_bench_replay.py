"""The replay timer answers from a recorded log (tests/data/logs/replay_small.jsonl)."""
from pathlib import Path

import pytest

from tunedb.measure.log import read_log
from tunedb.measure.protocol import best, measure_point
from tunedb.measure.timers import ReplayTimer
from tunedb.errors import MeasurementError
from tunedb.records import Signature, Status

LOG = Path(__file__).parents[1] / "data" / "logs" / "replay_small.jsonl"
SIG = Signature.make("gemm", "gemm", "half", N=512, K=256)
IDS = ["default", "torch", "b32x64x64_w4_s3_g8", "b64x64x64_w4_s3_g8", "b128x128x64_w8_s3_g8"]


def test_replay_reproduces_recorded_samples_and_statuses():
    recorded = {(r.measurement.m, r.measurement.config_id): r.measurement for r in read_log(LOG)}
    for m in (64, 512):
        got = measure_point(None, SIG, m, IDS, timer=ReplayTimer(LOG), min_rounds=7, max_rounds=7)
        for x in got:
            rec = recorded[(m, x.config_id)]
            assert x.status is rec.status
            if rec.status.ok:
                assert x.samples == rec.samples and x.median_ms == rec.median_ms
                assert x.host_us == rec.host_us
    m64 = {x.config_id: x for x in measure_point(None, SIG, 64, IDS, timer=ReplayTimer(LOG))}
    assert m64["b128x128x64_w8_s3_g8"].status is Status.INFEASIBLE
    assert best(list(m64.values())).config_id == "b32x64x64_w4_s3_g8"
    m512 = measure_point(None, SIG, 512, IDS, timer=ReplayTimer(LOG))
    assert best(m512).config_id == "b64x64x64_w4_s3_g8"


def test_replay_of_an_unrecorded_arm_names_it():
    with pytest.raises(MeasurementError, match=r"b16x16x16.*M=64.*recorded configs there: b128"):
        measure_point(None, SIG, 64, ["default", "b16x16x16"], timer=ReplayTimer(LOG))
