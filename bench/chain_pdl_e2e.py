"""What launching a decode GEMM as its PDL twin after one of ours buys a whole model (issue 18).

    PYTHONPATH=src:bench python bench/chain_pdl_e2e.py --out chain_pdl_e2e.json [--rounds 15]   # ~90 s

Llama-3-8B decode (bench/e2e_models.py: embedding, 2 decoder layers, final norm, one token a
sequence), batches 1 and 16, bf16, on the shipped tables alone (no tune), each variant a CUDA-graph
replay: plain; `tunedb.optimize()` captured with TUNEDB_CHAIN_PDL=1 (runtime/capture_chain.py:
a served decode-lane config launches as its PDL twin where the call directly follows one of ours);
the same optimized module captured with TUNEDB_CHAIN_PDL=0. Paired shuffled rounds of replays
(e2e_timing.paired_speedups: a variant's speedup is the median of its per-round plain/variant
ratios). Also how many GEMM calls of a forward launched the twin, and whether both tunedb graphs
compute the same bits (PDL changes when a kernel starts, never what it computes).
"""
from __future__ import annotations

import json
import statistics
import time

import torch

import tunedb
from e2e_models import build
from e2e_timing import output_tensor, paired_speedups, rel_err, rounds_args, run_env, write_result
from tunedb import settings
from tunedb.measure.cudagraph import capture
from tunedb.families.gemm import launch_gemv
from tunedb.runtime import capture_chain, launch_table, selector

# label -> (TUNEDB_CHAIN_PDL, which calls launch the twin: "ours" = the run time's rule, "always" =
# every captured call whose weight is a Parameter; the twin: "same" = the measured config with PDL,
# "p4" = its 4-K-tile-first-tile form where the registers allow, as bench/gv_prefetch.py ran)
VARIANTS = {"tunedb, no PDL": ("0", "ours", "same"), "tunedb, chain PDL": ("1", "ours", "same"),
            "tunedb, chain PDL p4": ("1", "ours", "p4"), "tunedb, PDL every call": ("1", "always", "same")}


def _wide_twin(pair):
    """pdl_pair with the twin's first tile 4 K tiles wide where the config allows it."""
    from tunedb.errors import ConfigError
    from tunedb.families.gemm import config_ids

    def wide(config):
        got = pair(config)
        if got is None or config.param("kernel") != "gemv" or config.param("dot"):
            return got
        try:
            return got[0], config_ids.parse(got[0].id + "_p4_pdl"), got[2]
        except ConfigError:
            return got
    return wide


def main(argv=None) -> int:
    a = rounds_args(__doc__, argv)
    t0 = time.time()
    rows = {}
    with settings.override(USER_DB="off"), torch.no_grad():
        selector.reload()
        bm = build("llama-3-8b", "cuda", batches=(1, 16))
        plain = bm.module
        tuned = tunedb.optimize(plain, inplace=False)
        for batch in (1, 16):
            decisions: list[bool] = []
            real = capture_chain.follows_ours
            graphs, outs = {}, {}
            ref = bm.call(plain, batch)()
            keep: list = []
            graphs["plain"] = capture(bm.call(plain, batch), warmup=3, keep=keep)
            outs["plain"] = keep[-1]
            for label, (on, follows, pair) in VARIANTS.items():
                keep = []
                patched_follows = (lambda s: True) if follows == "always" else real

                def spy(stream, f=patched_follows):
                    decisions.append(f(stream))
                    return decisions[-1]

                capture_chain.follows_ours, saved_pair = spy, launch_gemv.pdl_pair
                if pair == "p4":
                    launch_gemv.pdl_pair = _wide_twin(saved_pair)
                launch_table.clear()  # every shape binds again, under this variant's pairing
                try:
                    decisions.clear()
                    with settings.override(CHAIN_PDL=on):
                        graphs[label] = capture(bm.call(tuned, batch), warmup=3, keep=keep)
                finally:
                    capture_chain.follows_ours, launch_gemv.pdl_pair = real, saved_pair
                    launch_table.clear()
                outs[label] = keep[-1]
                rows.setdefault(batch, {})[f"{label}: twin launches"] = sum(decisions)
                rows[batch][f"{label}: captured calls asked"] = len(decisions)
            for g in graphs.values():
                g.replay()
            torch.cuda.synchronize()
            out_of = {k: output_tensor(v) for k, v in outs.items()}
            ref_t = output_tensor(ref)
            steps = {k: g.replay for k, g in graphs.items()}
            ms, ratios = paired_speedups(steps, "plain", a.rounds, a.per_round, seed=batch)
            rows[batch].update({
                "ms": ms,
                "speedup_over_plain": {k: statistics.median(v) for k, v in ratios.items()},
                "chain_over_no_pdl": statistics.median(
                    c / n for c, n in zip(ratios["tunedb, chain PDL"], ratios["tunedb, no PDL"])),
                "err_vs_plain": {k: rel_err(v, ref_t) for k, v in out_of.items()},
                "pdl_bits_equal": all(bool(torch.equal(out_of[k], out_of["tunedb, no PDL"])) for k in VARIANTS),
            })
            print(f"batch {batch}: {json.dumps(rows[batch], default=str)}", flush=True)
    env = run_env(bm.label, t0)
    print("\n| batch | variant | ms | x plain | twin launches (of calls asked) |")
    print("|---|---|---|---|---|")
    for b, r in rows.items():
        for label in ("plain", *VARIANTS):
            x = r["speedup_over_plain"].get(label, 1.0)
            tw = f"{r.get(label + ': twin launches', '-')} of {r.get(label + ': captured calls asked', '-')}"
            print(f"| {b} | {label} | {r['ms'][label]:.4f} | {x:.3f} | {tw} |")
    write_result(a.out, env, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
