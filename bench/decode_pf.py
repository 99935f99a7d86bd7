"""Does prefetching the weight into L2 before gdc_wait pay? The decode lane's `_pf{P}` configs side
by side with cuBLAS, the old lane's best PDL config and a pure read, in one H200 run.

    PYTHONPATH=src python bench/decode_pf.py --out decode_pf.json [--quick]
        [--shapes 4096x4096,...] [--ms 1,16] [--budget-s 80] [--no-chain]

Per weight (default: the Llama-3-8B decode GEMMs o 4096x4096, fused qkv 6144x4096, gate/up
14336x4096, fused gate+up 28672x4096, down 4096x14336, LM head 128256x4096) and M (1, 16): a
CUDA graph of 8 back-to-back calls of one arm on 8 rotating cold copies of the weight (median of
7 replays, per call), for (a) cuBLAS (F.linear), (b) the old lane's PDL configs (decode_limit's
session-9 winners; best per point reported), (c) every `_pf` config of configs_decode.pf_grid()
with and without PDL (--quick: the PDL twins and 3 non-PDL ones) two `_pfn` (normal-priority
prefetch) and three `_pfw` (dependents launched after the wait, not first) PDL configs, (d) a pure read of the weight
(bench/read_roofline.py, quick sweep, PDL read arms included, and torch.sum). Every lane arm is
checked against the fp32 reference before it is timed (a failure is listed, not timed). Back to
back, a `_pdl` arm overlaps its predecessor (a copy of itself on another weight): that is what the
prefetch is for. Then the Llama layer chain (qkv, o, gate_up, down over 4 cold layers, M = 1 and
16; o's output is gate_up's input): cuBLAS, the old best PDL, the best `_pf` PDL and non-PDL
configs per shape, and the best read per shape. Prints per point us, share of 4.3 TB/s and x
cuBLAS; per `_pf` config its geomean, worst share at M=1 and CTAs per SM (from the compiled
binary's registers and shared memory) with its grid; the goal verdicts; writes all to --out.
Expected run time on the H200: about 90-120 s (--quick about 70-90 s): ~20 s compiling ~24
binaries in parallel, ~40 s timing 12 points x ~22 arms, ~10 s the chains (--budget-s caps the
point timing; later points get less).
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
import decode_pf_summary as summ  # noqa: E402
from decode_lane_s14 import LAYER, layer_chain_timer  # noqa: E402  (one Llama layer's GEMMs, timed in order)

LLAMA = [(4096, 4096), (6144, 4096), (14336, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
COPIES = 8  # calls per chain, each on its own cold copy (>= 268 MB for a 33.6 MB weight: past 2 x L2)
OLD_PDL = ("dk8_n128x128_w8_s4_at_pdl", "dk1_n64x128_w4_s4_pdl", "dk16_n64x128_w4_s4_at_pdl",
           "dk8_n32x256_w4_s4_at_pdl", "dk8_n128x128_w8_s4_pdl", "dk1_n32x256_w4_s4_pdl", "dk1_n128x128_w8_s4_pdl")


def old_configs(quick: bool) -> list[str]:
    return list(OLD_PDL[:4] if quick else OLD_PDL)


def pf_configs(quick: bool) -> list[str]:
    from tunedb.families.gemm import configs_decode

    grid = configs_decode.pf_grid()
    plain = grid[1:4] if quick else grid  # quick: split 8 and 4 (whole run), one wave of fat CTAs
    # the normal-priority prefetch (_pfn) against evict_last at a many-CTA and a one-wave config
    normal = ["dk8_n32x256_w4_s2_pfn2_pdl", "dk2_n64x256_w4_s2_pfn8_pdl"]
    # dependents launched after the wait (_pfw): one successor prefetching ahead, not a cascade
    late = ["dk8_n32x256_w4_s2_pfw2_pdl", "dk2_n64x256_w4_s2_pfw8_pdl", "dk1_n64x256_w4_s2_pfw8_pdl"]
    return [configs_decode.pdl_twin(c).id for c in grid] + normal + late + [c.id for c in plain]


def chain_us(call, n: int | None = None) -> float:
    """Per-call microseconds of call(0) .. call(n - 1) (n: COPIES) back to back in one CUDA graph."""
    import decode_limit as dl

    n = n or COPIES

    for i in range(n):  # warm: compiles, workspaces
        call(i)
    dl._sync()
    return dl.replay_ms(call, n) * 1e3


def occupancy(cid: str, n: int, k: int, sms: int) -> dict:
    """Grid, registers, shared memory and resident CTAs per SM of `cid`'s binary at (n, k)."""
    import torch

    import decode_limit as dl
    from tunedb.families.gemm import configs_decode, kernels_decode

    sp = kernels_decode.spec(configs_decode.parse(cid))
    grid = kernels_decode.grid_of(sp, n, k)(1, sms)
    ctas = grid[0] * (grid[1] if len(grid) > 1 else 1)
    res = {"grid": ctas}
    try:
        t = torch.empty(16, device=dl.DEVICE, dtype=dl._dtype())
        f, i = torch.empty(16, device=dl.DEVICE), torch.zeros(16, device=dl.DEVICE, dtype=torch.int32)
        ck = sp.kernel.warmup(t, t, t, t, f, i, 1, n, k, 0, 0, grid=(1,), **sp.kwargs())
        ck._init_handles()
        warps, regs, smem = sp.num_warps, ck.n_regs, ck.metadata.shared
        per_warp = -(-regs * 32 // 256) * 256
        per_sm = min(65536 // (per_warp * warps), 2048 // (32 * warps), 32,
                     (228 * 1024) // (smem + 1024) if smem else 32)
        res.update(regs=regs, spills=ck.n_spills, smem=smem, ctas_per_sm=per_sm,
                   waves=round(ctas / (per_sm * sms), 2) if per_sm else None)
    except Exception as exc:  # noqa: BLE001 - the interpreter (CPU smoke) or another Triton's layout
        res["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return res


def read_arm(ws: list, sms: int) -> tuple[str, float, dict]:
    """The fastest pure read of the weight (each read config checked: it reads every element)."""
    import torch

    import decode_limit as dl
    import read_roofline as rr

    numel = ws[0].numel()
    flats = [w.view(-1) for w in ws]
    ones = torch.ones(numel, device=dl.DEVICE, dtype=ws[0].dtype)
    times = {}
    for cfg in rr.configs(quick=True):
        fn = rr.launcher(cfg, numel, sms, interpret=dl.DEVICE != "cuda")
        out = torch.empty(fn.grid, device=dl.DEVICE, dtype=torch.float32)
        if fn(ones, out).double().sum().item() != numel:
            continue
        times[cfg.id] = chain_us(lambda i: fn(flats[i % len(ws)], out))
    del ones
    times["torch.sum"] = chain_us(lambda i: ws[i % len(ws)].sum(dtype=torch.float32))
    best = min(times, key=times.get)
    return best, times[best], times


def point(n: int, k: int, m: int, ws: list, cids: list[str], deadline: float) -> dict:
    """cuBLAS and every lane arm at (weight, M): checked against the fp32 reference, then timed."""
    import torch
    import torch.nn.functional as F

    import decode_limit as dl
    from tunedb.arch import shipped_profile
    from tunedb.families.gemm import FAMILY

    sig = FAMILY.make_signature("gemm", dl.DT, n, k)
    x = (torch.rand(m, k, device=dl.DEVICE) * 2 - 1).to(dl._dtype())
    outs = [torch.empty(m, n, device=dl.DEVICE, dtype=dl._dtype()) for _ in range(2)]
    row = {"N": n, "K": k, "M": m, "MB": round(db.weight_bytes(n, k) / 1e6, 1), "all_us": {}, "failed": [],
           "invalid": {}, "cublas_us": chain_us(lambda i: F.linear(x, ws[i % len(ws)]))}
    ref = FAMILY.reference(sig, x, ws[0])
    rounding = (ref.to(x.dtype).float() - ref).abs().max().item()
    arch = shipped_profile("sm90")
    for cid in cids:
        if time.time() > deadline and row["all_us"]:
            row["truncated"] = True
            break
        cfg = FAMILY.parse_config(cid)
        why = FAMILY.invalid_reason(cfg, sig, m, arch)
        if why:
            row["invalid"][cid] = why
            continue
        fn = FAMILY.launcher(cfg, sig)
        outs[0].fill_(float("nan"))
        fn(x, ws[0], None, outs[0])
        err = (outs[0].float() - ref).abs().max().item()
        if not err <= 4 * rounding + 2e-3 * ref.abs().max().item():
            row["failed"].append(cid)
            continue
        # two outputs alternate, as a model's consecutive layers write different tensors
        row["all_us"][cid] = chain_us(lambda i: fn(x, ws[i % len(ws)], None, outs[i % 2]))
    return row


def measure(shapes, ms, quick: bool, budget_s: float, sms: int, skip=frozenset()) -> tuple[list, dict]:
    import torch

    import decode_limit as dl

    cids = [c for c in old_configs(quick) + pf_configs(quick) if c not in skip]
    rows, reads = [], {}
    start = time.time()
    for idx, (n, k) in enumerate(shapes):
        try:
            ws = [torch.randn(n, k, device=dl.DEVICE, dtype=dl._dtype()) * k ** -0.5 for _ in range(COPIES)]
            best, us, times = read_arm(ws, sms)
            reads[f"{n}x{k}"] = {"best": best, "us": us, "all_us": times}
            for j, m in enumerate(ms):
                left = budget_s - (time.time() - start)
                points_left = (len(shapes) - idx) * len(ms) - j
                row = point(n, k, m, ws, cids, time.time() + max(1.0, left / points_left))
                row.update(read=best, read_us=us)
                rows.append(row)
                print(summ.point_line(row) + ("  (truncated)" if row.get("truncated") else "")
                      + (f"  FAILED {row['failed']}" if row["failed"] else ""), flush=True)
        except Exception as exc:  # noqa: BLE001 - one weight failing leaves the others measured
            import traceback

            traceback.print_exc()
            reads[f"{n}x{k}"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        ws = None
        if dl.DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows, reads


def layer_chain(rows: list[dict], reads: dict, m: int, sms: int, layers: int = 4) -> dict:
    """decode_lane_s14's layer chain (a layer's four GEMMs in order over `layers` cold copies, one
    CUDA graph): us per layer for cuBLAS, the old best PDL, the best `_pf` PDL / non-PDL config per
    shape, the best read per shape."""
    by_shape = {(r["N"], r["K"]): summ.picks(r) for r in rows if r["M"] == m}
    if any((n, k) not in by_shape for _, n, k, _ in LAYER):
        return {"M": m, "error": "a layer GEMM has no measured point at this M"}
    chain = layer_chain_timer(m, layers, sms, LAYER)

    res = {"M": m, "layers": layers, "cublas_us": chain(lambda n, k: "torch"), "picks": {}}
    for kind in ("old_pdl", "pf_pdl", "pf_nopdl"):
        if all(by_shape[(n, k)][kind] for _, n, k, _ in LAYER):
            res["picks"][kind] = {f"{n}x{k}": by_shape[(n, k)][kind] for _, n, k, _ in LAYER}
            res[f"{kind}_us"] = chain(lambda n, k, kind=kind: by_shape[(n, k)][kind])
    if all(f"{n}x{k}" in reads and "best" in reads[f"{n}x{k}"] for _, n, k, _ in LAYER):
        res["picks"]["read"] = {f"{n}x{k}": reads[f"{n}x{k}"]["best"] for _, n, k, _ in LAYER}
        res["read_us"] = chain(lambda n, k: "read:" + reads[f"{n}x{k}"]["best"])
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_pf.json")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in LLAMA), help="NxK[,NxK...]")
    ap.add_argument("--ms", default="1,16", help="decode M values (each 1..16)")
    ap.add_argument("--budget-s", type=float, default=80.0, help="point timing budget; later points get less")
    ap.add_argument("--quick", action="store_true", help="4 old PDL configs; the _pf PDL twins and 3 non-PDL")
    ap.add_argument("--no-chain", action="store_true", help="skip the Llama layer chain")
    args = ap.parse_args(argv)
    try:
        shapes = db.parse_shapes(args.shapes)
        ms = db.parse_ms(args.ms, "1,16")
    except ValueError as exc:
        ap.error(str(exc))

    import torch

    if not torch.cuda.is_available():
        print("bench/decode_pf.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from decode_lane_s14 import precompile

    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    failed = precompile(old_configs(args.quick) + pf_configs(args.quick))
    occ = {c: occupancy(c, 4096, 4096, sms) for c in pf_configs(args.quick) + old_configs(args.quick) if c not in failed}
    rows, reads = measure(shapes, ms, args.quick, args.budget_s, sms, failed)
    chains = []
    if not args.no_chain:
        for m in (1, 16):
            if m not in ms:
                continue
            try:
                chains.append(layer_chain(rows, reads, m, sms))
            except Exception as exc:  # noqa: BLE001 - the point table stands without the chain
                import traceback

                traceback.print_exc()
                chains.append({"M": m, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    lines = summ.report(rows, pf_configs(args.quick) + old_configs(args.quick), occ)
    summ.report_chains(chains)
    summary = summ.summarize(rows, pf_configs(args.quick) + old_configs(args.quick))
    summary["verdicts"] = lines
    summary["seconds"] = round(time.time() - t0, 1)
    print(f"\nwall {summary['seconds']} s")
    from tunedb.database import write_atomic

    write_atomic(Path(args.out), json.dumps({"rows": rows, "reads": reads, "chains": chains, "occupancy": occ,
                                             "compile_failed": sorted(failed), "summary": summary,
                                             "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "triton": __import__("triton").__version__, "args": vars(args)},
                                            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
