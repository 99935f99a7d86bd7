"""Which of the decode lane's new ideas pays, in one H200 run: the old `dk` lane's best, every `ds`
(stream kernel) variant, cuBLAS and the pure read of the weight, side by side.

    PYTHONPATH=src python bench/decode_lane_s14.py --out decode_lane_s14.json [--quick]
        [--shapes 6144x4096,4096x4096,...] [--ms 1,4,8,16] [--budget-s 90] [--full-read]

Per weight (default: the Llama-3-8B decode GEMMs, fused QKV 6144x4096, o 4096x4096, fused
gate+up 28672x4096, down 4096x14336, LM head 128256x4096) and M in 1, 4, 8, 16:
- cuBLAS (F.linear) and every lane config through bench/decode_limit.lane_arms, the same timing
  as the BENCHMARKS.md section "The decode lane against the physical read limit" (cold copies
  rotated in one CUDA graph of >= 16 back-to-back calls, median of 7 replays, each config checked
  against the fp32 reference first, a config that fails is reported and not timed);
- the old lane: session 9's winners (decode_limit.PRIOR, PDL twins among them);
- the new lane: configs_decode.stream_grid() (tensor-core and FMA slabs, 1/2/4/8 K tiles per CTA,
  deterministic and `_at` reductions), then the PDL twin of the best new config;
- the read roofline: bench/read_roofline.py configs and torch.sum (decode_limit.read_arms).
Back to back, a `_pdl` arm overlaps its own previous call, which a chain of different GEMMs does
not (BENCHMARKS.md: PDL did not help in the chain), so the goals are judged without PDL and the
PDL twin is reported apart; the layer chain (qkv, o, gate_up, down over 4 cold layers, M = 1 and
16: cuBLAS, old best, new best, new best with PDL) shows what PDL buys between different GEMMs.
Prints the point table (us, % of 4.3 TB/s, x cuBLAS), the per-variant
geomeans and the goal verdicts; writes everything to --out. Expected run time on the H200: about
80-110 s: ~20 s compiling 40 binaries in parallel (16 processes), ~50 s timing 20 points x ~27
arms, ~5 s for the chains (--budget-s caps the timing, later points get less; --quick keeps the
one-tile new variants and 5 old configs).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import decode_bounds as db  # noqa: E402
import decode_lane_summary as summ  # noqa: E402

LLAMA = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
# one Llama-3-8B layer's decode GEMMs in order (name, N, K, input): o's output feeds gate_up
LAYER = [("qkv", 6144, 4096, "x"), ("o", 4096, 4096, "x"), ("gate_up", 28672, 4096, "o"), ("down", 4096, 14336, "h")]


def new_configs(quick: bool) -> list[str]:
    from tunedb.families.gemm import configs_decode

    grid = [c.id for c in configs_decode.stream_grid()]
    if quick:  # one K tile per CTA, both reductions, both multiplies
        grid = [c for c in grid if c.startswith("ds_t1_")]
    return grid


def old_configs(quick: bool) -> list[str]:
    import decode_limit as dl

    return list(dl.PRIOR[:5] if quick else dl.PRIOR)


def precompile(cids: list[str]) -> set[str]:
    """Compile every arm's binary in parallel (tunedb prebuild's workers, the cache key a launch
    computes); the ids whose compile failed, which the run then leaves out instead of losing a
    whole weight to one arm's exception."""
    from tunedb.families.gemm import configs_decode, prebuild

    t0 = time.time()
    res = prebuild.run_jobs(prebuild.jobs_for([configs_decode.parse(c) for c in cids], ("bf16",)), "sm90", 16)
    return compile_failures(res, t0, "binaries")


def compile_failures(res: dict, t0: float, what: str) -> set[str]:
    """Print a parallel compile's outcome (prebuild's result dict) and return the config ids
    whose compile failed."""
    failed = {f["job"]["config_id"] for f in res["failed"]}
    print(f"precompiled {res['ok']}/{res['jobs']} {what} in {time.time() - t0:.1f} s"
          + (f"; failed (left out): {sorted(failed)}" if failed else ""), flush=True)
    for f in res["failed"][:3]:
        print(f"  {f['job']['config_id']}: {f.get('error', '')[-300:]}", flush=True)
    return failed


def measure(shapes, ms, quick: bool, full_read: bool, budget_s: float, sms: int,
            skip: set[str] = frozenset()) -> tuple[dict, list[dict]]:
    import torch

    import decode_limit as dl
    from tunedb.families.gemm import configs_decode

    new = [c for c in new_configs(quick) if c not in skip]
    old = [c for c in old_configs(quick) if c not in skip]
    reads, rows = {}, []
    start = time.time()
    for idx, (n, k) in enumerate(shapes):
        nbytes = db.weight_bytes(n, k)
        try:
            ws = [torch.randn(n, k, device=dl.DEVICE, dtype=dl._dtype()) * k ** -0.5
                  for _ in range(dl.copies_for(nbytes))]
            rd = reads[f"{n}x{k}"] = {"N": n, "K": k, "MB": round(nbytes / 1e6, 1),
                                      **dl.read_arms(ws, sms, quick=not full_read)}
            rd["read_bw"] = db.share(nbytes, rd["best_nopdl_us"])
            print(f"read {n}x{k} {rd['MB']} MB: {rd['best_nopdl_us']:.2f} us ({rd['read_bw']:.1%}) "
                  f"{rd['best_nopdl']}", flush=True)
            for j, m in enumerate(ms):
                left = budget_s - (time.time() - start)
                points_left = (len(shapes) - idx) * len(ms) - j
                # three old winners first, so a point cut short by the budget still compares
                g = dl.lane_arms(n, k, m, ws, old[:3] + new + old[3:], time.time() + max(1.0, left / points_left))
                row = {"N": n, "K": k, "M": m, "MB": rd["MB"], "read_us": rd["best_nopdl_us"],
                       "cublas_us": g["cublas_us"], "all_us": g["configs"], "failed": g["failed"],
                       "invalid": g.get("invalid", {}), "truncated": bool(g.get("truncated"))}
                best_new = summ.best(row["all_us"], summ.is_new, pdl=False)
                twin = best_new and configs_decode.pdl_twin(configs_decode.parse(best_new)).id
                if twin and twin not in skip:
                    again = dl.lane_arms(n, k, m, ws, [twin], time.time() + 30)
                    row["all_us"].update(again["configs"])
                    row["failed"] += again["failed"]
                    row["cublas_again_us"] = again["cublas_us"]  # the same arm twice: the run's noise
                rows.append(row)
                print(summ.point_line(row), flush=True)
        except Exception as exc:  # noqa: BLE001 - one weight failing leaves the others measured
            import traceback

            traceback.print_exc()
            reads.setdefault(f"{n}x{k}", {"N": n, "K": k})["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        ws = None
        if dl.DEVICE == "cuda":
            torch.cuda.empty_cache()
    return reads, rows


def layer_chain_timer(m: int, layers: int = 4, sms: int = 0, gemms: list | None = None, launch=None):
    """chain(pick) -> microseconds per layer of the layer's GEMMs (`gemms`, default LAYER) in order
    over `layers` cold copies (1.7 GB), one CUDA graph; pick(n, k) names each GEMM's arm: "torch"
    (cuBLAS, as the model calls it), "read:<id>" (decode_limit's pure read of the weight; needs
    `sms`) or a config id. Here a `_pdl` kernel overlaps a different GEMM's tail, as in a model.
    `launch(cid, n, k)`, when given, returns fn(x, w, bias, out) for ids outside the GEMM family
    (None: the family's launcher)."""
    import torch

    import decode_limit as dl
    from tunedb.families.gemm import FAMILY

    gemms = gemms or LAYER

    ws = {name: [torch.randn(n, k, device=dl.DEVICE, dtype=dl._dtype()) * k ** -0.5 for _ in range(layers)]
          for name, n, k, _ in gemms}
    outs = {name: torch.empty(m, n, device=dl.DEVICE, dtype=dl._dtype()) for name, n, _, _ in gemms}
    src = {(inp, k): outs[inp] if inp in outs else (torch.rand(m, k, device=dl.DEVICE) * 2 - 1).to(dl._dtype())
           for _, _, k, inp in gemms}

    def chain(pick) -> float:
        calls = []
        for layer in range(layers):
            for name, n, k, inp in gemms:
                cid = pick(n, k)
                w, o, a = ws[name][layer], outs[name], src[(inp, k)]
                if cid == "torch":  # as decode_limit times cuBLAS (the model's own call)
                    calls.append(lambda a=a, w=w: torch.nn.functional.linear(a, w))
                elif cid.startswith("read:"):
                    calls.append(dl.read_call(cid[5:], w, sms))
                else:
                    fn = launch(cid, n, k) if launch is not None else None
                    if fn is None:
                        fn = FAMILY.launcher(FAMILY.parse_config(cid), FAMILY.make_signature("gemm", dl.DT, n, k))
                    calls.append(lambda fn=fn, a=a, w=w, o=o: fn(a, w, None, o))
        for c in calls:  # warm: compiles, workspaces
            c()
        dl._sync()
        # decode_limit's graph timer gives us per call; a layer is len(gemms) calls
        return dl.replay_ms(lambda i: calls[i](), len(calls)) * 1e3 * len(gemms)

    return chain


def layer_chain(rows: list[dict], m: int, layers: int = 4) -> dict:
    """The layer chain (layer_chain_timer) for cuBLAS, the old lane's best without PDL, the new
    lane's best without PDL and the same with every GEMM's PDL twin. Per-layer microseconds; {}
    when a GEMM of the layer has no measured pick at this M."""
    import decode_lane_summary as summ
    from tunedb.families.gemm import configs_decode

    by_shape = {(r["N"], r["K"]): summ.picks(r) for r in rows if r["M"] == m}
    if any((n, k) not in by_shape or not by_shape[(n, k)]["new"] for _, n, k, _ in LAYER):
        return {}
    chain = layer_chain_timer(m, layers)
    twin = lambda cid: configs_decode.pdl_twin(configs_decode.parse(cid)).id  # noqa: E731
    res = {"M": m, "layers": layers, "cublas_us": chain(lambda n, k: "torch"),
           "picks": {f"{n}x{k}": by_shape[(n, k)]["new"] for _, n, k, _ in LAYER}}
    if all(by_shape[(n, k)]["old_nopdl"] for _, n, k, _ in LAYER):
        res["old_us"] = chain(lambda n, k: by_shape[(n, k)]["old_nopdl"])
    res["new_us"] = chain(lambda n, k: by_shape[(n, k)]["new"])
    res["new_pdl_us"] = chain(lambda n, k: twin(by_shape[(n, k)]["new"]))
    for key in ("old_us", "new_us", "new_pdl_us"):
        if key in res:
            res[key.replace("_us", "_x_cublas")] = res["cublas_us"] / res[key]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_lane_s14.json")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in LLAMA), help="NxK[,NxK...]")
    ap.add_argument("--ms", default="1,4,8,16", help="decode M values (each 1..16)")
    ap.add_argument("--budget-s", type=float, default=90.0, help="timing budget; later points get less")
    ap.add_argument("--quick", action="store_true", help="one-K-tile new variants and 5 old configs only")
    ap.add_argument("--full-read", action="store_true", help="every read_roofline config, not the quick four")
    ap.add_argument("--no-chain", action="store_true", help="skip the Llama layer chain (M = 1, 16)")
    args = ap.parse_args(argv)
    try:
        shapes = db.parse_shapes(args.shapes)
        ms = db.parse_ms(args.ms, "1,4,8,16")
    except ValueError as exc:
        ap.error(str(exc))

    import torch

    if not torch.cuda.is_available():
        print("bench/decode_lane_s14.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from tunedb.families.gemm import configs_decode

    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    new = new_configs(args.quick)
    failed = precompile(sorted({*new, *(configs_decode.pdl_twin(configs_decode.parse(c)).id for c in new),
                                *old_configs(args.quick)}))
    reads, rows = measure(shapes, ms, args.quick, args.full_read, args.budget_s, sms, failed)
    chains = []
    if not args.no_chain:
        for m in (1, 16):
            try:
                chains.append(layer_chain(rows, m))
            except Exception as exc:  # noqa: BLE001 - the point table stands without the chain
                import traceback

                traceback.print_exc()
                chains.append({"M": m, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    lines = summ.report(rows, new)
    summ.report_chains(chains)
    summary = summ.summarize(rows, new)
    summary["seconds"] = round(time.time() - t0, 1)
    print(f"\nwall {summary['seconds']} s")
    from tunedb.database import write_atomic

    write_atomic(Path(args.out), json.dumps({"reads": reads, "rows": rows, "chains": chains, "compile_failed": sorted(failed), "summary": summary, "report": lines,
                                             "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "triton": __import__("triton").__version__, "args": vars(args)},
                                            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
