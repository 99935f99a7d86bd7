"""A census on meta tensors equals the census of the same model run for real (issue 5's check).

    PYTHONPATH=src python bench/census_devices.py --device cuda [--presets whisper-base conformer llama-3-8b]

For each preset: `tunedb census PRESET --mode M --device meta` and `--device DEVICE` with the same
options, then the two point lists are compared field by field (signature, M, calls, weight,
must_tune, eager_share). Prints one line per preset; exits 1 if the points a build measures
(op=gemm / gemm_act: signature, M, calls, must_tune, eager_share) differ; op=bmm points are
census-only and reported, not failed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {"whisper-base": ["--mode", "offline", "--max-batch-size", "8"],
         "whisper-large-v3": ["--mode", "offline", "--max-batch-size", "8"],
         "conformer": ["--mode", "streaming", "--chunk-size", "16", "--max-batch-size", "32"],
         "llama-3-8b": ["--mode", "decode", "--max-batch-size", "64"]}


def census(preset: str, device: str, out: Path) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "tunedb", "census", preset, *MODES[preset], "--device", device, "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["points"], time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--presets", nargs="+", default=["whisper-base", "conformer", "llama-3-8b"], choices=sorted(MODES))
    args = p.parse_args(argv)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            meta, t_meta = census(preset, "meta", Path(tmp) / f"{preset}-meta.json")
            real, t_real = census(preset, args.device, Path(tmp) / f"{preset}-{args.device}.json")
            keys_meta = {(q["signature"], q["M"]) for q in meta}
            keys_real = {(q["signature"], q["M"]) for q in real}
            same = meta == real
            only_meta, only_real = sorted(keys_meta - keys_real), sorted(keys_real - keys_meta)
            # what a build measures (op=bmm is census-only), compared by calls: a point's weight is
            # its share of ALL calls, bmm included, so one differing bmm shifts every weight
            built_meta, built_real = ([(q["signature"], q["M"], q["calls"], q["must_tune"], q["eager_share"])
                                       for q in pts if "|op=bmm|" not in q["signature"]] for pts in (meta, real))
            same_built = built_meta == built_real
            print(f"{preset}: {len(meta)} points on meta ({t_meta:.1f} s), {len(real)} on {args.device} "
                  f"({t_real:.1f} s): {'identical' if same else 'DIFFERENT'}; the {len(built_meta)} points a "
                  f"build measures (op=gemm/gemm_act): {'identical' if same_built else 'DIFFERENT'}"
                  + (f"; only meta {only_meta[:5]}; only {args.device} {only_real[:5]}" if not same else ""))
            bad += not same_built
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
