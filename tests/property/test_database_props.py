"""Properties of the database: region lookup, write/read round trip, merges never drop entries."""
from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from tunedb.database import load, merge, schema, write_entries
from tunedb.database.validators import SOFT_VALIDATORS, UNKNOWN
from tunedb.records import Config, Entry, Region, Signature

IDS = ("c1", "c2", "c3", "torch", "default")
CONFIGS = {cid: Config(cid, "toy", (("block", 16 * i),)) for i, cid in enumerate(("c1", "c2", "c3"), 1)}
VALIDATORS = st.fixed_dictionaries({}, optional={
    "triton": st.sampled_from(["3.6.0", "3.9.0"]), "torch": st.sampled_from(["2.11.0", "2.13.0"]),
    "sku": st.sampled_from(["NVIDIA H200", "NVIDIA H100"])})


@st.composite
def regions(draw, catch_all=None):
    his = sorted(draw(st.sets(st.integers(1, 1 << 20), min_size=0, max_size=6)))
    out = [Region(h, draw(st.sampled_from(IDS))) for h in his]
    if (draw(st.booleans()) if catch_all is None else catch_all) or not out:
        out.append(Region(None, draw(st.sampled_from(IDS))))
    return tuple(out)


def signature(n: int, dt: str = "half") -> Signature:
    return Signature.make("fake", "mm", dt, N=n, K=64)


@st.composite
def entries(draw, min_size=0, max_size=6):
    ns = draw(st.sets(st.integers(1, 4096), min_size=min_size, max_size=max_size))
    out = []
    for n in sorted(ns):
        evidence = draw(st.dictionaries(
            st.integers(1, 4096).map(lambda m: f"M={m}"),
            st.dictionaries(st.sampled_from(IDS), st.one_of(
                st.tuples(st.floats(0, 10), st.floats(0, 1), st.integers(0, 100)).map(list),
                st.sampled_from(["compile_error", "timeout", "incorrect"])), max_size=3),
            max_size=3))
        notes = tuple(draw(st.lists(st.text("abc M=*", max_size=12), max_size=2)))
        out.append(Entry(signature(n, draw(st.sampled_from(["half", "bf16"]))), draw(regions()),
                         evidence, draw(st.sampled_from(["build", "autotune"])), {}, notes))
    return out


@given(regions(), st.integers(1, 1 << 21))
def test_lookup_is_the_first_region_at_or_above_m_else_the_catch_all(rs, m):
    entry = Entry(signature(64), rs)
    expected = next((r.config_id for r in rs if r.m_hi is not None and r.m_hi >= m), None)
    if expected is None:
        expected = next((r.config_id for r in rs if r.m_hi is None), None)
    assert entry.lookup(m) == expected
    # regions round up: a bounded region never serves an M above its m_hi
    served = next(r for r in rs if r.m_hi is None or r.m_hi >= m) if expected is not None else None
    if served is not None and served.m_hi is not None:
        assert m <= served.m_hi


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# a table's numbers fit in 64 bits (schema.MAX_INT): a larger one makes the file corrupt, and the writer refuses it
@given(entries(), VALIDATORS, st.one_of(st.none(), st.dictionaries(st.text(max_size=5),
                                                                   st.integers(-(2 ** 63 - 1), 2 ** 63 - 1))))
def test_write_then_read_round_trips(es, validators, model):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fake.json"
        write_entries(path, "fake", "sm90", es, CONFIGS, validators, model=model)
        db = load(path, "fake", "sm90")
        assert {e.signature: e for e in es} == dict(db.entries)
        assert db.validators == validators and db.model == model
        assert schema.dumps(db) == path.read_text()


@hsettings(max_examples=60, deadline=None)
@given(entries(max_size=5), entries(max_size=5), VALIDATORS, VALIDATORS, st.booleans())
def test_a_merge_never_drops_another_writers_entry(first, second, v1, v2, extend):
    db1 = merge(None, "fake", "sm90", first, CONFIGS, v1)
    db2 = merge(db1, "fake", "sm90", second, CONFIGS, v2, extend=extend)
    assert set(db2.entries) == {e.signature for e in first} | {e.signature for e in second}
    mine = {e.signature for e in second}
    for sig, entry in db1.entries.items():
        if sig not in mine:  # untouched: same regions, and still its own validators
            assert db2.entries[sig].regions == entry.regions
            # a validator the first writer did not record is "unknown" for its entries, never
            # the second writer's value
            want = {**v2, **v1, **{k: UNKNOWN for k in v2 if k not in v1 and k in SOFT_VALIDATORS}}
            assert {**db2.validators, **db2.entries[sig].soft} == want
    assert schema.parse(schema.loads(schema.dumps(db2))) == db2  # and the result is a valid file
