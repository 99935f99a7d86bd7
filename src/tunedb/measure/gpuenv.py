"""The GPU environment: clocks, temperature, power, throttle reasons and other compute processes.

Read through NVML (nvidia-ml-py, imported lazily; without it, or without a driver, every reading
is empty and no process is ever foreign). A process is ours when it is this process, one of its
ancestors (the process that started this benchmark worker) or a benchmark worker this process
started (registered by bench.worker); anything else holding a compute context on the GPU,
including an unrelated child process, is foreign and makes the GPU busy.
"""
from __future__ import annotations

import os
from typing import Any, Protocol

# NVML clock-event (throttle) reason bits, by name; the numbering is NVML's.
_REASONS = (
    (0x1, "gpu_idle"), (0x2, "app_clocks"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
    (0x10, "sync_boost"), (0x20, "sw_thermal"), (0x40, "hw_thermal"), (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)
# gpu_idle is set between kernels and says nothing about throttling.
_BENIGN = 0x1


class GpuEnv(Protocol):
    def snapshot(self) -> dict[str, Any]:
        """Readings for Measurement.env (JSON scalars only)."""

    def foreign_pids(self) -> frozenset[int]:
        """Compute processes on the GPU that are not ours."""


class NullEnv:
    """No GPU to watch (fake and replay timers)."""

    def snapshot(self) -> dict[str, Any]:
        return {}

    def foreign_pids(self) -> frozenset[int]:
        return frozenset()


def throttle_names(mask: int) -> str:
    return ",".join(name for bit, name in _REASONS if mask & bit and not bit & _BENIGN)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
        return int(text.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors(pid: int) -> list[int]:
    out, cur = [], _ppid(pid)
    while cur and cur not in out and len(out) < 64:
        out.append(cur)
        cur = _ppid(cur)
    return out


_WORKERS: set[int] = set()


def register_worker(pid: int) -> None:
    """Count a benchmark worker this process started as ours."""
    _WORKERS.add(pid)


def unregister_worker(pid: int) -> None:
    _WORKERS.discard(pid)


# Threads reaping workers closed without waiting (bench.worker.Worker.close(wait=False)): each
# such worker is still ours, and still tearing its CUDA context down, until its thread ends.
_REAPERS: list[Any] = []


def add_reaper(thread: Any) -> None:
    _REAPERS[:] = [t for t in _REAPERS if t.is_alive()]
    _REAPERS.append(thread)


def wait_reaped(timeout_s: float = 15.0) -> None:
    """Wait until every worker closed without waiting has exited: before anything measures on
    the GPU (a new worker, an in-process measurement, confirm) or counts its processes, so a
    teardown disturbs no timing and no busy check."""
    while True:
        try:
            thread = _REAPERS.pop()
        except IndexError:  # none left (another thread may have taken the last)
            return
        thread.join(timeout_s)


def own_pids(me: int | None = None) -> set[int]:
    """This process, its ancestors and the benchmark workers it started."""
    me = os.getpid() if me is None else me
    return {me, *_WORKERS, *_ancestors(me)}


def is_own(pid: int, me: int | None = None) -> bool:
    """True for this process, its ancestors and the benchmark workers it started."""
    return pid in own_pids(me)


class NvmlEnv:
    """NVML readings of one GPU, chosen by UUID (robust to CUDA_VISIBLE_DEVICES) or NVML index."""

    def __init__(self, uuid: str | None = None, index: int = 0) -> None:
        self._uuid, self._index = uuid, index
        self._nvml: Any = None
        self._handle: Any = None
        self._gpu_uuid: str | None = None  # read once, at the first snapshot
        self.error = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            if uuid:
                u = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
                try:
                    self._handle = pynvml.nvmlDeviceGetHandleByUUID(u)
                except Exception:  # a UUID spelling NVML does not know: fall back to the index
                    self._handle = None
            if self._handle is None:
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # no library, no driver, no such GPU: readings stay empty
            self.error = f"{type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self._handle is not None

    def _read(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, fn)(self._handle, *args)
        except Exception:
            return None

    def snapshot(self) -> dict[str, Any]:
        if not self.available:
            return {}
        n = self._nvml
        out: dict[str, Any] = {}
        clock = self._read("nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM)
        if clock is not None:
            out["sm_clock_mhz"] = int(clock)
        temp = self._read("nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU)
        if temp is not None:
            out["temp_c"] = int(temp)
        power = self._read("nvmlDeviceGetPowerUsage")
        if power is not None:
            out["power_w"] = round(power / 1000.0, 1)
        mask = self._read("nvmlDeviceGetCurrentClocksEventReasons")
        if mask is None:
            mask = self._read("nvmlDeviceGetCurrentClocksThrottleReasons")
        if mask is not None:
            out["throttle"] = throttle_names(int(mask))
        pids = self.compute_pids()
        out["compute_procs"] = len(pids)
        # which GPU timed it: a multi-GPU build's log holds points from several, under one
        # provenance (the driver's); each measurement then names its own device
        if self._gpu_uuid is None:
            self._gpu_uuid = self.identity().get("gpu_uuid", "")
        if self._gpu_uuid:
            out["gpu_uuid"] = self._gpu_uuid
        return out

    def compute_pids(self) -> tuple[int, ...]:
        if not self.available:
            return ()
        procs = self._read("nvmlDeviceGetComputeRunningProcesses") or []
        return tuple(sorted({int(p.pid) for p in procs}))

    def foreign_pids(self) -> frozenset[int]:
        if _REAPERS:  # a worker of ours still exiting would count as foreign in a container
            wait_reaped()
        pids = self.compute_pids()
        visible = [p for p in pids if os.path.exists(f"/proc/{p}")]
        if pids and not visible:
            # NVML reports host PIDs this container cannot see: count instead. One context is
            # ours (this process, or the parent that started this worker); the rest are not.
            return frozenset(pids[1:]) if len(pids) > 1 else frozenset()
        own = own_pids()  # walks /proc up this process's parents once per call, not per pid
        return frozenset(p for p in pids if p not in own)

    def identity(self) -> dict[str, str]:
        """GPU name, UUID and driver version for provenance."""
        if not self.available:
            return {}
        n = self._nvml
        out = {}
        for key, fn, args in (("gpu_name", "nvmlDeviceGetName", ()),
                              ("gpu_uuid", "nvmlDeviceGetUUID", ())):
            value = self._read(fn, *args)
            if value is not None:
                out[key] = value.decode() if isinstance(value, bytes) else str(value)
        try:
            drv = n.nvmlSystemGetDriverVersion()
            out["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
        except Exception:
            pass
        return out


def merge_snapshots(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One env record for a measurement taken between two snapshots: the worst of each reading."""
    out: dict[str, Any] = {}
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if key == "sm_clock_mhz" and a is not None and b is not None:
            out[key] = min(a, b)
        elif key == "throttle":
            names = sorted({x for v in (a, b) if v for x in v.split(",")})
            out[key] = ",".join(names)
        elif a is not None and b is not None and isinstance(a, (int, float)):
            out[key] = max(a, b)
        else:
            out[key] = b if b is not None else a
    return out
