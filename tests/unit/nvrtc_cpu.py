"""NVRTC on a machine without a GPU (the tests' helper): compile CUDA C++ for an sm target from the
`nvidia-cuda-nvrtc-cu12` wheel's libnvrtc through ctypes, and read ptxas's resource report.
torch's own NVRTC path needs a CUDA build of torch; this one needs only the wheel."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path


def library() -> ctypes.CDLL | None:
    """The wheel's libnvrtc, or None when it is not installed."""
    try:
        import nvidia.cuda_nvrtc as pkg
    except ImportError:
        return None
    roots = [Path(p) for p in getattr(pkg, "__path__", [])]
    for root in roots:
        for so in sorted((root / "lib").glob("libnvrtc.so*")):
            if "alt" in so.name or "builtins" in so.name:
                continue
            try:
                return ctypes.CDLL(str(so))
            except OSError:
                continue
    return None


def compile_report(lib: ctypes.CDLL, source: str, arch: str = "sm_90") -> tuple[bool, str, dict]:
    """(compiled, log, {registers, spill_bytes}) of one source through NVRTC and ptxas -v."""
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None, None) != 0:
        return False, "nvrtcCreateProgram failed", {}
    opts = [f"--gpu-architecture={arch}".encode(), b"--ptxas-options=-v", b"-std=c++17"]
    res = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    log = buf.value.decode(errors="replace")
    usage = {}
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if regs:
        usage["registers"] = int(regs.group(1))
    if spills:
        usage["spill_bytes"] = sum(int(a) + int(b) for a, b in spills)
    return res == 0, log, usage
