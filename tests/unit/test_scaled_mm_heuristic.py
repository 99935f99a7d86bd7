"""The quantized families' untuned choice, the `heuristic` sentinel's rule (configs.heuristic_config):
a shape no table names must never run slower than the vendor op where one exists. fp8 per-tensor
and row-wise scales resolve to torch._scaled_mm; block scales (no vendor arm) and int8 (whose
vendor arm refuses M <= 16 and ran at 0.4-0.6x of the tile at M=2048) keep the half-wave Triton
tile. The rule's revision is part of the fp8 family's impl_hash, and the shipped table's regions
keep meaning what was measured (issue 20, session 13)."""
import json
from pathlib import Path

import pytest
import torch

from tunedb import families
from tunedb.database import validators
from tunedb.families import scaled_mm
from tunedb.families.contract import source_hash
from tunedb.families.scaled_mm import configs, launch, ops
from tunedb.records import Config, Signature
from tunedb.runtime import selector

INT8 = families.get("scaled_mm")
FP8 = families.get("scaled_mm_fp8")
WHISPER = ((1280, 1280), (5120, 1280), (1280, 5120))  # widths no shipped table names
SHIPPED = Path(scaled_mm.__file__).resolve().parents[2] / "db" / "sm90" / "scaled_mm_fp8.json"


@pytest.mark.parametrize("scale", ["row", "tensor"])
@pytest.mark.parametrize("n, k", WHISPER + ((3072, 2048),))
def test_unseen_fp8_shape_serves_the_vendor_op_at_every_m(scale, n, k):
    sig = FP8.make_signature("scaled_mm", n, k, "bf16", scale)
    for m in (1, 16, 17, 2048, 8192):
        res = selector.resolve("scaled_mm_fp8", sig, m)
        assert (res.config.id, res.tier) == ("heuristic", "default")
        assert ops.served("scaled_mm_fp8", sig, m).id == "torch"
    assert configs.vendor_heuristic(sig)


def test_block_scales_and_unaligned_fp8_keep_the_triton_tile():
    for sig in (FP8.make_signature("scaled_mm", 1280, 5120, "bf16", "block"),
                FP8.make_signature("scaled_mm", 1288, 5120, "bf16", "row")):  # N % 16: no torch._scaled_mm
        tiles = {m: ops.served("scaled_mm_fp8", sig, m) for m in (1, 2048, 8192)}
        assert all(c.lane == "triton_mma" for c in tiles.values())
        assert tiles[1].id == configs.heuristic_tile(sig, 1).id != tiles[8192].id
        assert not configs.vendor_heuristic(sig)


def test_the_quant_op_keeps_the_fused_tile():
    """scaled_mm_quant's vendor path would be _scaled_mm then a separate row quantizer, never
    measured against the tile that fuses it: its untuned choice stays the tile."""
    for out in ("fp8",):
        sig = FP8.make_signature("scaled_mm_quant", 1280, 5120, out, "row")
        assert not configs.vendor_heuristic(sig)
        assert all(configs.heuristic_config(sig, m) == configs.heuristic_tile(sig, m) for m in (1, 2048))


def test_int8_heuristic_unchanged():
    sig = INT8.make_signature("scaled_mm", 1280, 5120, "bf16")
    for m in (1, 16, 17, 128, 2048, 8192):
        assert configs.heuristic_config(sig, m) == configs.heuristic_tile(sig, m)
        assert ops.served("scaled_mm", sig, m).lane == "triton_mma"
    assert configs.heuristic_config(sig, 4096).id == "b128x256x128_w8_s3_g8"
    # rule 1: int8's impl_hash is the plain source hash, so its shipped table stays fresh
    base = source_hash(Path(scaled_mm.__file__).parent, scaled_mm.KERNEL_SOURCES)
    assert validators.family_impl_hash(INT8) == base
    assert validators.family_impl_hash(FP8) != base  # rule 2: fp8 entries of rule 1 read stale


def test_the_launcher_runs_the_rules_arm(monkeypatch):
    """launch._heuristic resolves the sentinel per call's M through heuristic_config: the vendor
    arm for fp8 row-wise, the tile for block scales."""
    asked: list[str] = []
    monkeypatch.setattr(launch, "launcher", lambda config, sig: asked.append(config.id) or (lambda *a: None))
    x = torch.zeros((2048, 1280), dtype=torch.float8_e4m3fn)
    for scale, want in (("row", "torch"), ("block", configs.heuristic_tile(
            FP8.make_signature("scaled_mm", 1280, 1280, "bf16", "block"), 2048).id)):
        sig = FP8.make_signature("scaled_mm", 1280, 1280, "bf16", scale)
        launch._heuristic(sig)(x, None, None, None)
        assert asked[-1] == want


def _shipped():
    return json.loads(SHIPPED.read_text())


def test_shipped_table_regions_keep_their_measured_meaning():
    """A region naming `heuristic` in a tensor/row entry measured under rule 1 (another impl_hash)
    would now serve the vendor op, not the tile that was measured: none may exist below the
    catch-all (the catch-all above the largest measured M was never measured: it is the untuned
    choice, and serving the vendor op there is the fix)."""
    data = _shipped()
    rule2 = validators.family_impl_hash(FP8)
    for key, entry in data["entries"].items():
        sig = Signature.parse(key)
        measured_hash = entry.get("soft", {}).get("impl_hash", data["validators"].get("impl_hash"))
        if sig.get("scale") == "block" or measured_hash == rule2:
            continue
        below = [cid for m_hi, cid in entry["regions"] if m_hi is not None]
        assert "heuristic" not in below, (key, entry["regions"])


def test_shipped_row_tables_tail_serves_the_vendor_op():
    """Above the largest measured M (the catch-all), a row-wise entry serves torch._scaled_mm."""
    entries = _shipped()["entries"]
    key = next(k for k in entries if "scale=row" in k and "N=4096|K=4096" in k)
    sig = Signature.parse(key)
    regions = entries[key]["regions"]
    assert regions[-1] == [None, "heuristic"]
    above = max(m for m, _ in regions if m is not None) * 2
    res = selector.resolve("scaled_mm_fp8", sig, above)
    assert (res.config.id, res.tier) == ("heuristic", "system")
    assert ops.served("scaled_mm_fp8", sig, above).id == "torch"
    assert Config.sentinel("torch").is_sentinel
