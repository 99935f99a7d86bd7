"""Every unrolled linalg kernel the tune can pick (lane and reg packings, potrf/posv, the tune's
n grid, fp32/fp64) compiles for sm90 in the device's Triton (3.6), on this CPU machine.

The interpreter runs these kernels without the compiler's passes: session 14's H200 run found
posv's lane kernels at fp32 n=4 failing there ("PassManager::run failed" in
TritonGPURemoveLayoutConversions) while every CPU test passed. The device's Triton comes from
the 3.6 wheel installed beside the CPU's own (pip install --no-deps --target /tmp/t36/site
triton==3.6.0), or from the running Triton when that is 3.6; without either the test skips."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunedb.families.linalg import compile_target, kernels_space as space

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_triton import DEVICE_TRITON, WHEEL_SITE, child_env  # noqa: E402
from device_triton import path as _device_triton_path  # noqa: E402

def test_the_compile_list_is_every_lane_and_reg_config_the_validity_predicate_admits():
    items = compile_target.items()
    for op in ("potrf", "posv"):
        for dt in ("fp32", "fp64"):
            for n in (4, 8, 16, 32):
                want = {c.id for c in space.config_space(op, n, dt) if c.packing in ("lane", "reg")}
                assert {i[3] for i in items if i[:3] == (op, dt, n)} == want
    # the bug's configs are in it, and so is the packing that runs every goal n
    assert ("posv", "fp32", 4, "lane_p16_w1") in items and ("posv", "fp64", 32, "lane_p1_w1") in items
    assert ("posv", "fp32", 16, "reg_p32_w1") in items


@pytest.mark.slow
def test_every_lane_and_reg_kernel_compiles_for_sm90_with_the_device_triton():
    path = _device_triton_path()
    if path is None:
        pytest.skip(f"no Triton {DEVICE_TRITON} here (neither the running Triton nor {WHEEL_SITE})")
    env = child_env(path)
    jobs = str(max(1, min(4, (os.cpu_count() or 2))))
    proc = subprocess.run([sys.executable, "-m", "tunedb.families.linalg.compile_target", "--jobs", jobs],
                          capture_output=True, text=True, timeout=1500, env=env)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(compile_target.items()), proc.stderr[-3000:]
    failed = [f"{r['op']} {r['dtype']} n={r['n']} {r['config']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert proc.returncode == 0
    # the reg packing's factorisation and solves never leave the thread: no shared memory
    # where each thread holds one problem (k > 1 problems per thread may stage info)
    staged = [r for r in results if r["config"].startswith("reg_") and r["shared"]
              and space.parse_config(r["config"]).problems == 32 * space.parse_config(r["config"]).warps]
    assert not staged, staged
