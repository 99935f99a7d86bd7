"""Whose GPU processes are ours, throttle-reason names, and env snapshots (NVML stubbed)."""
import os
import subprocess
import sys

from tunedb.measure import gpuenv
from tunedb.measure.gpuenv import NvmlEnv, is_own, merge_snapshots, throttle_names


def test_self_parent_and_registered_workers_are_ours_other_children_are_not():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert is_own(os.getpid()) and is_own(os.getppid())
        assert not is_own(child.pid)  # a process we started is not us: it competes for the GPU
        gpuenv.register_worker(child.pid)
        assert is_own(child.pid)
        gpuenv.unregister_worker(child.pid)
        assert not is_own(child.pid)
    finally:
        child.kill()
        child.wait()


def test_foreign_pids_from_nvml_process_list(monkeypatch):
    env = NvmlEnv.__new__(NvmlEnv)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        monkeypatch.setattr(NvmlEnv, "compute_pids", lambda self: (os.getpid(), child.pid))
        assert env.foreign_pids() == frozenset({child.pid})
        # NVML in another PID namespace: none of its pids exist here; all but one are foreign
        monkeypatch.setattr(NvmlEnv, "compute_pids", lambda self: (4_000_001, 4_000_002))
        assert len(env.foreign_pids()) == 1
        monkeypatch.setattr(NvmlEnv, "compute_pids", lambda self: (4_000_001,))
        assert env.foreign_pids() == frozenset()
    finally:
        child.kill()
        child.wait()


def test_throttle_names_skip_idle():
    assert throttle_names(0x1) == ""
    assert throttle_names(0x4 | 0x40) == "sw_power_cap,hw_thermal"


def test_merge_snapshots_keeps_the_worst_reading():
    a = {"sm_clock_mhz": 1980, "temp_c": 40, "throttle": "", "power_w": 300.0}
    b = {"sm_clock_mhz": 1755, "temp_c": 52, "throttle": "sw_power_cap", "power_w": 650.0}
    assert merge_snapshots(a, b) == {"sm_clock_mhz": 1755, "temp_c": 52,
                                     "throttle": "sw_power_cap", "power_w": 650.0}


def test_without_a_driver_readings_are_empty():
    env = NvmlEnv()
    if env.available:  # a machine with a GPU: readings exist instead
        assert "sm_clock_mhz" in env.snapshot()
        return
    assert env.snapshot() == {} and env.foreign_pids() == frozenset() and env.identity() == {}
    assert env.error


def test_each_snapshot_names_the_gpu_that_timed_it(monkeypatch):
    """A multi-GPU build logs points from several GPUs under the driver's provenance: each
    measurement's env carries its own GPU's UUID (read once)."""
    import types

    calls = []
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetClockInfo=lambda h, c: 1980,
        nvmlDeviceGetTemperature=lambda h, t: 40,
        nvmlDeviceGetPowerUsage=lambda h: 300000,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetUUID=lambda h: calls.append(h) or f"GPU-{h}",
        nvmlSystemGetDriverVersion=lambda: "580")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    env = NvmlEnv(index=1)
    first, second = env.snapshot(), env.snapshot()
    assert first["gpu_uuid"] == second["gpu_uuid"] == "GPU-h1" and len(calls) == 1
    assert merge_snapshots(first, second)["gpu_uuid"] == "GPU-h1"
