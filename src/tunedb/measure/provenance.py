"""Provenance of a measurement: when, from which source tree, on which GPU and software stack.

Git facts come from the repository holding the tunedb package (an editable checkout), when
there is one; the dirty digest hashes `git diff HEAD` plus the untracked file list, so two
runs from the same dirty tree share it. torch is imported only to read its CUDA version, and
only when it is already loaded (provenance never initialises the GPU by itself).
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from tunedb.records import Provenance


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(root: Path, *args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.decode(errors="replace") if res.returncode == 0 else None


@functools.lru_cache(maxsize=4)
def git_state(root: str | None = None) -> tuple[str, str]:
    """(commit, dirty digest) of the repository holding `root` (default: the tunedb package);
    ("", "") outside a repository; the digest is "" for a clean tree."""
    where = Path(root) if root else Path(__file__).resolve().parent
    commit = (_git(where, "rev-parse", "HEAD") or "").strip()
    if not commit:
        return "", ""
    diff = _git(where, "diff", "HEAD") or ""
    untracked = _git(where, "ls-files", "--others", "--exclude-standard") or ""
    if not diff and not untracked:
        return commit, ""
    digest = hashlib.sha256((diff + "\0" + untracked).encode()).hexdigest()[:16]
    return commit, digest


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def collect(gpu: dict[str, str] | None = None, repo: str | None = None) -> Provenance:
    """Provenance now. `gpu` holds gpu_name/gpu_uuid/driver (gpuenv.NvmlEnv.identity())."""
    gpu = dict(gpu or {})
    commit, dirty = git_state(repo)
    torch_mod: Any = sys.modules.get("torch")
    cuda = ""
    torch_version = _version("torch")
    if torch_mod is not None:
        torch_version = str(getattr(torch_mod, "__version__", torch_version))
        cuda = str(getattr(getattr(torch_mod, "version", None), "cuda", "") or "")
        if not gpu.get("gpu_name"):
            try:
                if torch_mod.cuda.is_available():
                    gpu["gpu_name"] = torch_mod.cuda.get_device_name()
            except Exception:
                pass
    from tunedb import __version__

    return Provenance(
        utc=utc_now(), git_commit=commit, git_dirty=dirty,
        gpu_name=gpu.get("gpu_name", ""), gpu_uuid=gpu.get("gpu_uuid", ""),
        driver=gpu.get("driver", ""), cuda=cuda, torch=torch_version,
        triton=_version("triton"), tunedb=__version__,
    )
