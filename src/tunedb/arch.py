"""ArchProfile: device ceilings, queried and micro-benchmarked, cached per SKU; shipped per arch family.

(Minimal first cut: loading shipped profiles. Querying and micro-benchmarking arrive with the
measurement-protocol issue.)
"""
from __future__ import annotations

import json
from importlib import resources

from tunedb.errors import TunedbError
from tunedb.records import ArchProfile

SHIPPED_ARCHES: tuple[str, ...] = ("sm90",)


def shipped_profile(arch_family: str) -> ArchProfile:
    """The profile shipped as package data for `arch_family` (so a CPU machine can plan for it)."""
    if arch_family not in SHIPPED_ARCHES:
        raise TunedbError(
            f"no shipped arch profile for {arch_family!r}; shipped: {', '.join(SHIPPED_ARCHES)}"
        )
    text = resources.files("tunedb.data").joinpath(f"arch_{arch_family}.json").read_text()
    return ArchProfile.from_json(json.loads(text))
