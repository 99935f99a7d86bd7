"""Soft validators: what this process reports, staleness, mixed entries, the `soft` field."""
import logging

import pytest

from fake_family import tier_dirs_fixture, valid_raw
from tunedb import database
from tunedb.database import validators as vals
from tunedb.errors import DatabaseWarning

tier_dirs = tier_dirs_fixture()


def test_current_reports_versions_and_leaves_unknowns_out():
    import torch
    import triton

    now = vals.current(impl_hash="abc")
    assert now["torch"] == str(torch.__version__) and now["triton"] == str(triton.__version__)
    assert now["impl_hash"] == "abc" and now["tunedb"] == "0.1.0"
    if not torch.cuda.is_available():
        assert "sku" not in now
    assert "impl_hash" not in vals.current()


def test_stale_reasons_compare_only_what_both_sides_know():
    was = {"triton": "3.6.0", "torch": "2.11.0", "sku": "NVIDIA H200"}
    assert vals.stale_reasons(was, {"triton": "3.6.0", "torch": "2.11.0"}) == ()  # sku unknown now
    assert vals.stale_reasons(was, {"triton": "3.9.0", "sku": "NVIDIA H100"}) == (
        "sku NVIDIA H200 (now NVIDIA H100)", "triton 3.6.0 (now 3.9.0)")
    assert vals.stale_reasons({"triton": ("3.6.0", "3.9.0")}, {"triton": "3.9.0"}) == (
        "triton mixed: measured under 3.6.0, 3.9.0",)


def test_mixed_and_soft_field():
    old, new = {"triton": "3.6.0", "sku": "H200"}, {"triton": "3.9.0", "sku": "H200", "torch": "2.13"}
    assert vals.mixed(old, new) == {"triton": ("3.6.0", "3.9.0"), "sku": "H200", "torch": "2.13"}
    assert vals.mixed(vals.mixed(old, new), {"triton": "3.6.0"})["triton"] == ("3.6.0", "3.9.0")
    assert vals.mixed(old, old) == old
    assert vals.soft_field({"triton": "3.6.0", "sku": "H200"}, {"triton": "3.9.0", "sku": "H200"}) == {
        "triton": "3.6.0"}


def test_family_impl_hash_accepts_a_string_or_a_callable():
    class A:
        impl_hash = "h"

    class B:
        def impl_hash(self):
            return "h2"

    assert vals.family_impl_hash(A()) == "h" and vals.family_impl_hash(B()) == "h2"
    assert vals.family_impl_hash(object()) is None


def test_soft_mismatch_keeps_the_file_in_service_and_reports_stale_entries(tier_dirs):
    raw = valid_raw()
    raw["entries"]["fake|op=mm|dt=half|N=256|K=64"] = {"regions": [[None, "b"]], "soft": {"triton": "3.4.0"}}
    tier_dirs.write("system", raw)
    database.reload()
    (res,) = database.lookup("sm90", "fake")  # served: soft validators never skip a file
    assert res.tier == "system"
    report = database.report("sm90", environment=lambda fam: {"triton": "3.6.0", "torch": "2.11.0+cu130"})
    (f,) = [f for t in report.tiers for f in t.files]
    assert f.state == "loaded" and f.entries == 2
    assert f.stale == (("fake|op=mm|dt=half|N=256|K=64", ("triton 3.4.0 (now 3.6.0)",)),)


def test_skip_warning_is_also_logged(tier_dirs, caplog):
    tier_dirs.write("system", None, text="{not json")
    database.reload()
    with caplog.at_level(logging.WARNING, logger="tunedb"), pytest.warns(DatabaseWarning):
        database.lookup("sm90", "fake")
    assert any("not valid JSON" in r.getMessage() for r in caplog.records)


def test_an_entry_measured_before_a_validator_was_recorded_is_stale_not_restamped():
    from tunedb.database import store, validators as vals
    from tunedb.records import Entry, Region, Signature

    old_sig = Signature.parse("gemm|op=gemm|dt=half|N=512|K=256")
    new_sig = Signature.parse("gemm|op=gemm|dt=half|N=1024|K=256")
    first = store.merge(None, "gemm", "sm90", [Entry(old_sig, (Region(None, "torch"),))], {},
                        {"tunedb": "0.0.9", "torch": "2.10"})
    second = store.merge(first, "gemm", "sm90", [Entry(new_sig, (Region(None, "torch"),))], {},
                         {"tunedb": "0.1.0", "torch": "2.10", "impl_hash": "abc123"})
    seen = vals.effective(second.validators, second.entries[old_sig].soft)
    assert seen["impl_hash"] == vals.UNKNOWN
    assert any("impl_hash" in r for r in vals.stale_reasons(seen, {"impl_hash": "abc123"}))
    assert vals.effective(second.validators, second.entries[new_sig].soft)["impl_hash"] == "abc123"
