"""Does the linear_rows row pass gain from the logits cuBLAS just left in L2? A probe (issue 25):
the shipped row pass's config run forward (row block i by program i, as the family does), and
the same pass walking the row blocks from the last (the rows cuBLAS wrote last, still in L2,
read first), each either into a separate output (what the build times: F.linear's logits, the
pass writing `out`) or in place (cuBLAS writing straight into `out`, as serving in place does),
beside torch's linear + log_softmax and the shipped pick, at the CTC census points with
M >= 256, in ONE run.

    PYTHONPATH=src python bench/glsm_l2.py --out DIR [--budget-s 90]

Arms (the row pass = the shipped linear_rows config at the point, else the signature's, as
bench/glsm_chunks.py's row_config), each checked against the fp32 reference first (NaN-poisoned
output, within 4x torch's error) then timed as bench/gemm_log_softmax.py times the family (a CUDA
graph of calls over head-weight copies read cold, median of 7 replays):
  torch      F.linear + torch.log_softmax (into out)
  shipped    the shipped table's pick (into out)
  sep_fwd    F.linear, the pass forward into out (the shipped linear_rows arm itself)
  sep_rev    F.linear, the pass from the last row block into out
  inp_fwd    addmm into out, the pass forward in place (bench/glsm_chunks.py's whole_s1)
  inp_rev    addmm into out, the pass from the last row block in place
The reversed passes are this probe's own copies of kernels._rows_kernel / _rows_stream_kernel
with the block order flipped (nothing in the family changes unless the probe wins).
Prints a markdown table (us and x torch per arm, the best per point) and the geomeans over the
points run, with M = 64 projected at the shipped table's evidence; writes DIR/glsm_l2.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from tunedb import families
from tunedb.database import write_atomic
from tunedb.families.gemm_log_softmax.configs import one_pass
from tunedb.families.gemm_log_softmax.launch import row_vec, rows_pass
from tunedb.families.gemm_log_softmax.launch_chunks import chunk_gemm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benches' shared modules
from gemm_log_softmax import cell, gated_times, geomean, gpu_l2, graph_us, point_inputs  # noqa: E402
from glsm_chunks import TABLE, evidence_x, pass_params, points, row_config, shipped_pick  # noqa: E402

FAM = families.get("gemm_log_softmax")
ARMS = ("shipped", "sep_fwd", "sep_rev", "inp_fwd", "inp_rev")


@triton.jit
def _rows_rev_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym, R: tl.constexpr, C: tl.constexpr,
                     ONE: tl.constexpr, VEC: tl.constexpr):
    """kernels._rows_kernel with program i on row block (blocks - 1 - i)."""
    if VEC > 1:
        N = (N // VEC) * VEC
        stride_xm = (stride_xm // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    blk = tl.num_programs(0) - 1 - tl.program_id(0)
    rows = blk * R + tl.arange(0, R)
    r_ok = rows < M
    cols = tl.arange(0, C)
    xrow = x_ptr + rows[:, None].to(tl.int64) * stride_xm
    yrow = y_ptr + rows[:, None].to(tl.int64) * stride_ym
    if ONE:
        ok = r_ok[:, None] & (cols < N)[None, :]
        v = tl.load(xrow + cols[None, :], mask=ok, other=float("-inf")).to(tl.float32)
        mx = tl.where(r_ok, tl.max(v, axis=1), 0.0)
        lse = mx + tl.log(tl.sum(tl.exp(v - mx[:, None]), axis=1))
        tl.store(yrow + cols[None, :], (v - lse[:, None]).to(y_ptr.dtype.element_ty), mask=ok)
    else:
        run_max = tl.full((R,), float("-inf"), tl.float32)
        run_sum = tl.zeros((R,), tl.float32)
        for c0 in range(0, N, C):
            ok = r_ok[:, None] & ((c0 + cols) < N)[None, :]
            v = tl.load(xrow + c0 + cols[None, :], mask=ok, other=float("-inf")).to(tl.float32)
            new_max = tl.maximum(run_max, tl.max(v, axis=1))
            safe = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - safe) + tl.sum(tl.exp(v - safe[:, None]), axis=1)
            run_max = new_max
        lse = tl.where(r_ok, run_max + tl.log(tl.where(r_ok, run_sum, 1.0)), 0.0)
        for c0 in range(0, N, C):
            ok = r_ok[:, None] & ((c0 + cols) < N)[None, :]
            v = tl.load(xrow + c0 + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            tl.store(yrow + c0 + cols[None, :], (v - lse[:, None]).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rows_stream_rev_kernel(x_ptr, y_ptr, M, N, stride_xm, stride_ym, R: tl.constexpr, C: tl.constexpr,
                            VEC: tl.constexpr):
    """kernels._rows_stream_kernel walking the row blocks from the last."""
    if VEC > 1:
        N = (N // VEC) * VEC
        stride_xm = (stride_xm // VEC) * VEC
        stride_ym = (stride_ym // VEC) * VEC
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    nb = tl.cdiv(M, R)
    cols = tl.arange(0, C)
    c_ok = cols < N
    rows = (nb - 1 - pid) * R + tl.arange(0, R)
    nxt = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :],
                  mask=((rows >= 0) & (rows < M))[:, None] & c_ok[None, :], other=float("-inf"))
    for i in range(pid, nb, G):
        rows = (nb - 1 - i) * R + tl.arange(0, R)
        r_ok = rows < M
        v = nxt.to(tl.float32)
        ahead = rows - G * R
        nxt = tl.load(x_ptr + ahead[:, None].to(tl.int64) * stride_xm + cols[None, :],
                      mask=((ahead >= 0) & (ahead < M))[:, None] & c_ok[None, :], other=float("-inf"))
        mx = tl.where(r_ok, tl.max(v, axis=1), 0.0)
        lse = mx + tl.log(tl.sum(tl.exp(v - mx[:, None]), axis=1))
        tl.store(y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :],
                 (v - lse[:, None]).to(y_ptr.dtype.element_ty), mask=r_ok[:, None] & c_ok[None, :])


def rows_pass_rev(logits, y, rows, chunk, warps, persist=None, **_):
    m, n = logits.shape
    vec = row_vec(n, logits, y)
    blocks = -(-m // rows)
    if persist:
        grid = min(blocks, persist * torch.cuda.get_device_properties(logits.device).multi_processor_count)
        _rows_stream_rev_kernel[(grid,)](logits, y, m, n, logits.stride(0), y.stride(0), R=rows, C=chunk, VEC=vec,
                                         num_warps=warps, num_stages=1)
        return
    _rows_rev_kernel[(blocks,)](logits, y, m, n, logits.stride(0), y.stride(0), R=rows, C=chunk,
                                ONE=one_pass(chunk, n), VEC=vec, num_warps=warps)


def run_point(n, k, m, l2, table):
    sig, x, w, b, ref, out, copies, weights = point_inputs("bf16", n, k, m, l2)
    pick = shipped_pick(table, sig.format(), m)
    lr = row_config(table, sig.format(), m)
    rp = pass_params(lr)
    fwd = dict(rows=rp["rows"], chunk=rp["chunk"], warps=rp["warps"], persist=rp["persist"])

    def sep(pass_fn):
        def call(w_, b_):
            logits = torch.nn.functional.linear(x, w_, b_)
            pass_fn(logits, out, **fwd)
        return call

    def inp(pass_fn):
        def call(w_, b_):
            chunk_gemm(x, w_, b_, out)
            pass_fn(out, out, **fwd)
        return call

    arms = {"torch": lambda w_, b_: FAM.launch(FAM.parse_config("torch"), sig, x, w_, b_, out=out)}
    if pick != "torch":
        arms["shipped"] = lambda w_, b_, cfg=FAM.parse_config(pick): FAM.launch(cfg, sig, x, w_, b_, out=out)
    arms.update(sep_fwd=sep(rows_pass), sep_rev=sep(rows_pass_rev), inp_fwd=inp(rows_pass), inp_rev=inp(rows_pass_rev))
    row = {"N": n, "K": k, "M": m, "copies": copies, "shipped_pick": pick, "row_pass": lr, "times_us": {},
           "errors": {}, "failed": {}}
    gated_times(row, arms, w, b, out, ref, graph_us, weights)
    row["times_us"]["linear"] = graph_us(lambda w_, b_: torch.nn.functional.linear(x, w_, b_), weights)
    t = row["times_us"]
    shipped = t.get("shipped", t["torch"] if pick == "torch" else None)
    timed = {a: t[a] for a in ARMS if a in t}
    row["best"] = min(timed, key=timed.get) if timed else None
    row["shipped_x"] = t["torch"] / shipped if shipped else None
    row["best_x"] = t["torch"] / min([*timed.values(), t["torch"]])
    return row


def markdown(rows, ev):
    head = "| N | K | M | logits MB | torch us | " + " | ".join(ARMS) + " | best | best x torch | best x shipped |"
    lines = [head, "|" + "---|" * (9 + len(ARMS) - 1)]
    for r in rows:
        t = r["times_us"]
        arms = " | ".join(f"{cell(t.get(a), '.1f')} ({cell(t['torch'] / t[a] if a in t else None)})" for a in ARMS)
        sh = t.get("shipped", t["torch"])
        lines.append(f"| {r['N']} | {r['K']} | {r['M']} | {r['M'] * r['N'] * 2 / 1e6:.1f} | {t['torch']:.1f} | {arms} "
                     f"| {r['best']} | {cell(r['best_x'])} | {cell(sh / t[r['best']] if r['best'] else None)} |")
    for r in rows:
        for name, why in r["failed"].items():
            lines.append(f"- failed {r['N']}x{r['K']} M={r['M']} {name}: {why}")
    arm_x = {a: geomean([r["times_us"]["torch"] / r["times_us"][a] for r in rows if a in r["times_us"]]) for a in ARMS}
    lines.append("")
    lines.append(f"geomean over {len(rows)} points (x torch): " + ", ".join(f"{a} {v:.3f}" for a, v in arm_x.items())
                 + f", best of all {geomean([r['best_x'] for r in rows]):.3f}")
    proj = [r["best_x"] for r in rows] + list(ev.values())
    shp = [r["shipped_x"] for r in rows] + list(ev.values())
    lines.append(f"projection over {len(proj)} census points (M = 64 at the table's evidence): shipped "
                 f"{geomean(shp):.3f}x, best of all {geomean(proj):.3f}x")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="a directory for glsm_l2.json, or a path ending .json")
    ap.add_argument("--budget-s", type=float, default=90.0, help="stop starting new points after this")
    ap.add_argument("--table", default=str(TABLE))
    args = ap.parse_args()
    gpu = gpu_l2()
    if gpu is None:
        return 2
    sm90, l2 = gpu
    table = json.loads(Path(args.table).read_text())
    out = Path(args.out)
    path = out if out.suffix == ".json" else out / "glsm_l2.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    ev = evidence_x(table)
    t0 = time.monotonic()
    rows, skipped = [], []
    for n, k, m in points():
        if m == 2048:  # not a census point
            continue
        if time.monotonic() - t0 > args.budget_s:
            skipped.append((n, k, m))
            continue
        rows.append(run_point(n, k, m, l2, table))
        r = rows[-1]
        print(f"[{time.monotonic() - t0:6.1f}s] N={n} M={m}: " + ", ".join(
            f"{a} {r['times_us']['torch'] / v:.3f}" for a, v in r["times_us"].items() if a != "linear"),
            file=sys.stderr, flush=True)
        env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
               "wall_s": round(time.monotonic() - t0, 1), "command": " ".join(sys.argv), "skipped": skipped,
               "evidence_x_m64": ev}
        write_atomic(path, json.dumps({"env": env, "rows": rows}, indent=1) + "\n")
    print(markdown(rows, ev))
    print(f"\nwall {time.monotonic() - t0:.1f} s; skipped (budget): {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
