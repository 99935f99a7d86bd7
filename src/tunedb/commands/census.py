"""`tunedb census`: record which GEMM shapes a workload runs in a service mode, write a census file."""
from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    from tunedb.census.modes import MODES

    from tunedb.census.presets import CALLABLE_CONTRACT

    parser.add_argument("workload", help="a preset (whisper-base, whisper-large-v3, conformer, llama-3-8b, llama-3.2-3b) "
                                         f"or module:callable; {CALLABLE_CONTRACT}")
    parser.add_argument("--mode", choices=MODES, default="offline", help="service mode (default offline)")
    parser.add_argument("--max-batch-size", type=int, default=8, help="largest batch / cohort (default 8)")
    parser.add_argument("--chunk-size", type=int, default=None, help="streaming: input frames per chunk")
    parser.add_argument("--manifest", default=None,
                        help="NeMo-style JSONL traffic (duration in s; tokens / output_tokens for text); "
                             "default: the documented synthetic distribution")
    parser.add_argument("--capture", action="append", default=[],
                        help="merge a TUNEDB_CAPTURE recording (repeatable)")
    parser.add_argument("--merge", action="append", default=[], help="merge an existing census file (repeatable)")
    parser.add_argument("--device", default="meta", help="where to build the model (default meta: no weights)")
    parser.add_argument("--impl", default="auto", choices=("auto", "mirror", "hf", "torchaudio"),
                        help="preset implementation (default auto: transformers/torchaudio when importable)")
    add_length_options(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic traffic and replays")
    parser.add_argument("--fused", action="store_true",
                        help="take the census of tunedb.optimize(model): a Linear fused with its activation "
                             "is keyed as the call the run time makes (default: aten-level calls)")
    parser.add_argument("--quantization", default=None, choices=("fp8-rowwise", "fp8-block", "int8"),
                        help="quantize the full-precision model online with torchao first (W8A8); its "
                             "Linears are then recorded under scaled_mm / scaled_mm_fp8 (needs torchao)")
    parser.add_argument("--out", required=True, help="census JSON file to write ('-': standard output, "
                                                      "the summary then on standard error)")


def add_length_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--unit, --max-length, --length-step: the probe lengths of a module:callable workload (the
    census and `tunedb tune` alike; presets.check_lengths checks them, a preset ignores them)."""
    from tunedb.census.presets import AUDIO, TEXT, USER_MAX_LENGTH

    parser.add_argument("--unit", default=AUDIO, choices=(AUDIO, TEXT),
                        help="module:callable workloads: what input_factory's length counts")
    parser.add_argument("--max-length", type=int, default=USER_MAX_LENGTH,
                        help="module:callable workloads: the offline capture limit, in --unit")
    parser.add_argument("--length-step", type=int, default=0,
                        help="module:callable workloads: offline length buckets (0: the M-bucket ladder)")


def run(args: argparse.Namespace) -> int:
    from tunedb.census import merge, read_capture, read_census, write_census
    from tunedb.census.censusfile import check_out
    from tunedb.census.presets import workload
    from tunedb.census.probe import take_census

    to_stdout = args.out == "-"
    if not to_stdout:
        # before the census is taken; --merge may name the file itself (a census updated in place)
        check_out(args.out, (("--manifest", args.manifest), *(("--capture", c) for c in args.capture)))
    import contextlib
    import sys

    # --out -: stdout holds the census alone; the workload's own prints (at import, in its factory
    # or forward) go to stderr, beside the summary
    quiet = contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext()
    with quiet:
        w = workload(args.workload, args.unit, args.max_length, args.length_step)
    from tunedb.commands.census_progress import census_progress

    with census_progress() as tell, quiet:
        census = take_census(w, args.mode, args.max_batch_size, args.chunk_size, args.manifest,
                             args.device, args.impl, args.seed, fused=args.fused,
                             quantization=args.quantization, progress=tell)
    extra = [read_capture(p) for p in args.capture] + [read_census(p) for p in args.merge]
    if extra:
        census = merge(census, *extra)
    if to_stdout:
        import json

        from tunedb.census.censusfile import to_json

        print(json.dumps(to_json(census), indent=1))
    else:
        write_census(args.out, census)
    from tunedb.census.presets import describe_impl

    summary = sys.stderr if to_stdout else sys.stdout
    print(f"tunedb census: {describe_impl(dict(census.meta).get('impl', ''))}", file=summary)
    tuned = [p for p in census.points if _tunable(p.signature)]
    sigs = {p.signature for p in tuned}
    print(f"tunedb census: {w.name} ({args.mode}): {len(tuned)} points of tuned ops over {len(sigs)} signatures, {sum(p.must_tune for p in tuned)} must-tune, "
          f"{len(census.points) - len(tuned)} points of ops no family tunes -> "
          f"{'standard output' if to_stdout else args.out}", file=summary)
    unkeyed = dict(census.meta).get("experts_not_recorded")
    if unkeyed:
        print(f"tunedb census: {unkeyed} mixture-of-experts block(s) are not in this census: their expert "
              f"GEMMs are keyed only as optimize() calls them (add --fused; `tunedb tune` does by default)",
              file=summary)
    return 0


def _tunable(sig) -> bool:
    """Whether a registered family tunes `sig` (its op and dtype: a census also records calls
    nobody tunes, fp32 GEMMs among them; families.serves, as `tunedb tune` counts them)."""
    from tunedb import families

    try:
        return families.serves(families.get(sig.family), sig)
    except Exception:  # a family this process does not know
        return False
