"""Which arm serves the small linear-algebra ops' eager calls (families/linalg/eager.py), judged
against the shipped sm90 table and session 29's eager measurement on the H200 (a Triton gemv
0.27-0.31x of torch.bmm eagerly at batch <= 4096; at 65536 1.03-2.27x on one host, 0.63-2.04x on
a slower one; the CUDA tier's arms and
posv's Triton arms faster than torch's forms at every batch). No GPU: the rule is pure Python, and
the dispatch path is checked with meta tensors and a recording launch."""
from __future__ import annotations

import pytest
import torch

from tunedb import database, families
from tunedb.families.linalg import eager, signatures
from tunedb.records import Config, Entry, Region
from tunedb.runtime import dispatch, host_bound, selector

FAM = families.get("linalg")


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.delenv("TUNEDB_USER_DB", raising=False)
    selector.configure(arch_family="sm90", arch=selector.shipped_profile("sm90"))
    yield selector.shipped_profile("sm90")
    selector.configure()


def _decide(op, dt, n, batch, cid, profile):
    sig = signatures.make_signature(op, dt, n)
    return FAM.eager_fallback(sig, batch, FAM.parse_config(cid), profile)


@pytest.mark.parametrize("n,batch,cid,want", [
    (8, 512, "warp_p8_w1", "torch"),     # measured 0.30x eagerly
    (8, 4096, "warp_p8_w1", "torch"),    # 0.30x
    (32, 16, "warp_p2_w4", "torch"),     # 0.30x
    (16, 4096, "warp_p4_w2", "torch"),   # 0.28x
    # batch 65536: torch's bmm takes 48-64 us of kernel; the arm's prepared launch (31-36 us of host
    # on a fast host, 50-54 on a slow one: session 30 calls 3, 4) ran n = 4, 8 1.45-1.60x / 0.89-0.97x
    # eagerly, n = 16 1.43x / 1.25x: torch keeps the first two
    (4, 65536, "warp_p32_w1", "torch"),
    (8, 65536, "warp_p8_w1", "torch"),
    (16, 65536, "warp_p2_w1", None),
    (32, 65536, "warp_p2_w4", None),     # 2.23x: torch's bmm takes 156 us there
])
def test_a_triton_gemv_serves_torch_eagerly_only_where_the_host_outweighs_its_kernel(sm90, n, batch, cid, want):
    assert _decide("gemv", "fp32", n, batch, cid, sm90) == want


@pytest.mark.parametrize("op,n,batch,cid", [
    ("potrf", 8, 16, "cudas_p4_w1"), ("potrf", 32, 512, "cudas_p1_w1"), ("trsv", 8, 4096, "cuda_p16_w4"),
    ("posv", 32, 16, "cudas_p1_w1"),   # the CUDA tier's prepared launch: less host time than torch's form
    ("posv", 8, 16, "lane_p4_w1"), ("posv", 4, 512, "reg_p32_w1"),  # torch's posv is three calls
])
def test_arms_whose_host_time_is_below_torchs_keep_their_eager_calls(sm90, op, n, batch, cid):
    assert _decide(op, "fp32", n, batch, cid, sm90) is None


def test_sentinels_are_never_replaced(sm90):
    sig = signatures.make_signature("gemv", "fp32", 8)
    assert FAM.eager_fallback(sig, 512, Config.sentinel("torch"), sm90) is None


def test_kernel_time_is_interpolated_in_batch_from_the_entry_evidence():
    ev = {"M=256": {"a": [0.002, 0, 9]}, "M=4096": {"a": [0.004, 0, 9]}, "M=65536": {"a": [0.06, 0, 9]},
          "_stat": "q25"}
    assert eager.kernel_us(ev, "a", 16) == pytest.approx(2.0)        # below: the smallest batch's time
    assert eager.kernel_us(ev, "a", 2176) == pytest.approx(3.0)      # halfway from 256 to 4096
    assert eager.kernel_us(ev, "a", 131072) == pytest.approx(120.0)  # above: linear in batch
    assert eager.kernel_us(ev, "b", 512) is None
    assert eager.kernel_us({"M=256": {"a": "junk"}}, "a", 512) is None


def test_without_evidence_torch_is_judged_by_its_memory_floor(sm90):
    sig = signatures.make_signature("gemv", "fp32", 8)
    cfg = FAM.parse_config("warp_p8_w1")
    assert eager.decide(sig, 512, cfg, sm90, None) == "torch"  # a few KB: torch's host time bounds it
    assert eager.decide(sig, 2 ** 24, cfg, sm90, None) is None  # 5 GB: torch's kernel is the bound


@pytest.fixture
def recording(tiers_dirs, monkeypatch):
    ran: list[str] = []

    def launch(config, sig, *args, out=None, **kwargs):
        ran.append(config.id)
        return config.id

    monkeypatch.setattr(FAM, "launch", launch)
    monkeypatch.setattr(host_bound, "_cuda", lambda: True)
    dispatch.clear()
    yield ran
    dispatch.clear()


def test_dispatch_serves_torch_eagerly_and_the_tuned_arm_under_capture(recording, monkeypatch):
    sig = signatures.make_signature("gemv", "fp32", 8)
    ev = {"M=4096": {"warp_p8_w1": [0.0016, 0, 9], "torch": [0.0042, 0, 9]}}
    database.write_entries("user", "linalg", "sm90", [Entry(sig, (Region(None, "warp_p8_w1"),), evidence=ev)],
                           [FAM.parse_config("warp_p8_w1")])
    selector.reload()
    meta = dict(device="meta", dtype=torch.float32)
    args = (torch.empty(4096, 8, 8, **meta), torch.empty(4096, 8, **meta))
    monkeypatch.setattr(host_bound, "_capturing", lambda: False)
    assert dispatch.call("linalg", "gemv", *args) == "torch"
    b = dispatch.bound("linalg", "gemv", *args)
    assert b.config.id == "warp_p8_w1" and b.eager == "torch"  # the report names the tuned pick
    monkeypatch.setattr(host_bound, "_capturing", lambda: True)
    assert dispatch.call("linalg", "gemv", *args) == "warp_p8_w1"
    assert recording == ["torch", "warp_p8_w1"]
