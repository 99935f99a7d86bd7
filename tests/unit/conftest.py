"""The unit suite never writes into the user's caches: every test runs with TUNEDB_CACHE_DIR (so the
user tier, the census cache and Triton's cache below it) in one fresh directory per session.

A compile pool's done log lives in the compiler cache and names each job by its repr; a test job
names its pytest tmp path, and pytest reuses those paths across runs (pytest-N), so a log left in
~/.cache/tunedb by an earlier run told a later one its jobs were already compiled (CI, session 27).
"""
import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tunedb-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDB_CACHE_DIR", str(root))
        mp.delenv("TRITON_CACHE_DIR", raising=False)
        mp.delenv("TUNEDB_USER_DB", raising=False)
        yield root
