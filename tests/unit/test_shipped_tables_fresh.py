"""Every shipped table was measured with the kernels this tree holds: its impl_hash (the hash over
the family's KERNEL_SOURCES) equals the family's now, in the file's validators and in any entry's
own. A change to a hashed source without the device rebuild that goes with it makes the shipped
entries read stale in `tunedb status` and re-measured by `tunedb tune` on a GPU: this test says
which table and which family, so the change is reverted or the table rebuilt."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedb import families

DB = Path(__file__).resolve().parents[2] / "src" / "tunedb" / "db"
TABLES = sorted(p for p in DB.glob("*/*.json"))


def test_the_shipped_tables_are_found():
    assert {p.stem for p in TABLES} >= {"gemm", "linalg", "scaled_mm", "scaled_mm_fp8", "group_gemm"}


@pytest.mark.parametrize("path", TABLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_table_matches_its_family_sources(path):
    doc = json.loads(path.read_text())
    fam = families.get(doc.get("kernel_family", path.stem))
    now = fam.impl_hash()
    assert doc["validators"].get("impl_hash") == now, (
        f"{path.name}: measured with impl_hash {doc['validators'].get('impl_hash')}, the sources hash to {now}: "
        f"a hashed kernel source changed without the table's rebuild")
    for sig, entry in doc["entries"].items():  # an entry's own (`soft`) validators: one value or several
        own = (entry.get("soft") or {}).get("impl_hash")
        assert own in (None, now, [now]), f"{path.name} {sig}: entry measured with impl_hash {own}, sources {now}"
