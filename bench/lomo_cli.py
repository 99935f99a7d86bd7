"""The command line the leave-one-model-out replay benches share (lomo_regret, lomo_transfer,
lomo_decode, lomo_gv): --log, a recorded H200 build log (.jsonl or .jsonl.gz), --out, the JSON
written atomically; run(log) -> doc, report(doc) prints it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
# the system tier's build of session 3 (2026-11-30, call M): what the earlier studies replayed
DEFAULT_LOG = ROOT / "bench/results/2026-11-30_s3_system_sm90_buildall_measurements.jsonl.gz"
# session 17 B's rebuild with the bf16 GEMV (`gv`) in the build space
GV_LOG = ROOT / "bench/results/s17_B/logs/measurements.jsonl.gz"


def replay_main(argv: Sequence[str] | None, description: str | None, run: Callable[[Path], Any],
                report: Callable[[Any, Path], None], to_json: Callable[[Any], Any] = lambda doc: doc,
                default_log: Path = DEFAULT_LOG, json_default: Any = None) -> int:
    from tunedb import database

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, default=default_log)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not args.log.is_file():
        ap.error(f"--log {args.log} is not a file")
    doc = run(args.log)
    report(doc, args.log)
    if args.out:
        database.write_atomic(args.out, json.dumps(to_json(doc), indent=1, sort_keys=True, default=json_default))
    return 0
