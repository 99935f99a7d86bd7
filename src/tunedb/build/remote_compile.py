"""Compiles for a build across hosts (`tunedb build --ray ADDRESS`): Ray tasks on any node,
CPU-only nodes included.

On one host the driver's compile pool (build/compile_pool.py) fills the Triton cache every
measuring actor there reads. An actor on another host has its own cache, and would compile each
config in line with its first measurement while its GPU idles. So with --ray each signature's
binaries (every config its plan measures, cross-evaluation included: those are the arms of its
other points) compile in one Ray task that needs no GPU -- the scheduler may place it on a
CPU-only node -- into a fresh cache directory, in a fresh process (the family's jobs pin one
target and one cache per process), and the task returns that cache's files. A measuring actor
installs them into its own cache before its first point of that signature: each file written
atomically, an existing one never overwritten. Triton keys a binary by source, options, target
and tool versions, never by the machine, so the cluster must run one image (the same Triton,
Python and ptxas: what `tunedb prebuild` prints); a binary that does not match is simply not
found, and the worker compiles as before.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from tunedb.database import store
from tunedb.records import Signature


def compile_files(family_name: str, arch_family: str, sig: Signature, config_ids: Sequence[str]) -> dict[str, Any]:
    """In a Ray task: compile `config_ids` for `sig` on `arch_family` into a fresh cache
    directory; {"files": {relative path: bytes}, "ok": n, "failed": ["job: error", ...]}."""
    from tunedb import families
    from tunedb.build.compile_pool import run_job
    from tunedb.families.contract import hook

    family = families.get(family_name)
    with tempfile.TemporaryDirectory(prefix="tunedb-remote-compile-") as tmp:
        ok, failed = 0, []
        for job in hook(family, "compile_jobs")(arch_family, sig, list(config_ids), cache_dir=tmp):
            out = run_job(job)
            if out.get("ok"):
                ok += 1
            else:
                failed.append(f"{out.get('job', job)}: {out.get('error', 'failed')}")
        root = Path(tmp)
        files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    return {"files": files, "ok": ok, "failed": failed}


def install(files: Mapping[str, bytes], cache_dir: str | os.PathLike) -> int:
    """Write each file under `cache_dir` that is not there yet (database.store.write_atomic: a
    reader never sees half a binary); the number written. A path that leaves the directory is
    refused."""
    root = Path(cache_dir).resolve()
    written = 0
    for rel, data in files.items():
        dest = (root / rel).resolve()
        if root not in dest.parents:
            raise ValueError(f"compiled file {rel!r} would land outside the cache {root}")
        if dest.exists():
            continue
        store.write_atomic(dest, data)
        written += 1
    return written


def wanted(opts: Any, family: Any, gpu: bool) -> bool:
    """Fan compiles out to the cluster: a real build (--ray) of a family with compile jobs."""
    from tunedb.families.contract import has_hook

    return bool(getattr(opts, "ray", None)) and gpu and not opts.simulate and has_hook(family, "compile_jobs")


def submit(plans: Sequence[Any], family_name: str, arch_family: str) -> dict[Signature, Any]:
    """One compile task per signature (largest first, as measuring goes): signature -> ObjectRef."""
    import ray

    task = ray.remote(num_cpus=1, num_gpus=0, max_calls=1)(compile_files)
    order = sorted(plans, key=lambda p: -float(p.est_seconds or 0.0))
    return {p.signature: task.remote(family_name, arch_family, p.signature,
                                     sorted({cid for ids in p.arms.values() for cid in ids}))
            for p in order}
