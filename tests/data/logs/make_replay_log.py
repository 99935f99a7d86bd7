"""Synthesizes replay_small.jsonl (the replay timer's test log) with the fake timer.

Run from the repository root: python tests/data/logs/make_replay_log.py
The numbers are synthetic (FakeTimer: a fixed cost per config plus seeded noise), not measured.
"""
from pathlib import Path

from tunedb.measure.log import MeasurementLog
from tunedb.measure.protocol import measure_point
from tunedb.measure.timers import FakeTimer
from tunedb.records import Provenance, Signature, Status

SIG = Signature.make("gemm", "gemm", "half", N=512, K=256)
COSTS = {
    64: {"default": 0.0071, "torch": 0.0065, "b32x64x64_w4_s3_g8": 0.0061, "b64x64x64_w4_s3_g8": 0.0069,
         "b128x128x64_w8_s3_g8": Status.INFEASIBLE},
    512: {"default": 0.0102, "torch": 0.0090, "b32x64x64_w4_s3_g8": 0.0094, "b64x64x64_w4_s3_g8": 0.0081,
          "b128x128x64_w8_s3_g8": Status.INCORRECT},
}
PROVENANCE = Provenance(utc="2026-11-29T00:00:00Z", git_commit="0" * 40, gpu_name="synthetic (FakeTimer)",
                        torch="2.13.0", triton="3.9.0", tunedb="0.1.0")


def main() -> None:
    path = Path(__file__).with_name("replay_small.jsonl")
    path.unlink(missing_ok=True)
    log = MeasurementLog(path, PROVENANCE, run_id="synthetic01")
    for m, costs in COSTS.items():
        timer = FakeTimer(lambda s, mm, c: COSTS[mm][c], noise_sigma=0.02, seed=m,
                          host_us=lambda s, mm, c: 4.0 if c == "torch" else 6.5)
        measure_point(None, SIG, m, list(costs), timer=timer, min_rounds=7, max_rounds=7, log=log)


if __name__ == "__main__":
    main()
