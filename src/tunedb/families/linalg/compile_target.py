"""Compiling the unrolled linalg kernels (lane, reg, rows) for a GPU target on a machine without one.

The device runs an older Triton than the CPU machines (3.6 against 3.x), and a kernel that the
interpreter runs can still fail in the device compiler's passes: session 14's posv lane kernels
at fp32 n=4 died in TritonGPURemoveLayoutConversions ("operand #0 does not dominate this use")
on the H200 only. `triton.compile(ASTSource, target=GPUTarget('cuda', 90, 32))` runs the whole
pipeline (TTIR, TTGIR, LLVM, PTX, ptxas) with no GPU, so every config the tune can pick is
compiled here in the Triton that imports, under the pointer alignment the device sees (torch
allocations: 16-byte aligned pointers, which is what lets the coalescing pass vectorise).

    PYTHONPATH=/tmp/t36/site:src python -m tunedb.families.linalg.compile_target \
        [--packings lane,reg] [--n 4,8,16,32] [--jobs 2]

prints one JSON object per kernel ({"op", "dtype", "n", "config", "ok", "error", "seconds",
"shared", "shuffles", "barriers", "registers", "spill_bytes"}; the last two from Triton's ptxas
-v, None without it) and exits 1 when any failed. tests/unit/test_linalg_compile_sm90.py runs it with
Triton 3.6 where that wheel is available.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from tunedb.families.linalg import kernels_space as space

# shfl (kernels_shfl.py, one config per n) has its own test (tests/unit/test_linalg_shfl.py:
# `--packings shfl`, which also reads the shuffles and barriers off the PTX).
# rows (kernels_rows.py) compiles too (`--packings rows`; tests/unit/test_linalg_rows.py checks
# the configs its GPU test runs): not in the default list, whose slow test it would double
COMPILABLE = ("lane", "reg", "rows", "shfl", "panel", "pdot", "pdottf")
PACKINGS = ("lane", "reg")  # the packings whose kernels are unrolled per n (the compile risk)
OPS = ("potrf", "posv", "trsv")
# the tune's grid (ladder.GRID_N), where the shipped table measured these packings; the predicate
# also admits n = 2..32 between them (a model-tier or heuristic pick there compiles on first use,
# unchecked here: `--n 2,3,...,32` checks them, about 8x the time)
TUNE_N = (4, 8, 16, 32)
_POINTERS = {"potrf": ("A", "L", "INFO"), "posv": ("A", "B", "X", "INFO"), "trsv": ("L", "B", "X")}
# the panel kernels name their pointers apart (B is their panel width) and take a workspace
_PANEL_POINTERS = {"potrf": ("A", "L", "INFO"), "posv": ("A", "Bv", "X", "W", "INFO"), "trsv": ("Lm", "Bv", "X")}


def items(packings: Sequence[str] = PACKINGS, ns: Sequence[int] = TUNE_N,
          dtypes: Sequence[str] = ("fp32", "fp64")) -> list[tuple[str, str, int, str]]:
    """Every (op, dtype, n, config id) the validity predicate admits for `packings` at the sizes
    `ns`: at TUNE_N, a superset of what the tune picks at any --max-arms."""
    return [(op, dt, n, c.id) for op in OPS for dt in dtypes for n in ns
            for c in space.config_space(op, n, dt) if c.packing in packings]


def _kernel(op: str, packing: str) -> Any:
    if packing == "lane":
        from tunedb.families.linalg import kernels_lane as mod
    elif packing == "reg":
        from tunedb.families.linalg import kernels_reg as mod
    elif packing == "rows":
        from tunedb.families.linalg import kernels_rows as mod
    elif packing == "shfl":
        from tunedb.families.linalg import kernels_shfl as mod
    elif packing == "panel":
        from tunedb.families.linalg import kernels_panel as mod
    elif packing in ("pdot", "pdottf"):
        from tunedb.families.linalg import kernels_pdot as mod

        return getattr(mod, f"{op}_pdot")
    else:
        raise ValueError(f"packing {packing!r}: compile_target compiles {', '.join(COMPILABLE)}")
    return getattr(mod, f"{op}_{packing}")


def _ptxas_usage(ptx: str, capability: int) -> dict:
    """Registers and spill bytes from Triton's own ptxas (`-v`); None where it cannot say."""
    import os
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    arch = re.search(r"\.target\s+(sm_\w+)", ptx)
    if not ptxas.exists() or arch is None:
        return {"registers": None, "spill_bytes": None}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        Path(src).write_text(ptx)
        proc = subprocess.run([str(ptxas), f"-arch={arch.group(1)}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, timeout=300)
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    spills = re.findall(r"(\d+) bytes spill stores", proc.stderr)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_bytes": sum(map(int, spills)) if regs else None}


def compile_one(item: tuple[str, str, int, str], capability: int = 90) -> dict:
    """Compile one kernel for cuda:`capability`; the outcome as a JSON-ready dict."""
    op, dt, n, cid = item
    out = {"op": op, "dtype": dt, "n": n, "config": cid, "ok": False, "error": "", "seconds": 0.0, "shared": None,
           "shuffles": None, "barriers": None, "registers": None, "spill_bytes": None}
    start = time.perf_counter()
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        cfg = space.parse_config(cid)
        ptr = {"fp32": "*fp32", "fp64": "*fp64"}[dt]
        names = (_PANEL_POINTERS if cfg.packing in ("panel", *space.PDOT_PACKINGS) else _POINTERS)[op]
        sig = {name: ("*i32" if name == "INFO" else ptr) for name in names}
        sig.update(batch="i32", N="constexpr", NP="constexpr")
        consts = {"N": n, "NP": space.next_pow2(n)}
        if cfg.packing == "panel":  # as launch.py passes them
            consts["NP"] = space.panel_rows(n, op)
            sig.update(B="constexpr", KC="constexpr")
            consts["B"], consts["KC"] = space.panel_shape(dt)
        elif cfg.packing in space.PDOT_PACKINGS:
            sig.update(B="constexpr", KC="constexpr", PREC="constexpr")
            consts.update(NP=space.panel_rows(n), B=space.PDOT_B, KC=space.PDOT_KC,
                          PREC="tf32x3" if cfg.packing == "pdottf" else "ieee")
        else:
            sig["P"] = "constexpr"
            consts["P"] = cfg.problems
        if cfg.packing == "lane":  # as launch.py passes them
            sig["COLS"] = "constexpr"
            consts["COLS"] = space.lane_columns(cfg.problems, cfg.warps, n)
        if cfg.packing == "shfl":
            sig["CH"] = "constexpr"
            consts["CH"] = space.shfl_chunk(n)
        src = ASTSource(fn=_kernel(op, cfg.packing), signature=sig, constexprs=consts,
                        attrs={(i,): [["tt.divisibility", 16]] for i in range(len(names))})
        kernel = triton.compile(src, target=GPUTarget("cuda", capability, 32), options={"num_warps": cfg.warps})
        ptx = kernel.asm.get("ptx", "")
        out.update(ok=True, shared=int(getattr(kernel.metadata, "shared", 0) or 0),
                   shuffles=ptx.count("shfl.sync"), barriers=ptx.count("bar.sync"))
        out.update(_ptxas_usage(ptx, capability))
    except Exception as exc:  # reported per kernel: the caller decides
        text = str(exc).strip().splitlines()
        out["error"] = f"{type(exc).__name__}: {text[-1] if text else ''}"[:400]
    out["seconds"] = round(time.perf_counter() - start, 2)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packings", default=",".join(PACKINGS))
    ap.add_argument("--n", default=",".join(map(str, TUNE_N)))
    ap.add_argument("--dtypes", default="fp32,fp64")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--capability", type=int, default=90)
    args = ap.parse_args(argv)
    todo = items(args.packings.split(","), [int(x) for x in args.n.split(",")], args.dtypes.split(","))
    if args.jobs > 1:
        import concurrent.futures as cf
        import functools
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(functools.partial(compile_one, capability=args.capability), todo))
    else:
        results = [compile_one(item, args.capability) for item in todo]
    for res in results:
        print(json.dumps(res), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
