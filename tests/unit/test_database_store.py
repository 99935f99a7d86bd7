"""Writers: locked merge-on-write, re-stamping soft validators, model round-trip, corrupt-file refusal."""
import json
import os

import filelock
import pytest

from fake_family import SPACE, sig, tier_dirs_fixture, valid_raw
from tunedb import database, settings
from tunedb.database import schema, store
from tunedb.errors import CorruptDatabaseError, DatabaseError, ValidatorMismatchError
from tunedb.records import Config, Entry, Region

tier_dirs = tier_dirs_fixture()

OLD = {"impl_hash": "h1", "triton": "3.6.0", "torch": "2.11.0"}
NEW = {"impl_hash": "h1", "triton": "3.9.0", "torch": "2.13.0"}


def entry(n, regions, **kw):
    return Entry(sig(n=n), tuple(Region(m, c) for m, c in regions), **kw)


def write(path, entries, validators=OLD, configs=(SPACE["a"], SPACE["b"]), **kw):
    return database.write_entries(path, "fake", "sm90", entries, configs, validators, **kw)


def test_write_to_user_tier_creates_a_readable_file_and_a_lock(tier_dirs):
    path = write("user", [entry(128, [(64, "a"), (None, "torch")])])
    assert path == tier_dirs.path("user")
    db = database.load(path, "fake", "sm90")
    assert db.entries[sig(n=128)].lookup(100) == "torch"
    assert db.validators == OLD
    assert set(db.configs) == {"a"}  # only configs an entry names
    assert store.lock_path(path).exists()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_write_to_disabled_user_tier_is_an_error():
    with settings.override(USER_DB="off"):
        with pytest.raises(DatabaseError, match="TUNEDB_USER_DB=off"):
            write("user", [entry(128, [(None, "a")])])


def test_merge_keeps_other_writers_entries_and_replaces_its_own(tmp_path):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(None, "a")]), entry(256, [(None, "b")])])
    write(path, [entry(128, [(32, "b"), (None, "torch")])])
    db = database.load(path)
    assert db.entries[sig(n=256)].lookup(1) == "b"
    assert [r.to_json() for r in db.entries[sig(n=128)].regions] == [[32, "b"], [None, "torch"]]


def test_restamp_keeps_unmeasured_entries_validators_in_soft(tmp_path):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(None, "a")])], validators=OLD)
    write(path, [entry(256, [(None, "b")])], validators=NEW)
    db = database.load(path)
    assert db.validators == NEW
    assert db.entries[sig(n=256)].soft == {}
    assert db.entries[sig(n=128)].soft == {"triton": "3.6.0", "torch": "2.11.0"}
    now = NEW
    stale = {s: database.stale_reasons({**db.validators, **e.soft}, now) for s, e in db.entries.items()}
    assert stale[sig(n=256)] == ()
    assert stale[sig(n=128)] == ("triton 3.6.0 (now 3.9.0)", "torch 2.11.0 (now 2.13.0)")
    # a third writer with the old validators again: the first entry is fresh, the second keeps NEW
    write(path, [], validators=OLD)
    db = database.load(path)
    assert db.entries[sig(n=128)].soft == {}
    assert db.entries[sig(n=256)].soft == {"triton": "3.9.0", "torch": "2.13.0"}


def test_rebuilding_an_entry_clears_its_soft_validators(tmp_path):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(None, "a")])], validators=OLD)
    write(path, [entry(256, [(None, "b")])], validators=NEW)
    write(path, [entry(128, [(None, "b")])], validators=NEW)
    assert database.load(path).entries[sig(n=128)].soft == {}


def test_extending_an_entry_under_new_validators_makes_it_mixed_and_stale(tmp_path):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(64, "a"), (None, "torch")], evidence={"M=64": {"a": [0.1, 0.01, 9]}})],
          validators=OLD)
    write(path, [entry(128, [(16, "b"), (64, "b")], evidence={"M=16": {"b": [0.05, 0.01, 9]}})],
          validators=NEW, extend=True)
    db = database.load(path)
    e = db.entries[sig(n=128)]
    assert [r.to_json() for r in e.regions] == [[16, "b"], [64, "b"], [None, "torch"]]
    assert set(e.evidence) == {"M=16", "M=64"}
    assert e.soft == {"triton": ("3.6.0", "3.9.0"), "torch": ("2.11.0", "2.13.0")}
    reasons = database.stale_reasons({**db.validators, **e.soft}, NEW)
    assert reasons == ("triton mixed: measured under 3.6.0, 3.9.0", "torch mixed: measured under 2.11.0, 2.13.0")
    assert database.stale_reasons({**db.validators, **e.soft}, OLD) != ()  # stale everywhere
    write(path, [entry(128, [(None, "b")])], validators=NEW)  # a rebuild ends it
    assert database.load(path).entries[sig(n=128)].soft == {}


def test_extending_under_the_same_validators_stays_fresh(tmp_path):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(64, "a")])], validators=NEW)
    write(path, [entry(128, [(128, "b")])], validators=NEW, extend=True)
    e = database.load(path).entries[sig(n=128)]
    assert e.soft == {} and [r.m_hi for r in e.regions] == [64, 128]


def test_model_round_trips_untouched_unless_the_writer_supplies_one(tmp_path):
    path = tmp_path / "fake.json"
    model = {"alpha": 1.25, "per_config": {"a": [0.5, 1e-3]}, "nested": {"x": [1, [2, 3]]}}
    write(path, [entry(128, [(None, "a")])], model=model)
    write(path, [entry(256, [(None, "a")])])
    assert database.load(path).model == model
    write(path, [], model={"alpha": 2})
    assert database.load(path).model == {"alpha": 2}


@pytest.mark.parametrize("text, error", [
    ('{"schema": 1, "kernel', CorruptDatabaseError),
    (json.dumps(valid_raw(entries={"fake|op=mm|dt=half|N=128|K=64": {"regions": [[5, "a"], [1, "a"]]}})),
     CorruptDatabaseError),
    (json.dumps(valid_raw(arch_family="sm80")), ValidatorMismatchError),
])
def test_a_bad_file_is_never_merged_into_only_fresh_replaces_it(tmp_path, text, error):
    path = tmp_path / "fake.json"
    path.write_text(text)
    with pytest.raises(error) as err:
        write(path, [entry(128, [(None, "a")])])
    assert str(path) in str(err.value) and "fresh" in str(err.value)
    assert path.read_text() == text
    write(path, [entry(128, [(None, "a")])], fresh=True)
    assert list(database.load(path).entries) == [sig(n=128)]


def test_fresh_drops_every_other_entry(tmp_path):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(None, "a")]), entry(256, [(None, "a")])])
    write(path, [entry(512, [(None, "b")])], fresh=True)
    assert list(database.load(path).entries) == [sig(n=512)]


def test_configs_an_entry_names_must_be_defined(tmp_path):
    path = tmp_path / "fake.json"
    with pytest.raises(DatabaseError, match=r"\['zz'\]"):
        write(path, [entry(128, [(None, "zz")])])
    assert not path.exists()
    write(path, [entry(128, [(None, "zz")])], configs=[SPACE["zz"]])
    write(path, [entry(256, [(None, "zz")])], configs=())  # defined by the file already
    db = database.load(path)
    assert db.configs["zz"] == SPACE["zz"]
    write(path, [entry(128, [(None, "a")]), entry(256, [(None, "torch")])])
    assert "zz" not in database.load(path).configs  # no entry names it any more


def test_writer_arguments_are_checked(tmp_path):
    with pytest.raises(DatabaseError, match="kernel family 'gemm'"):
        database.write_entries(tmp_path / "f.json", "fake", "sm90",
                               [Entry(sig().__class__.parse("gemm|op=gemm|dt=half|N=1"),
                                      (Region(None, "torch"),))], (), OLD)
    with pytest.raises(DatabaseError, match="keyed under another id"):
        write(tmp_path / "f.json", [], configs={"b": SPACE["a"]})
    # sentinels a writer passes along are not defined in the file
    path = write(tmp_path / "f.json", [entry(128, [(None, "torch")])], configs=[Config.sentinel("torch")])
    assert database.load(path).configs == {}


def test_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(None, "a")])])
    before = path.read_text()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write(path, [entry(256, [(None, "a")])])
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.json", "fake.json.lock"]


def test_writer_waits_for_the_lock_and_gives_up_with_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "fake.json"
    monkeypatch.setattr(store, "LOCK_TIMEOUT_S", 0.2)
    with filelock.FileLock(str(store.lock_path(path))):
        with pytest.raises(DatabaseError, match="could not take the lock"):
            write(path, [entry(128, [(None, "a")])])
    assert not path.exists()


def test_written_file_is_the_documented_text(tmp_path):
    path = write(tmp_path / "fake.json", [entry(128, [(64, "a"), (None, "torch")])])
    text = path.read_text()
    assert text == schema.dumps(database.load(path))
    assert '"regions": [[64, "a"], [null, "torch"]]' in text


def test_default_validators_are_this_process(tmp_path):
    import torch

    path = database.write_entries(tmp_path / "fake.json", "fake", "sm90",
                                  [entry(128, [(None, "torch")])], ())
    assert database.load(path).validators["torch"] == str(torch.__version__)


@pytest.mark.parametrize("bad, why", [
    (dict(regions=((512, "a"), (64, "a"))), "sorted"),
    (dict(regions=((None, "a"), (64, "a"))), "catch-all"),
    (dict(regions=((64, "a"),), evidence={"M=64": {"a": [float("inf"), 0.0, 3]}}), "Out of range float"),
])
def test_a_writers_bad_data_never_reaches_the_disk(tmp_path, bad, why):
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(None, "a")])])
    before = path.read_text()
    regions = bad.pop("regions")
    with pytest.raises(DatabaseError, match=why) as err:
        write(path, [entry(256, regions, **bad)])
    assert str(path) in str(err.value)
    assert path.read_text() == before


def test_extending_at_a_measured_point_keeps_the_arms_not_re_measured(tmp_path):
    # session 55: the whole point was replaced; b's time at M=8 went, and with it b's support
    path = tmp_path / "fake.json"
    write(path, [entry(128, [(8, "a"), (64, "b"), (None, "torch")],
                       evidence={"M=8": {"torch": [0.01, 0.001, 5], "a": [0.005, 0.001, 5], "b": [0.006, 0.001, 5]}})])
    write(path, [entry(128, [(8, "a")], evidence={"M=8": {"torch": [0.011, 0.001, 5], "a": [0.004, 0.001, 5]}})],
          extend=True)
    point = database.load(path).entries[sig(n=128)].evidence["M=8"]
    assert point["a"] == [0.004, 0.001, 5] and point["torch"] == [0.011, 0.001, 5]  # re-measured: the new times
    assert point["b"] == [0.006, 0.001, 5]  # not re-measured: kept


def test_writers_through_a_link_and_its_target_share_one_lock(tmp_path):
    import threading

    real = tmp_path / "real" / "fake.json"
    real.parent.mkdir()
    write(real, [entry(8, [(None, "torch")])])
    link = tmp_path / "link.json"
    os.symlink(real, link)

    def writer(path, base):
        for i in range(15):
            write(path, [entry(base + 16 * i, [(None, "a")])])

    threads = [threading.Thread(target=writer, args=(link, 16)), threading.Thread(target=writer, args=(real, 4096))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(database.load(real).entries) == 31 and os.path.islink(link)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_write_a_device_refuses_names_the_device():
    with pytest.raises(OSError) as info:
        store.write_atomic(store.Path("/dev/full"), "x" * 65536)
    assert info.value.filename == "/dev/full"  # the command line prints the path with the OS's words
