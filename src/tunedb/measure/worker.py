"""A benchmark worker subprocess per GPU: runs picklable requests with a timeout.

A request is any picklable callable; the worker calls it and sends back its return value.
A request that raises costs itself (status from the exception: compile_error, infeasible or
launch_error) and the worker lives on. One that hangs past the timeout (status timeout) or kills
the process (os._exit, a segfault, an illegal address that poisons the CUDA context; status
launch_error) costs that request only: the worker is killed if need be and restarted on the
next request. Workers start with the 'spawn' method, since a forked CUDA context is unusable.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import traceback
from dataclasses import dataclass
from typing import Any

from tunedb.measure.gate import classify_exception, describe
from tunedb.measure.gpuenv import add_reaper, register_worker, unregister_worker, wait_reaped
from tunedb.errors import WorkerError
from tunedb.measure.spawn_main import importable_main
from tunedb.records import Status


@dataclass(frozen=True)
class WorkerResult:
    status: Status
    value: Any = None
    detail: str = ""


def _pin_device(device: int | None) -> None:
    """Make `device` (an index among the parent's visible GPUs) the only one the child sees."""
    if device is None:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else None
    if ids is not None and not 0 <= device < len(ids):
        raise WorkerError(f"GPU index {device} is outside CUDA_VISIBLE_DEVICES={visible!r}")
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[device] if ids is not None else str(device)


def _serve(conn: Any, device: int | None) -> None:
    _pin_device(device)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        try:
            reply: tuple = ("ok", request())
        except BaseException as exc:  # noqa: BLE001 - every failure of a request is its status
            tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
            reply = ("error", classify_exception(exc).value,
                     f"{describe(exc, 500)}\n{tail[-1500:]}")
        try:
            conn.send(reply)
        except (BrokenPipeError, EOFError, ConnectionError):  # the parent closed without waiting
            return
        except Exception as exc:  # an unpicklable return value
            conn.send(("error", Status.LAUNCH_ERROR.value,
                       f"result could not be sent back: {type(exc).__name__}: {exc}"))


def _reap(proc: Any) -> None:
    """Wait for a worker asked to exit (kill it after 5 s), then forget its pid (close's path,
    in its own thread or a reaper's)."""
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    unregister_worker(proc.pid)


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "worker stopped answering"
    if exitcode < 0:
        try:
            return f"worker killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"worker killed by signal {-exitcode}"
    return f"worker exited with code {exitcode}"


class Worker:
    """One subprocess (per GPU) that runs requests; restarted after a timeout or a crash."""

    def __init__(self, device: int | None = None, timeout_s: float = 120.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive")
        self.device, self.timeout_s = device, timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self._pending: float | None = None  # a prestart's request is out: its timeout
        self.restarts = 0  # how many times a dead or hung worker was replaced

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def _start(self) -> None:
        wait_reaped()  # an earlier worker still exiting: gone before this one measures
        parent, child = self._ctx.Pipe()
        importable_main()  # a script on stdin: the child cannot re-run its __main__
        proc = self._ctx.Process(target=_serve, args=(child, self.device), daemon=True,
                                 name=f"tunedb-bench-worker-{self.device}")
        proc.start()
        child.close()
        register_worker(proc.pid)
        self._proc, self._conn = proc, parent

    def _fresh(self) -> None:
        """A new process in place of a dead or absent one (a restart when there was one)."""
        if self._proc is not None:
            self._kill()
            self.restarts += 1
        self._start()

    def _kill(self) -> int | None:
        proc, self._proc, self._pending = self._proc, None, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return None
        unregister_worker(proc.pid)
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        return proc.exitcode

    @property
    def starting(self) -> bool:
        """A prestart's request is out and its reply not yet collected."""
        return self._pending is not None

    def prestart(self, request: Any, timeout_s: float | None = None) -> None:
        """Start the process now and send it `request` (isolated.StartRequest: imports, CUDA)
        without waiting, so the start overlaps what the caller does next; the next run() or
        wait_started() collects the reply. A live worker is left as it is."""
        if self.alive() or self.starting:
            return
        self._fresh()
        self._send(request)
        self._pending = self.timeout_s if timeout_s is None else timeout_s

    def wait_started(self) -> WorkerResult:
        """The prestart's reply, waited for (OK when there is none): a start that fails or
        hangs is its status, and the next run() starts a fresh worker."""
        if self._pending is None:
            return WorkerResult(Status.OK)
        try:
            res = self._receive(self._pending)
        except BaseException:  # interrupted: its reply may still come, so no later request may share the pipe
            self._kill()
            raise
        self._pending = None
        return res

    def run(self, request: Any, timeout_s: float | None = None) -> WorkerResult:
        """Run one request; failure is a status, never an exception (WorkerError only when the
        request itself cannot be sent, i.e. is not picklable)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        self.wait_started()
        if not self.alive():
            self._fresh()
        self._send(request)
        return self._receive(timeout)

    def _send(self, request: Any) -> None:
        try:
            self._conn.send(request)
        except (BrokenPipeError, EOFError, OSError):
            self._fresh()
            self._conn.send(request)
        except Exception as exc:
            raise WorkerError(f"benchmark request {request!r} cannot be sent to the worker: "
                              f"{type(exc).__name__}: {exc}") from exc

    def _receive(self, timeout: float) -> WorkerResult:
        if not self._conn.poll(timeout):
            self._kill()
            self.restarts += 1
            return WorkerResult(Status.TIMEOUT, None,
                                f"no answer within {timeout:g} s; worker killed and restarted")
        try:
            reply = self._conn.recv()
        except (EOFError, OSError):
            if self._proc is not None:
                self._proc.join(10)
            code = self._proc.exitcode if self._proc is not None else None
            self._kill()
            self.restarts += 1
            return WorkerResult(Status.LAUNCH_ERROR, None, f"{_death(code)}; worker restarted")
        if reply[0] == "ok":
            return WorkerResult(Status.OK, reply[1], "")
        return WorkerResult(Status(reply[1]), None, reply[2])

    def close(self, wait: bool = True) -> None:
        """Stop the worker. wait=False returns at once: the worker is asked to exit and a
        background thread reaps it (killing it after 5 s), so its CUDA teardown (about half a
        second) overlaps the caller's next step; it stays registered as ours until it is gone."""
        if self.starting:  # still importing: a polite stop would wait for the start to finish
            self._kill()
            return
        if self._conn is not None and self.alive():
            try:
                self._conn.send(None)
            except (OSError, ValueError):
                pass  # it cannot be asked: killed below
            else:
                proc, self._proc = self._proc, None
                self._conn.close()
                self._conn = None
                if wait:
                    _reap(proc)
                else:
                    reaper = threading.Thread(target=_reap, args=(proc,), daemon=True,
                                              name="tunedb-worker-reaper")
                    add_reaper(reaper)
                    reaper.start()
                return
        self._kill()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass
