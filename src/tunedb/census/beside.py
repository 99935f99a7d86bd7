"""A preset's census taken in a child process beside `tunedb tune`'s own start on a GPU machine
(TUNEDB_CENSUS_BESIDE=1; off by default: no gain measured on the H200; commands/tune.py starts it
only where the driver lists a GPU: elsewhere there is nothing for it to overlap).

A cold census of a preset is seconds of Python: importing torch and the model library
(transformers: 1.6-2.5 s on a 2-core CPU after torch) and tracing the model, under one GIL. On a
GPU the tune process meanwhile imports torch, starts CUDA, takes the mirror census, plans it
and submits its compiles (build/speculative.py), and only then takes the census it asked for.
The child, started before all that, takes that census at the same time on another core and
stores it in the census cache (census/cache.py: the same key, an atomic write); the parent,
when it needs the census, waits for the child and reads the cache. It is the same function of
the same arguments under the same code and libraries, so the file is the census the parent
would have taken; when the child fails, runs past the limit, or cannot write the cache, the
parent takes the census itself, as without this setting.

Run as ``python -m tunedb.census.beside WORKLOAD JSON`` (the census keywords); exit 0 when the
census is in the cache.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from tunedb import settings

# keywords of pipeline.take_census that enter the cache key (capture is merged after the cache)
_KEYS = ("mode", "max_batch", "chunk", "manifest", "impl", "fused")
WAIT_LIMIT_S = 180.0  # past this the parent stops waiting and takes the census itself


class Beside:
    """A running child census; wait() before reading the cache, close() always."""

    def __init__(self, proc: subprocess.Popen, workload: str, kw: Mapping[str, Any]) -> None:
        self.proc, self.workload, self.kw = proc, workload, dict(kw)
        self.started = time.perf_counter()
        self.waited = 0.0  # seconds the parent spent waiting for the child

    def wait(self, limit_s: float = WAIT_LIMIT_S) -> bool:
        """Wait for the child (at most `limit_s` after it started); True when it exited 0."""
        t0 = time.perf_counter()
        try:
            rc = self.proc.wait(timeout=max(0.0, limit_s - (t0 - self.started)))
        except subprocess.TimeoutExpired:
            self.close()
            rc = None
        self.waited += time.perf_counter() - t0
        return rc == 0

    def close(self) -> None:
        """Stop the child if it is still running (the parent failed or stopped waiting)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _key_kw(census_kw: Mapping[str, Any]) -> dict[str, Any]:
    return {k: census_kw.get(k) for k in _KEYS}


def wanted(workload: str, census_kw: Mapping[str, Any]) -> bool:
    """Whether a child should take this census: the setting is on, the caller reads the cache
    (cached=True), and it is a preset's census not cached yet."""
    if not settings.census_beside_enabled() or not census_kw.get("cached"):
        return False
    from tunedb.census import cache

    kw = _key_kw(census_kw)
    return cache.key(workload, **kw) is not None and not cache.hit(workload, **kw)


def _child_env() -> dict[str, str]:
    """This environment, with the tree this tunedb was imported from appended to PYTHONPATH when
    neither PYTHONPATH nor site-packages has it (never put first: it would reorder the child's
    path). The child writes under the cache key of the code and libraries it imported, so a
    child that imported other ones only misses the parent's key: the parent then takes it."""
    import site

    env = dict(os.environ)
    root = os.path.realpath(Path(__file__).resolve().parents[2])
    entries = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    known = {os.path.realpath(p) for p in entries + site.getsitepackages() + [site.getusersitepackages()]}
    if root not in known:
        env["PYTHONPATH"] = os.pathsep.join(entries + [root])
    return env


def start(workload: str, census_kw: Mapping[str, Any]) -> Beside | None:
    """Start the child when wanted(); None otherwise (or when it cannot be started)."""
    if not wanted(workload, census_kw):
        return None
    kw = _key_kw(census_kw)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tunedb.census.beside", workload, json.dumps(kw)],
                                env=_child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return None  # the parent takes the census itself
    return Beside(proc, workload, kw)


def main(argv: list[str]) -> int:
    from tunedb import pipeline
    from tunedb.census import cache

    workload, kw = argv[0], json.loads(argv[1])
    pipeline.take_census(workload, **kw, cached=True)
    return 0 if cache.hit(workload, **kw) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
