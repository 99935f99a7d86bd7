"""The database file format: strict parsing, every corrupt case named, deterministic output."""
import copy
import json
from pathlib import Path

import pytest

from fake_family import install, valid_raw
from tunedb.database import schema
from tunedb.errors import CorruptDatabaseError, ValidatorMismatchError
from tunedb.records import Signature

SIG = "fake|op=mm|dt=half|N=128|K=64"


def test_valid_file_parses_into_entries_and_configs():
    db = schema.parse(valid_raw(), "f.json", "fake", "sm90")
    entry = db.entries[Signature.parse(SIG)]
    assert [(r.m_hi, r.config_id) for r in entry.regions] == [(64, "a"), (512, "b"), (None, "torch")]
    assert db.configs["b"].param("block") == 32
    assert db.validators["triton"] == "3.6.0"
    assert db.model == {"alpha": 1.5, "per_config": {"a": [1, 2]}}
    assert db.referenced_config_ids() == ("a", "b")


def test_dumps_round_trips_and_is_deterministic():
    db = schema.parse(valid_raw())
    text = schema.dumps(db)
    again = schema.parse(schema.loads(text))
    assert again == db and again.model == db.model and again.configs == db.configs
    assert schema.dumps(again) == text
    assert '"regions": [[64, "a"], [512, "b"], [null, "torch"]]' in text  # one region list per line


def _mutate(path, value):
    raw = valid_raw()
    target = raw
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()
E = ("entries", SIG)

CORRUPT = [
    ("top level not an object", lambda: [1, 2], "top level must be a JSON object"),
    ("missing schema", lambda: _mutate(("schema",), _DELETE), "missing top-level key 'schema'"),
    ("schema not int", lambda: _mutate(("schema",), "1"), "'schema' must be an integer"),
    ("family not str", lambda: _mutate(("kernel_family",), 3), "'kernel_family' must be a non-empty"),
    ("bad arch", lambda: _mutate(("arch_family",), "hopper"), "sm<digits>"),
    ("unknown top key", lambda: _mutate(("extra",), {}), "unknown top-level keys ['extra']"),
    ("validators not object", lambda: _mutate(("validators",), ["x"]), "'validators' must be an object"),
    ("unknown validator", lambda: _mutate(("validators", "gpu"), "x"), "unknown validator 'gpu'"),
    ("validator not str", lambda: _mutate(("validators", "triton"), 3.6), "must be a string"),
    ("configs not object", lambda: _mutate(("configs",), []), "'configs' must be an object"),
    ("config without lane", lambda: _mutate(("configs", "a"), {"block": 16}), "string 'lane'"),
    ("sentinel defined", lambda: _mutate(("configs", "torch"), {"lane": "torch"}), "is a sentinel"),
    ("bad config id", lambda: _mutate(("configs", "a b"), {"lane": "toy"}), "bad config id"),
    ("entries not object", lambda: _mutate(("entries",), []), "'entries' must be an object"),
    ("bad signature key", lambda: _mutate(("entries", "fake|op=mm|dt=fp128"), {"regions": [[None, "a"]]}),
     "fp128"),
    ("other family's entry", lambda: _mutate(("entries", "gemm|op=gemm|dt=half|N=1"),
                                             {"regions": [[None, "torch"]]}), "belongs to kernel family"),
    ("entry not object", lambda: _mutate(E, [[None, "a"]]), "must be an object"),
    ("unknown entry key", lambda: _mutate(E + ("region",), []), "unknown keys ['region']"),
    ("no regions", lambda: _mutate(E + ("regions",), _DELETE), "has no 'regions'"),
    ("empty regions", lambda: _mutate(E + ("regions",), []), "non-empty list"),
    ("region not a pair", lambda: _mutate(E + ("regions",), [[64, "a", 1]]), "[m_hi, config_id]"),
    ("m_hi a string", lambda: _mutate(E + ("regions",), [["64", "a"]]), "positive int or null"),
    ("m_hi zero", lambda: _mutate(E + ("regions",), [[0, "a"]]), "positive int or null"),
    ("m_hi bool", lambda: _mutate(E + ("regions",), [[True, "a"]]), "positive int or null"),
    ("m_hi float", lambda: _mutate(E + ("regions",), [[6.5, "a"]]), "positive int or null"),
    ("config id not str", lambda: _mutate(E + ("regions",), [[None, 5]]), "must be a string"),
    ("unsorted regions", lambda: _mutate(E + ("regions",), [[512, "b"], [64, "a"]]), "sorted"),
    ("duplicate regions", lambda: _mutate(E + ("regions",), [[64, "a"], [64, "b"]]), "without duplicates"),
    ("catch-all not last", lambda: _mutate(E + ("regions",), [[None, "a"], [64, "b"]]), "must be the last"),
    ("two catch-alls", lambda: _mutate(E + ("regions",), [[None, "a"], [None, "b"]]), "must be the last"),
    ("undefined config", lambda: _mutate(E + ("regions",), [[None, "nope"]]), "does not define"),
    ("evidence not object", lambda: _mutate(E + ("evidence",), []), "'evidence' must be an object"),
    ("evidence bad point", lambda: _mutate(E + ("evidence",), {"64": {}}), "'M=<positive int>'"),
    ("evidence bad triple", lambda: _mutate(E + ("evidence",), {"M=64": {"a": [0.1, 0.1]}}),
     "[median_ms, sigma_ms, n]"),
    ("evidence negative", lambda: _mutate(E + ("evidence",), {"M=64": {"a": [-1, 0.1, 3]}}),
     "[median_ms, sigma_ms, n]"),
    ("evidence inf-like", lambda: _mutate(E + ("evidence",), {"M=64": {"a": "inf"}}), "failure status"),
    ("source not str", lambda: _mutate(E + ("source",), 1), "'source' must be a string"),
    ("soft not object", lambda: _mutate(E + ("soft",), "x"), "'soft' must be an object"),
    ("soft unknown", lambda: _mutate(E + ("soft",), {"nvcc": "12"}), "unknown validator 'nvcc'"),
    ("soft one-item list", lambda: _mutate(E + ("soft",), {"triton": ["3.6.0"]}), "list of >= 2"),
    ("notes not strings", lambda: _mutate(E + ("notes",), [1]), "'notes' must be a list of strings"),
    ("model not object", lambda: _mutate(("model",), [1]), "'model' must be an object"),
    # an edited body under the old id: caches and compiled kernels know a config by its id
    ("config body contradicts its id", lambda: _mutate(("configs", "b", "block"), 48),
     "config 'b': its body contradicts its id in block"),
    ("config lane contradicts its id", lambda: _mutate(("configs", "b", "lane"), "fused"), "contradicts its id in lane"),
    ("config id of no config", lambda: _mutate(("configs", "nope"), {"lane": "toy", "block": 16}),
     "config 'nope': the id is not one of fake's configs"),
]


@pytest.mark.parametrize("name, make, message", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_structure_is_named(name, make, message):
    install()  # the configs' ids are checked against the family's own grammar
    with pytest.raises(CorruptDatabaseError) as err:
        schema.parse(make(), "the/file.json")
    assert "the/file.json" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize("text, message", [
    ('{"schema": 1, "kernel_family": "fake"', "not valid JSON"),  # truncated
    ("", "not valid JSON"),
    ("schema = 1", "not valid JSON"),
    ('{"schema": 1, "schema": 1}', "duplicate key 'schema'"),
])
def test_text_that_is_not_json_is_corrupt(text, message):
    with pytest.raises(CorruptDatabaseError, match=message):
        schema.loads(text, "x.json")


def test_duplicate_entry_key_is_corrupt():
    text = json.dumps(valid_raw())
    entry = json.dumps(valid_raw()["entries"][SIG])
    doubled = text.replace('"entries": {', f'"entries": {{"{SIG}": {entry}, ', 1)
    with pytest.raises(CorruptDatabaseError, match="duplicate key"):
        schema.loads(doubled, "x.json")


def test_file_that_is_not_utf8_is_corrupt(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CorruptDatabaseError, match="UTF-8"):
        schema.load(path)


@pytest.mark.parametrize("over, message", [
    ({"schema": 2}, "schema 2 is not supported"),
    ({"kernel_family": "gemm"}, "kernel_family is 'gemm', expected 'fake'"),
    ({"arch_family": "sm80"}, "arch_family is 'sm80', expected 'sm90'"),
])
def test_hard_validator_mismatch(over, message):
    with pytest.raises(ValidatorMismatchError, match=message):
        schema.parse(valid_raw(**over), "f.json", "fake", "sm90")


def test_sentinels_and_failure_statuses_need_no_definition():
    raw = valid_raw()
    raw["entries"][SIG]["regions"] = [[8, "default"], [16, "fused"], [32, "heuristic"], [None, "torch"]]
    raw["entries"][SIG]["evidence"] = {"M=8": {"zz": "timeout", "torch": [0.1, 0.0, 5]}}
    db = schema.parse(raw)
    assert db.referenced_config_ids() == ()


def test_mixed_soft_validator_parses_to_a_tuple_and_round_trips():
    raw = valid_raw()
    raw["entries"][SIG]["soft"] = {"triton": ["3.6.0", "3.9.0"]}
    db = schema.parse(copy.deepcopy(raw))
    assert db.entries[Signature.parse(SIG)].soft == {"triton": ("3.6.0", "3.9.0")}
    assert schema.parse(schema.loads(schema.dumps(db))) == db


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_corrupt(constant):
    text = json.dumps(valid_raw()).replace("0.01", constant, 1)
    with pytest.raises(CorruptDatabaseError, match="non-finite number"):
        schema.loads(text, "x.json")


def test_an_overflowing_literal_is_corrupt_not_an_infinite_time():
    # json reads 1e999 as inf without a NaN/Infinity constant: the reader refuses it (session 53:
    # anywhere in the file; before, only the evidence check did, and a model's 1e400 served)
    text = json.dumps(valid_raw()).replace("0.01", "1e999", 1)
    with pytest.raises(CorruptDatabaseError, match="1e999 is beyond a float"):
        schema.parse(schema.loads(text, "x.json"), "x.json")


def test_a_path_that_is_not_a_regular_file_is_corrupt_not_a_hang(tmp_path):
    import os

    fifo = tmp_path / "fake.json"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(CorruptDatabaseError, match="not a regular file"):
        schema.load(fifo)
    with pytest.raises(CorruptDatabaseError, match="not a regular file"):
        schema.load(Path("/dev/zero"))


def test_deep_nesting_is_corrupt_not_a_crash():
    with pytest.raises(CorruptDatabaseError, match="nested too deeply"):
        schema.loads("[" * 100000 + "]" * 100000, "x.json")


def test_regions_native_round_trips_and_serves_native_lookups(tmp_path):
    raw = valid_raw()
    raw["entries"][SIG]["regions_native"] = [[512, "a"], [None, "torch"]]
    db = schema.parse(raw, "f.json", "fake", "sm90")
    entry = db.entries[Signature.parse(SIG)]
    assert [(r.m_hi, r.config_id) for r in entry.regions_native] == [(512, "a"), (None, "torch")]
    assert entry.lookup(300) == "b" and entry.lookup(300, native=True) == "a"
    text = schema.dumps(db)
    assert '"regions_native": [[512, "a"], [null, "torch"]]' in text
    again = schema.parse(schema.loads(text))
    assert again == db and schema.dumps(again) == text


def test_absent_regions_native_means_the_same_as_regions():
    entry = schema.parse(valid_raw()).entries[Signature.parse(SIG)]
    assert entry.regions_native is None
    assert entry.lookup(300, native=True) == entry.lookup(300) == "b"
    assert "regions_native" not in schema.entry_to_json(entry)


def test_regions_native_naming_an_undefined_config_is_corrupt():
    raw = valid_raw()
    raw["entries"][SIG]["regions_native"] = [[None, "nope"]]
    with pytest.raises(CorruptDatabaseError, match="regions_native.*'nope'"):
        schema.parse(raw)


def test_store_merge_keeps_regions_native(tmp_path):
    from dataclasses import replace

    from tunedb.database import store
    from tunedb.records import Region

    db = schema.parse(valid_raw())
    sig = Signature.parse(SIG)
    new = replace(db.entries[sig], regions_native=(Region(None, "a"),))
    merged = store.merge(db, "fake", "sm90", [new], db.configs, {"impl_hash": "fakehash1"})
    assert merged.entries[sig].regions_native == (Region(None, "a"),)
    extended = store.merge(merged, "fake", "sm90", [db.entries[sig]], db.configs,
                           {"impl_hash": "fakehash1"}, extend=True)
    # the new entry has no native regions: its regions stand for them, and new regions win
    assert extended.entries[sig].regions_native == db.entries[sig].regions


def test_a_writer_refuses_a_config_whose_body_contradicts_its_id(tmp_path):
    """A file every later load would refuse is not written (nothing is left behind either)."""
    from tunedb import database
    from tunedb.errors import DatabaseError
    from tunedb.records import Config, Entry, Region

    install()
    wrong = Config("b", "toy", (("block", 48),))
    target = tmp_path / "user"
    with pytest.raises(DatabaseError, match="config 'b' cannot be written.*contradicts its id in block"):
        database.write_entries(str(target), "fake", "sm90", [Entry(Signature.parse("fake|op=mm|dt=half|N=128|K=64"),
                                                                  (Region(None, "b"),))], [wrong])
    assert not any(target.rglob("*.json"))
