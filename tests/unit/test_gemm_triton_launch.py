"""Launch sites (families/gemm/triton_launch.py) against a fake JIT kernel: the first call of each
specialisation goes through kernel[grid] (Triton's own path), later calls reach the binary's
launcher with exactly the arguments JITFunction.run would pass; anything unkeyable stays on the
JIT path."""
from __future__ import annotations

import pytest

from tunedb import settings
from tunedb.families.gemm import triton_launch
from tunedb.families.gemm.triton_launch import Site


class FakeTensor:
    is_cuda = False  # the JIT path asks torch for the current device only about CUDA tensors

    def __init__(self, ptr: int, dtype: str = "bf16", device: int = 0) -> None:
        self.ptr, self.dtype, self.device = ptr, dtype, device

    def data_ptr(self) -> int:
        return self.ptr

    def get_device(self) -> int:
        return self.device


class FakeCompiled:
    def __init__(self, log: list, tag: int) -> None:
        self.function, self.packed_metadata, self.tag = f"fn{tag}", f"meta{tag}", tag
        self.run = lambda *a: log.append(("direct", tag, a))


class FakeKernel:
    """kernel[grid](*args, **kw) records a JIT launch and returns a new 'binary' per launch."""

    def __init__(self) -> None:
        self.log: list = []
        self.compiled = 0

        def fn(x_ptr, y_ptr, M, N, K, HAS_BIAS, ACT, BM=64, BN=64):
            pass

        self.fn = fn

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.compiled += 1
            self.log.append(("jit", grid, args, kw))
            return FakeCompiled(self.log, self.compiled)

        return launch


class NoHooks:
    launch_enter_hook = None
    launch_exit_hook = None


def _site(kernel: FakeKernel, **kw) -> Site:
    site = Site(kernel, (512, 256, 0, 2), {"BM": 128, "num_warps": 8})
    site._direct = True
    site._device = lambda: 0
    site._stream = lambda device: 1234
    site._knobs = kw.get("knobs", NoHooks())
    return site


def test_second_call_of_a_specialisation_launches_the_binary_with_triton_argument_order():
    k = FakeKernel()
    site = _site(k)
    x, y = FakeTensor(4096), FakeTensor(8192)
    site((3,), x, y, 40)
    site((3,), x, y, 40)
    assert [e[0] for e in k.log] == ["jit", "direct"]
    _, tag, args = k.log[1]
    assert tag == 1  # the binary Triton launched first
    gx, gy, gz, stream, function, packed, meta, enter, exit_, *rest = args
    assert (gx, gy, gz, stream, function, packed) == (3, 1, 1, 1234, "fn1", "meta1")
    assert (meta, enter, exit_) == (None, None, None)
    # parameter order, constexprs and defaults included (the launcher skips constexprs itself);
    # tensors as their addresses, so Triton's launcher neither calls data_ptr() nor asks the driver
    assert rest == [4096, 8192, 40, 512, 256, 0, 2, 128, 64]  # launch options (num_warps) are not parameters


def test_a_tensor_off_the_current_gpu_is_never_launched_by_address():
    # an address skips the driver's pointer check, so a CPU tensor (-1) or one on another GPU in
    # any position must reach Triton's own path, which refuses it, never the binary
    k = FakeKernel()
    site = _site(k)
    x = FakeTensor(4096)
    site((1,), x, FakeTensor(8192), 8)
    for other in (FakeTensor(8192, device=-1), FakeTensor(8192, device=1)):
        site((1,), x, other, 8)
        assert k.log[-1][0] == "jit" and k.log[-1][2][:2] == (x, other)
    site((1,), x, FakeTensor(8192), 8)
    assert k.log[-1][0] == "direct"


def test_each_triton_specialisation_gets_its_own_binary():
    k = FakeKernel()
    site = _site(k)
    aligned, odd = FakeTensor(4096), FakeTensor(4098)
    y = FakeTensor(8192)
    for m in (1, 16, 17, 40):  # M == 1, M % 16 == 0, others: three classes (17 and 40 share)
        site((1,), aligned, y, m)
    site((1,), odd, y, 40)  # a misaligned pointer is another specialisation
    site((1,), FakeTensor(4096, "fp16"), y, 40)  # so is another dtype
    assert [e[0] for e in k.log] == ["jit", "jit", "jit", "direct", "jit", "jit"]
    assert site.binaries() == 5
    site((1,), odd, y, 33)
    assert k.log[-1][:2] == ("direct", 4)  # the misaligned binary, not the aligned one


def test_sixty_four_bit_m_and_active_hooks_always_take_the_jit_path():
    class Hooked:
        launch_enter_hook = type("Chain", (), {"calls": [print]})()
        launch_exit_hook = None

    k = FakeKernel()
    site = _site(k)
    x, y = FakeTensor(0), FakeTensor(0)
    for _ in range(2):
        site((1,), x, y, 2 ** 31)
    assert [e[0] for e in k.log] == ["jit", "jit"] and site.binaries() == 0
    k2 = FakeKernel()
    hooked = _site(k2, knobs=Hooked())
    for _ in range(2):
        hooked((1,), x, y, 8)
    assert [e[0] for e in k2.log] == ["jit", "jit"]


def test_empty_hook_chains_do_not_disable_direct_launch():
    class EmptyChains:
        launch_enter_hook = type("Chain", (), {"calls": []})()
        launch_exit_hook = type("Chain", (), {"calls": []})()

    k = FakeKernel()
    site = _site(k, knobs=EmptyChains())
    for _ in range(2):
        site((1,), FakeTensor(0), FakeTensor(0), 8)
    assert [e[0] for e in k.log] == ["jit", "direct"]


def test_a_compiled_kernel_without_launcher_fields_turns_the_site_to_jit():
    k = FakeKernel()
    k.__class__ = type("Bare", (FakeKernel,), {
        "__getitem__": lambda self, grid: (lambda *a, **kw: self.log.append(("jit", grid, a, kw)))})
    site = _site(k)
    for _ in range(3):
        site((1,), FakeTensor(0), FakeTensor(0), 8)
    assert [e[0] for e in k.log] == ["jit"] * 3 and site._direct is False


def test_tunedb_jit_launch_setting_keeps_every_call_on_triton_path():
    k = FakeKernel()
    site = Site(k, (512, 256, 0, 2), {"BM": 128})
    with settings.override(JIT_LAUNCH="1"):
        for _ in range(3):
            site((1,), FakeTensor(0), FakeTensor(0), 8)
    assert [e[0] for e in k.log] == ["jit"] * 3


def test_jit_launch_setting_rejects_other_values():
    from tunedb.errors import SettingsError

    with settings.override(JIT_LAUNCH="yes"), pytest.raises(SettingsError, match="TUNEDB_JIT_LAUNCH='yes'"):
        settings.jit_launch()


def test_interpreter_is_never_launched_directly(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    site = Site(FakeKernel(), ())
    assert site._probe() is False
    assert triton_launch._active(None) is False


def test_a_tensor_on_another_gpu_is_launched_with_that_gpu_current(monkeypatch):
    # device_map="auto": x on cuda:1 while cuda:0 is current; the memoised entry point no longer
    # checks the device, so the site must switch to x's GPU for the launch and switch back
    k = FakeKernel()
    site = _site(k)
    current = [0]
    site._device = lambda: current[0]
    switched = []

    class Guard:
        def __init__(self, index):
            self.index = index

        def __enter__(self):
            switched.append(self.index)
            self.saved, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.saved

    monkeypatch.setattr(triton_launch, "device_guard", Guard)
    x, y = FakeTensor(4096, device=1), FakeTensor(8192, device=1)
    site((3,), x, y, 40)
    site((3,), x, y, 40)
    assert switched == [1, 1] and current[0] == 0
    assert [e[0] for e in k.log] == ["jit", "direct"]  # keyed on device 1: its own binary
    x0, y0 = FakeTensor(4096), FakeTensor(8192)
    site((3,), x0, y0, 40)
    assert switched == [1, 1] and [e[0] for e in k.log] == ["jit", "direct", "jit"]  # device 0's own


def test_a_site_asks_torch_c_getter_for_the_device_where_triton_asks_torch_cuda(monkeypatch):
    """Triton 3.x's driver answers get_current_device with torch.cuda.current_device (Python: a
    lazy-init check, then torch._C._cuda_getDevice): a site takes the C getter, which answers the
    same index once CUDA is up; any other driver function is kept."""
    import torch

    def getter():
        return 3

    monkeypatch.setattr(torch._C, "_cuda_getDevice", getter, raising=False)
    assert triton_launch._current_device(torch.cuda.current_device) is getter
    other = lambda: 0  # noqa: E731 - another driver's own function
    assert triton_launch._current_device(other) is other
    monkeypatch.delattr(torch._C, "_cuda_getDevice")
    assert triton_launch._current_device(torch.cuda.current_device) is torch.cuda.current_device
