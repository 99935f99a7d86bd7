"""Proof that `tunedb prebuild` (run without a GPU) leaves a GPU machine nothing to compile.

    # on a CPU box, with the SAME Triton version as the GPU box:
    TRITON_CACHE_DIR=/shared/triton python -m tunedb prebuild --arch sm90 --jobs 16
    # on the GPU box, sharing that directory:
    TRITON_CACHE_DIR=/shared/triton PYTHONPATH=src python bench/prebuild_proof.py

Runs every compile-set config once per dtype on an aligned shape and counts Triton cache misses
(through triton.knobs.compilation.listener, and new cache entries as a cross-check); prints
"compiled N kernels". N == 0 is the claim.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--m", type=int, default=64)
    a = ap.parse_args()
    from tunedb.families.gemm import FAMILY, prebuild

    cache = prebuild.triton_cache_dir()
    os.environ["TRITON_CACHE_DIR"] = str(cache)
    import torch
    import triton

    manifest = cache / f"tunedb-prebuild-{a.arch}.json"
    built = json.loads(manifest.read_text()) if manifest.is_file() else {}
    print(f"cache {cache}; prebuilt with triton {built.get('triton', '?')} for {built.get('target', '?')}; "
          f"this machine: triton {triton.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()} (cc {torch.cuda.get_device_capability()})")
    if built.get("cache_dir") and built["cache_dir"] != str(cache):
        fixed = prebuild.relocate_cache(cache, built["cache_dir"])
        print(f"cache moved from {built['cache_dir']}: rewrote {fixed} Triton group files (absolute paths)")
    here = prebuild.key_components(torch.cuda.get_device_capability()[0] * 10
                                   + torch.cuda.get_device_capability()[1])
    there = built.get("key", {})
    for name, value in here.items():
        same = "same" if there.get(name) == value else f"DIFFERS (prebuild: {there.get(name)!r})"
        print(f"  key part {name}: {value!r} {same}")
    events = {"hit": 0, "miss": 0}
    misses = []

    def listener(src=None, metadata=None, metadata_group=None, times=None, cache_hit=False, **_):
        events["hit" if cache_hit else "miss"] += 1
        if not cache_hit:
            misses.append(getattr(src, "name", str(src)))

    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        knobs.compilation.listener = listener
    before = set(p.name for p in cache.iterdir()) if cache.is_dir() else set()
    ran = 0
    for cfg in FAMILY.compile_set(a.arch, []):
        for dt in ("fp16", "bf16"):
            sig = FAMILY.make_signature("gemm", dt, 4096, 4096)
            (x, w, b), _ = FAMILY.make_inputs(sig, a.m, "cuda", 0)
            FAMILY.launch(cfg, sig, x, w, b)
            ran += 1
    torch.cuda.synchronize()
    after = set(p.name for p in cache.iterdir()) if cache.is_dir() else set()
    new_dirs = len(after - before)
    print(f"ran {ran} config launches; cache hits {events['hit']}, misses {events['miss']}, "
          f"new cache entries {new_dirs}")
    for name in misses[:20]:
        print(f"  compiled: {name}")
    # New entries that are not kernels: Triton's host-side launcher stubs (C, built with the local
    # compiler on first use of each kernel signature) and its cuda_utils module.
    print(f"compiled {events['miss'] if knobs is not None else new_dirs} kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
