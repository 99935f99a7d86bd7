"""Concurrent writers: 8 processes x 50 entries, one locked merge-on-write each, into one file."""
import multiprocessing as mp

from tunedb import database, settings
from tunedb.records import Entry, Region, Signature

PROCS, PER_PROC = 8, 50


def _writer(user_dir: str, proc: int, start) -> None:
    start.wait()
    with settings.override(USER_DB=user_dir):
        for i in range(PER_PROC):
            sig = Signature.make("fake", "mm", "half", N=proc * 1000 + i + 1, K=64)
            database.write_entries("user", "fake", "sm90", [Entry(sig, (Region(None, "torch"),))], (),
                                   {"triton": f"w{proc}"})


def test_eight_processes_writing_one_user_tier_file_lose_nothing(tmp_path):
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), p, start)) for p in range(PROCS)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * PROCS
    path = tmp_path / "sm90" / "fake.json"
    db = database.load(path, "fake", "sm90")  # valid JSON and a valid file
    expected = {Signature.make("fake", "mm", "half", N=p * 1000 + i + 1, K=64)
                for p in range(PROCS) for i in range(PER_PROC)}
    assert set(db.entries) == expected
    # every entry keeps the validators its own writer stamped
    for sig, entry in db.entries.items():
        assert {**db.validators, **entry.soft}["triton"] == f"w{sig.get('N') // 1000}"
    assert not [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")]
