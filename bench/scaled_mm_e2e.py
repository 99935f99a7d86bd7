"""End to end: a Llama-3-8B-shaped model (2 layers, random weights; bench/quant_llama.py)
quantized with torchao (default fp8 row-wise), served two ways in the same run: torchao's default
path (torch._scaled_mm with fast accumulation, its own activation quantization) and
tunedb.optimize() of the same quantized model (each torchao Linear through tunedb::scaled_mm_fp8,
the kernel from the shipped table or the heuristic). Decode batch 1 and 16 (a one-token forward
per sequence, as the census probes) and a 2048-token prefill, each captured in a CUDA graph;
median of 15 replays (cold weights: 2 layers and the LM head are ~1 GB of fp8, far beyond L2).
Outputs are compared with each other and with the unquantized bf16 model's logits.

    PYTHONPATH=src:. python bench/scaled_mm_e2e.py --out e2e_quant.json [--scheme fp8-rowwise]

Needs torchao (pip install --no-deps .stage/wheels/torchao-0.18.0-*.whl). About 1 minute on the
H200 (model build, quantization, Triton compiles of the served configs, 6 captured graphs).
Goal (issue 20): tunedb >= 1.1x torchao's path in geomean, never below 0.99x.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.quant_llama import make  # noqa: E402
from graph_timing import replayed_ms  # noqa: E402  (bench/ is sys.path[0])

CASES = (("decode b1", 1, 1), ("decode b16", 16, 1), ("prefill 2048", 1, 2048))


def graph_ms(model, ids, replays: int = 15) -> tuple[float, torch.Tensor]:
    """Median ms of one captured forward, and its output."""
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # compiles, allocator warm-up
                model(ids)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = model(ids)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ms = replayed_ms(g, replays)
    result = out.float().clone()
    del g
    return ms, result


def served_configs(model) -> list[str]:
    """What each quantized signature runs at each case's M, resolved as the op resolves it (the
    shipped table, or the heuristic where it has no entry)."""
    from tunedb.families.scaled_mm import ops
    from tunedb.runtime import selector

    lines = []
    sigs = {}
    for mod in model.modules():
        if type(mod).__name__ == "QuantizedLinear":
            sigs.setdefault(mod.signature(), mod.family)
    for sig, family in sigs.items():
        for m in sorted({b * length for _, b, length in CASES}):
            lines.append(f"{sig.format()} M={m}: {ops.chosen(family, sig, m).id} "
                         f"[{selector.peek(family, sig, m).tier}]")
    return lines


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--scheme", default="fp8-rowwise", choices=("fp8-rowwise", "fp8-block", "int8"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    import tunedb
    from tunedb.families.scaled_mm.torchao_bridge import quantize_model

    t0 = time.monotonic()
    full = make("cuda", seed=0)[0]
    base = make("cuda", seed=0)[0]
    quantize_model(base, args.scheme, "cuda")
    ours = make("cuda", seed=0)[0]
    quantize_model(ours, args.scheme, "cuda")
    ours = tunedb.optimize(ours)
    served = sum(1 for m in ours.modules() if type(m).__name__ == "QuantizedLinear")
    print(f"[{time.monotonic() - t0:5.1f}s] models built; {served} Linears served by tunedb", file=sys.stderr)
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for name, batch, length in CASES:
        ids = torch.randint(0, 128256, (batch, length), device="cuda", generator=gen)
        with torch.no_grad():
            ref = full(ids).float()
        row = {"case": name, "batch": batch, "length": length}
        outs = {}
        for label, model in (("torchao", base), ("tunedb", ours)):
            try:
                row[f"{label}_ms"], outs[label] = graph_ms(model, ids)
                row[f"{label}_err_vs_bf16"] = rel(outs[label], ref)
            except Exception as exc:  # a path that cannot capture or run is reported, not fatal
                row[f"{label}_ms"] = None
                row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if len(outs) == 2:
            row["tunedb_vs_torchao_err"] = rel(outs["tunedb"], outs["torchao"])
        if row.get("torchao_ms") and row.get("tunedb_ms"):
            row["speedup"] = row["torchao_ms"] / row["tunedb_ms"]
        rows.append(row)
        print(f"[{time.monotonic() - t0:5.1f}s] {name}", file=sys.stderr)
    f = lambda v, s=".3f": "-" if v is None else format(v, s)  # noqa: E731
    print(f"\n### {args.scheme}, Llama-3-8B widths, 2 layers, CUDA graphs\n")
    print("| case | torchao ms | tunedb ms | speedup | err vs bf16 (torchao / tunedb) | tunedb vs torchao |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {f(r.get('torchao_ms'))} | {f(r.get('tunedb_ms'))} | {f(r.get('speedup'), '.2f')} "
              f"| {f(r.get('torchao_err_vs_bf16'), '.4f')} / {f(r.get('tunedb_err_vs_bf16'), '.4f')} "
              f"| {f(r.get('tunedb_vs_torchao_err'), '.4f')} |")
        for label in ("torchao", "tunedb"):
            if r.get(f"{label}_error"):
                print(f"\n{r['case']} {label} failed: {r[f'{label}_error']}")
    sp = [r["speedup"] for r in rows if r.get("speedup")]
    gm = math.exp(sum(map(math.log, sp)) / len(sp)) if sp else None
    goal = (f"tunedb / torchao: geomean {f(gm, '.2f')} (goal >= 1.1), min {f(min(sp) if sp else None, '.2f')} "
            f"(goal >= 0.99) over {len(sp)} of {len(rows)} cases")
    served = served_configs(ours)
    print("\nserved (signature, M: config [tier]):\n" + "\n".join(f"- {line}" for line in served))
    report = tunedb.tuning_report()
    print(f"\n{goal}\n\n{report}")
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "torchao": __import__("torchao").__version__, "wall_s": round(time.monotonic() - t0, 1),
           "command": " ".join(sys.argv)}
    Path(args.out).write_text(json.dumps({"env": env, "rows": rows, "goal": goal, "report": report,
                                          "served": served}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
