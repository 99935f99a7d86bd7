"""Launch sites: a Triton JIT kernel's compiled binary called without `JITFunction.run`.

`kernel[grid](*args)` binds the arguments, computes Triton's specialization key and looks the
binary up on every call: the largest part of a tuned GEMM's host cost (tens of microseconds on a
slow host, against ~13 us for F.linear). A `Site` belongs to one launch closure (one config and
signature: N, K, dtype, bias and activation fixed), so the only arguments that vary between calls
are the tensors and M. The site keys each binary on exactly what Triton specialises those on --
each tensor's dtype and 16-byte alignment, and M == 1 / M % 16 == 0 -- plus the device; the first
call of a key goes through `JITFunction.run` (which compiles or loads the binary and is the
reference path), later calls invoke the binary's launcher directly with the same arguments.

Anything a site cannot reproduce goes through `JITFunction.run` every time: the interpreter
(TRITON_INTERPRET=1), an installed launch hook (profilers), an M that needs 64-bit integers, a
Triton whose compiled kernels lack the launcher fields, or TUNEDB_JIT_LAUNCH=1.

Triton launches on the current CUDA device. A site whose first tensor lives on another GPU (a
layer of a model spread by device_map="auto") makes that GPU current for the launch: the site
reads the current device anyway, so the tuned ops' memoised path needs no device check of its own.
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

_I32_MAX = 2 ** 31 - 1


class Site:
    """`site(grid, *varying)` == `kernel[grid](*varying, *fixed, **constexprs)`."""

    __slots__ = ("kernel", "fixed", "constexprs", "_bins", "_direct", "_device", "_stream", "_knobs")

    def __init__(self, kernel: Any, fixed: Sequence[Any] = (), constexprs: dict[str, Any] | None = None) -> None:
        self.kernel = kernel
        self.fixed = tuple(fixed)
        self.constexprs = dict(constexprs or {})
        self._bins: dict[tuple[Any, ...], tuple[Any, Any, Any, tuple[Any, ...]]] = {}
        self._direct: bool | None = None  # decided at the first call (settings, interpreter, driver)
        self._device = self._stream = self._knobs = None

    def __call__(self, grid: tuple[int, ...], *varying: Any) -> None:
        if self._direct is None:
            self._direct = self._probe()
        if self._direct and not self._hooked():
            device = self._device()
            index = varying[0].get_device()
            if index != device and index >= 0:  # (a CPU tensor: Triton's own error below)
                return self._elsewhere(grid, varying)
            key, args = _key(varying, device)
            if key is not None:
                binary = self._bins.get(key)
                if binary is not None:
                    run, function, packed, tail = binary
                    gx = grid[0]
                    gy = grid[1] if len(grid) > 1 else 1
                    gz = grid[2] if len(grid) > 2 else 1
                    run(gx, gy, gz, self._stream(device), function, packed, None, None, None, *args, *tail)
                    return
                compiled = self.kernel[grid](*varying, *self.fixed, **self.constexprs)
                self._remember(key, varying, compiled)
                return
        elif _elsewhere(varying[0]):
            return self._elsewhere(grid, varying)
        self.kernel[grid](*varying, *self.fixed, **self.constexprs)

    def _elsewhere(self, grid: tuple[int, ...], varying: tuple[Any, ...]) -> None:
        """The launch with the first tensor's GPU current (restored after)."""
        with device_guard(varying[0].get_device()):
            self(grid, *varying)

    def binaries(self) -> int:
        """How many compiled binaries this site launches directly (one per specialisation seen)."""
        return len(self._bins)

    def _probe(self) -> bool:
        from tunedb import settings

        if settings.jit_launch():
            return False
        try:
            from triton import knobs
            from triton.runtime.driver import driver

            if knobs.runtime.interpret:
                return False
            active = driver.active
            self._device, self._stream = _current_device(active.get_current_device), active.get_current_stream
            self._knobs = knobs.runtime
        except Exception:  # another Triton's layout: JITFunction.run only
            return False
        return True

    def _hooked(self) -> bool:
        rt = self._knobs
        return _active(getattr(rt, "launch_enter_hook", None)) or _active(getattr(rt, "launch_exit_hook", None))

    def _remember(self, key: tuple[Any, ...], varying: tuple[Any, ...], compiled: Any) -> None:
        """Keep the binary Triton just launched for this key, with every argument after the
        varying ones in the kernel's parameter order (constexprs included: the launcher skips them)."""
        try:
            run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
            signature = inspect.signature(self.kernel.fn)
            # launch options (num_warps, num_stages, ...) are not kernel parameters
            kernel_kw = {k: v for k, v in self.constexprs.items() if k in signature.parameters}
            params = signature.bind(*varying, *self.fixed, **kernel_kw)
            params.apply_defaults()
        except Exception:
            self._direct = False
            return
        if run is None or function is None:
            return
        self._bins[key] = (run, function, packed, tuple(params.arguments.values())[len(varying):])


def _current_device(triton_fn: Any) -> Any:
    """torch's C getter where Triton's driver asks torch.cuda.current_device (Triton 3.x's
    GPUDriver): the same index without its Python frames (a lazy-init check and a call, every
    launch). A site launches only after a CUDA tensor exists, so CUDA is initialised by then."""
    import torch

    getter = getattr(torch._C, "_cuda_getDevice", None)
    return getter if getter is not None and triton_fn is torch.cuda.current_device else triton_fn


def device_guard(index: int) -> Any:
    """torch.cuda.device(index): that GPU current inside the block."""
    import torch

    return torch.cuda.device(index)


def _elsewhere(x: Any) -> bool:
    """Whether x is a CUDA tensor on a GPU other than the current one (the JIT path's check)."""
    import torch

    return bool(x.is_cuda) and x.get_device() != torch.cuda.current_device()


def _active(hook: Any) -> bool:
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if isinstance(calls, list) else True


def _key(varying: tuple[Any, ...], device: Any) -> tuple[tuple[Any, ...] | None, list[Any]]:
    """What Triton specialises the varying arguments on (None when a site cannot key them), and
    the launcher's arguments: each tensor as its address. Triton's launcher takes an int as the
    device pointer as it is, where a tensor costs it a data_ptr() call and a cuPointerGetAttribute
    query; the site reads every address for the key anyway. An int skips the driver's check that
    the memory is on a GPU, so a tensor on any device but the current one is not keyed: the JIT
    path raises Triton's own error for it (a CPU tensor) or the caller moves it (another GPU)."""
    key: list[Any] = [device]
    args: list[Any] = []
    for a in varying:
        if type(a) is int:
            if a > _I32_MAX or a < -_I32_MAX:
                return None, args
            key.append(1 if a == 1 else 16 if a % 16 == 0 else 0)
            args.append(a)
        else:
            if a.get_device() != device:
                return None, args
            ptr = a.data_ptr()
            key.append(a.dtype)
            key.append(ptr % 16 == 0)
            args.append(ptr)
    return tuple(key), args
