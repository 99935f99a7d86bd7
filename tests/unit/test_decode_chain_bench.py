"""bench/decode_chain.py and the read roofline's late-trigger twins: every arm id the bench times
resolves to a config (the `_pdlate` reads included, kept out of read_roofline.configs(), which the
alone-timed sweeps use), and the summary picks the fastest arm of each kind and reports its share
and ratio on made-up timings."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import decode_chain as dc  # noqa: E402
import read_roofline as rr  # noqa: E402

from tunedb.families.gemm import FAMILY  # noqa: E402


def test_every_arm_resolves():
    for m in (1, 16):
        arms = dc.arms_for(m)
        assert arms[0] == "torch"
        reads = [a[5:] for a in arms if a.startswith("read:")]
        assert {rr.by_id(r).id for r in reads} == set(reads)
        assert any(r.endswith("_pdlate") for r in reads) and any(r.endswith("_pdl") for r in reads)
        for cid in (a for a in arms if a.startswith("gv")):
            FAMILY.parse_config(cid)
    late = rr.late_twins(rr.configs(quick=True))
    assert late and all(c.pdl and c.late and c.id.endswith("_pdlate") for c in late)
    assert not any(c.late for c in rr.configs(quick=False))  # the alone-timed sweeps never see them


def test_summary_picks_the_fastest_of_each_kind():
    row = {"N": 4096, "K": 4096, "M": 1, "MB": 33.6, "arms": {
        "torch": {"us": 12.0, "share": 0.62, "x_torch": 1.0},
        "read:read_b8192_w8_s1_all": {"us": 9.0, "share": 0.86, "x_torch": 12 / 9},
        "read:read_b8192_w8_s1_4xsm_pdl": {"us": 8.0, "share": 0.98, "x_torch": 1.5},
        "read:read_b8192_w8_s1_4xsm_pdlate": {"us": 8.5, "share": 0.92, "x_torch": 12 / 8.5},
        "gv1_n16x256_w4_s5_lr": {"us": 10.0, "share": 0.78, "x_torch": 1.2},
        "gv1_n16x256_w4_s5_lr_pdl": {"error": "RuntimeError: boom"}}}
    picks = {kind: dc.best(row, pred) for kind, pred in dc.KINDS}
    assert picks["read"][0] == "read:read_b8192_w8_s1_all"
    assert picks["read _pdl"][0] == "read:read_b8192_w8_s1_4xsm_pdl"
    assert picks["read _pdlate"][0] == "read:read_b8192_w8_s1_4xsm_pdlate"
    assert picks["gv"][0] == "gv1_n16x256_w4_s5_lr" and picks["gv _pdl"] is None  # a failed arm is no pick
    text = dc.table([row], 1)
    assert "4096x4096" in text and "(98%; 1.50x)" in text and text.count("|") > 10
