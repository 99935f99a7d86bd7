"""What the shipped tables serve at shapes nobody measured (the founders' rule: never a slower
pick than the vendor op on an unseen shape).

A region's config serves a size only near where it was measured (runtime/serving.unsupported):
within a factor 2 of a size it won, or between two measured sizes at both of which it beat the
pick rule's fallback; elsewhere the fallback serves and tuning_report() says why. A signature no
tier measured gets the fallback, not a family's untuned Triton tile. Each case below is a
shipped entry and a size or key a real model calls that its build never measured.
"""
from __future__ import annotations

import pytest

from tunedb import settings
from tunedb.families.bmm.keys import make_signature as bmm_sig
from tunedb.families.gemm.signatures import make_signature as gemm_sig
from tunedb.families.group_gemm.keys import make_signature as moe_sig
from tunedb.families.linalg.signatures import make_signature as linalg_sig
from tunedb.families.scaled_mm.keys import make_signature as smm_sig
from tunedb.runtime import report, selector, serving
from tunedb.records import Config, Entry, Region, Signature

from fake_family import FakeFamily


@pytest.fixture
def shipped():
    """The shipped system tier alone (no user tier), for sm90."""
    with settings.override(USER_DB="off"):
        selector.configure("sm90")
        yield
    selector.configure()


def served(family: str, sig: Signature, m: int) -> tuple[str, str]:
    r = selector.peek(family, sig, m)
    return r.tier, r.config.id


def test_whisper_decoder_cross_attention_is_not_served_a_tile_timed_at_the_encoders_length(shipped):
    """bmm's Whisper entry (B=20 heads, N=1500 frames, K=64, q @ k^T) was measured at M=1500 only
    (the encoder); the decoder's cross-attention calls it at M=1 per token. The region [<=1500:
    tile] served the tile there, 10 octaves from its evidence."""
    sig = bmm_sig(20, 1500, 64, "half", "nt")
    assert served("bmm", sig, 1500) == ("system", "b64x128x64_w4_s3_g8")
    assert served("bmm", sig, 750) == ("system", "b64x128x64_w4_s3_g8")  # a factor 2 below
    for m in (1, 3, 100, 749):
        assert served("bmm", sig, m) == ("system", "torch")
    text = report.tuning_report()
    assert "bmm: 4 shape(s) beyond their entry's measured sizes" in text
    assert f"{sig.format()} M=1: b64x128x64_w4_s3_g8 won at M=1500" in text and "torch serves" in text


def test_a_fused_silu_tile_measured_from_m3_does_not_serve_m1(shipped):
    # the entry's first region's winner, measured from M=3 (session 17's table: the `gv` GEMV
    # slab, which took the region from b16x32x128_w4_s3_g8): within a factor 2 at M=2, not at M=1
    sig = gemm_sig("gemm_act", "half", 2048, 512, "silu", True)
    assert served("gemm", sig, 1) == ("system", "torch")
    assert served("gemm", sig, 2) == ("system", "gv1_n32x256_w4_s4_mma")
    assert served("gemm", sig, 3) == ("system", "gv1_n32x256_w4_s4_mma")


def test_a_prefill_tile_measured_at_2048_does_not_serve_the_sizes_between_decode_and_prefill(shipped):
    """scaled_mm int8 4096x4096 was measured at M = 1, 16, 2048; the TMA 128x256 tile that won at
    2048 served M = 17..2047 (at M=100: 16 CTAs on 132 SMs). The heuristic (the family's
    fallback) serves there now; 1024..2048 keep the tile."""
    sig = smm_sig("scaled_mm", "scaled_mm", 4096, 4096, "bf16")
    for m in (17, 100, 1000):
        assert served("scaled_mm", sig, m) == ("system", "heuristic")
    for m in (1024, 2048):
        assert served("scaled_mm", sig, m) == ("system", "tma_b128x256x128_w8_s3_g8")


def test_moe_sizes_far_from_the_tiles_evidence_get_torch(shipped):
    sig = moe_sig(128, 1536, 2048, 8, "bf16", "token")
    assert served("group_gemm", sig, 300) == ("system", "torch")  # 1.8 octaves below 1024, torch won at 256
    assert served("group_gemm", sig, 600) == ("system", "b128x256x64_w8_s4_g8")


def test_linalg_batches_outside_the_grid_keep_the_edge_winner_and_recommend_agrees(shipped):
    """linalg's problems are independent (its `extrapolates` hook): below the smallest measured
    batch (256) and above the largest (65536) the edge's winner serves where it beat torch by the
    gate there (potrf fp32 n=16, native winners: lane_p2_w1 2.9x at 256, warp_p2_w1 7.7x at 65536,
    session 25's table); a family without the hook falls back (the scaled_mm and MoE tests above)."""
    import tunedb

    sig = linalg_sig("potrf", "fp32", 16)
    for batch, arm in ((1, "lane_p2_w1"), (100, "lane_p2_w1"), (256, "lane_p2_w1"), (1000, "warp_p2_w1"),
                       (131072, "warp_p2_w1"), (10 ** 6, "warp_p2_w1")):
        assert served("linalg", sig, batch) == ("system", arm), batch
    for n in (5, 12, 16):
        for batch in (1, 100, 1000, 10 ** 6):
            plan = tunedb.recommend("potrf", "fp32", n, batch)
            assert plan.arm == served("linalg", linalg_sig("potrf", "fp32", n), batch)[1], (n, batch)


def test_an_unseen_moe_key_gets_the_untuned_tile_at_decode_and_torch_grouped_mm_above(shipped):
    """Mixtral's experts (E=8, N=14336, K=4096) are in no table: bf16 runs the untuned tile up to
    512 tokens (0.63x _grouped_mm's time at M=16, session 16 C) and torch._grouped_mm (the
    fallback) above (the tile 1.77x slower at M=4096, session 11 C); where torch's arm would be
    the host-syncing loop (fp16), the untuned tile at every size."""
    sig = moe_sig(8, 14336, 4096, 2, "bf16", "token")
    assert served("group_gemm", sig, 16) == ("default", "default")
    assert served("group_gemm", sig, 512) == ("default", "default")
    assert served("group_gemm", sig, 513) == ("default", "torch")
    assert served("group_gemm", moe_sig(8, 14336, 4096, 2, "fp16", "token"), 4096) == ("default", "default")
    assert served("group_gemm", moe_sig(8, 14336, 4096, 2, "fp16", "token"), 16) == ("default", "default")


def test_an_unseen_gemm_with_guesses_off_gets_torch_not_the_untuned_tile(shipped):
    """TUNEDB_MODEL_FALLBACK=0 (only measured entries) served GEMM's untuned 128x128 Triton tile
    on every shape no entry covers."""
    sig = gemm_sig("gemm", "half", 3584, 18944)  # Qwen2-7B's down projection
    with settings.override(MODEL_FALLBACK="0"):
        selector.reload()
        assert served("gemm", sig, 1) == ("default", "torch")
    with settings.override(HEURISTIC="0"):  # asks for the family default itself
        selector.reload()
        assert served("gemm", sig, 1) == ("default", "b128x128x64_w8_s3_g8")


# --- the rule itself, on a made-up entry

def _entry(regions, evidence) -> Entry:
    sig = Signature.parse("fake|op=mm|dt=half|N=128|K=64")
    return Entry(sig, tuple(Region(hi, cid) for hi, cid in regions), evidence)


def test_support_reads_the_regions_own_wins_and_the_fallback_at_both_neighbours():
    fam = FakeFamily()
    ev = {"M=16": {"a": [1.0, 0, 5], "big": [2.0, 0, 5], "torch": [3.0, 0, 5]},
          "M=256": {"a": [9.0, 0, 5], "big": [1.0, 0, 5], "torch": [2.0, 0, 5]}}
    entry = _entry([(16, "a"), (None, "big")], ev)
    assert serving.unsupported(fam, entry, 8, "a") is None  # a factor 2 below its win at 16
    assert "won at M=16" in serving.unsupported(fam, entry, 7, "a")
    assert serving.unsupported(fam, entry, 100, "big") is None  # beat torch at 16 and at 256
    assert serving.unsupported(fam, entry, 512, "big") is None
    assert "won at M=256" in serving.unsupported(fam, entry, 513, "big")
    assert serving.unsupported(fam, entry, 10 ** 6, "torch") is None  # the fallback needs no evidence
    # big behind torch at 16, and its time at 256 no better than torch's at 16 (rule 2b's bound)
    slow_at_16 = dict(ev, **{"M=16": {"a": [0.5, 0, 5], "big": [3.0, 0, 5], "torch": [0.9, 0, 5]}})
    assert serving.unsupported(fam, _entry([(16, "a"), (None, "big")], slow_at_16), 100, "big") is not None
    # behind torch at 16, but its time at 256 beats torch's at 16: at 100 it is the faster (2b)
    bounded = dict(ev, **{"M=16": {"a": [1.0, 0, 5], "big": [3.0, 0, 5], "torch": [3.0, 0, 5]}})
    assert serving.unsupported(fam, _entry([(16, "a"), (None, "big")], bounded), 100, "big") is None
    assert serving.unsupported(fam, _entry([(16, "a")], {}), 1, "a") is None  # no evidence: as written


@pytest.mark.parametrize("arch_family, version, has_grouped_mm", [
    ("sm80", (2, 8), True),    # an A100 on torch 2.8: _grouped_mm runs on sm90 only
    ("sm75", (2, 13), True),   # a T4: _grouped_mm needs sm80+
    ("sm90", (2, 7), False),   # torch before _grouped_mm
])
def test_an_unseen_bf16_moe_key_keeps_the_tile_where_torchs_arm_is_the_loop(monkeypatch, arch_family, version,
                                                                              has_grouped_mm):
    """Above 512 tokens the fallback is torch._grouped_mm only where it runs; where the torch arm
    is the per-expert loop (host sync every call, no CUDA graph) the untuned tile keeps serving."""
    import dataclasses

    import torch

    from tunedb import arch
    from tunedb.families import get
    from tunedb.families.group_gemm import arms

    fam = get("group_gemm")
    profile = dataclasses.replace(arch.shipped_profile("sm90"), arch_family=arch_family)
    monkeypatch.setattr(arms, "_version", lambda: version)
    if not has_grouped_mm:
        monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    sig = moe_sig(8, 14336, 4096, 2, "bf16", "token")
    assert fam.heuristic(sig, 4096, profile) == Config.sentinel("default")
    monkeypatch.undo()
    assert fam.heuristic(sig, 4096, arch.shipped_profile("sm90")) is None  # sm90 here: _grouped_mm


def test_the_oracle_replays_the_default_tier_the_runtime_serves(shipped):
    """evaluate's per-file selector falls to the runtime's default tier where a file has no entry:
    the family's heuristic first (group_gemm's untuned tile at decode sizes; scaled_mm's concrete
    arm at M), as the selector serves, not the fallback (regret was scored on an arm never run)."""
    from tunedb import arch
    from tunedb.database.schema import DatabaseFile
    from tunedb.evaluate import oracle
    from tunedb.families import get

    profile = arch.shipped_profile("sm90")
    for family, sig, ms in (("group_gemm", moe_sig(8, 14336, 4096, 2, "bf16", "token"), (16, 512, 4096)),
                            ("scaled_mm", smm_sig("scaled_mm", "scaled_mm", 3000, 5120, "bf16"), (1, 100, 3000))):
        fam = get(family)
        chosen, _ = oracle.selectors(fam, profile, [("empty", DatabaseFile(family, "sm90"))])
        for m in ms:
            want = selector.peek(family, sig, m).config
            want = fam.heuristic(sig, m, profile) if want.id == "heuristic" else want
            assert chosen["empty"](sig, m) == want.id, (family, m)


def test_the_report_of_unsupported_sizes_stays_short_for_a_server_of_many_lengths(shipped):
    """A decoder calls the Whisper cross-attention entry at every length 1..749: the report names
    a few and counts the rest, not one line per length."""
    sig = bmm_sig(20, 1500, 64, "half", "nt")
    for m in range(1, 750):
        assert served("bmm", sig, m) == ("system", "torch")
    text = report.tuning_report()
    assert "bmm: 749 shape(s) beyond their entry's measured sizes" in text
    assert f"{sig.format()} M=1: " in text and "... and 741 more" in text
    assert len(text.splitlines()) < 40
