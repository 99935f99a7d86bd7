"""The device's Triton (3.6) on this CPU machine, for the sm90 compile tests: the running Triton
when it is that version, else the wheel installed beside the CPU's own (pip install --no-deps
--target /tmp/t36/site triton==3.6.0); and the environment a compile child runs in."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DEVICE_TRITON = "3.6"
WHEEL_SITE = Path("/tmp/t36/site")
SRC = Path(__file__).resolve().parents[2] / "src"


def site_version(site: Path) -> str | None:
    """The version of the Triton installed under `site`, or None."""
    init = site / "triton" / "__init__.py"
    if not init.is_file():
        return None
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", init.read_text())
    return found.group(1) if found else None


def path() -> str | None:
    """The PYTHONPATH entry that makes `import triton` the device's version ('' for the running
    one), or None when this machine has no such Triton."""
    try:
        import triton

        if triton.__version__.startswith(DEVICE_TRITON):
            return ""
    except ImportError:
        pass
    version = site_version(WHEEL_SITE)
    return str(WHEEL_SITE) if version and version.startswith(DEVICE_TRITON) else None


def child_env(site: str, *extra: str) -> dict[str, str]:
    """os.environ for a compile child: `site` (path()'s answer), the sources and `extra` on
    PYTHONPATH, and no interpreter."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (site, str(SRC), *extra) if p))
    env.pop("TRITON_INTERPRET", None)
    return env


def run_child(args: list[str], timeout: float, *extra: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` under the device's Triton (child_env), output captured; the calling test is
    skipped when this machine has no such Triton."""
    import pytest

    site = path()
    if site is None:
        pytest.skip(f"no Triton {DEVICE_TRITON} here (neither the running Triton nor {WHEEL_SITE})")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(site, *extra))
