"""Decode GEMV with more of its weight requested before `gdc_wait` (issue 18's 85% share goal).

    PYTHONPATH=src python bench/gv_prefetch.py --out gv_prefetch.json [--quick]   # ~60 s on an H200

Session 33 (bench/decode_chain.py) measured, back to back in one CUDA graph with cold weights, that
a pure read which loads half its bytes before `gdc_wait` moves 92-98% of 4.3 TB/s at 16.8-33.6 MB,
while the family's `gv` `_pdl` twin, which loads one W tile per CTA before the wait, moves 65-80%.
The weight does not depend on the previous kernel (only x, the bias and the output do), so a GEMV
may request as much of its slab as its registers hold before it waits. This bench's kernel is the
family's `gv` (src/tunedb/families/gemm/kernels_gemv.py) with one change: its first tile is PRE
K tiles wide ([BN, PRE x BK], loaded before the wait; its product taken after the loop), SPLIT 1.
PRE = 1 is the family's `_pdl` twin. Arms per weight and M (1 and 16), each timed as
decode_chain.py times them (>= 32 calls back to back in one graph, each a cold copy):
  * torch (F.linear: cuBLAS), the family's `gv` configs without PDL;
  * `gvp{PRE}`: the bench kernel at PRE = 1, 2, 4, 8 (registers allowing) with PDL.
Every arm's output is checked against an fp32 product first (a wrong arm is reported, not timed).
Then the Llama-3-8B layer chain at M = 1 (q, k, v, o, gate, up, down as HF's Llama calls them, an
RMSNorm, SiLU-mul and residual adds written in torch between them, 4 cold layers in one graph):
torch, `gv` without PDL and `gvp` with PDL, so what the change buys where torch kernels sit between
the GEMMs (they never trigger early) is measured beside what it buys GEMM after GEMM.
Imports triton (bench only; tunedb never imports this).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import triton
import triton.language as tl

try:  # tl.extra.cuda.gdc_*: Triton 3.4+
    import triton.language.extra.cuda  # noqa: F401
except ImportError:
    pass

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import decode_chain  # noqa: E402 - bench/: the back-to-back timing and its table

PEAK_TBS = 4.3
SHAPES = ((2048, 4096), (4096, 4096), (6144, 4096), (1024, 4096), (4096, 14336), (14336, 4096), (28672, 4096))
QUICK_SHAPES = ((2048, 4096), (4096, 4096), (4096, 14336))
# (BN, BK, warps, stages, DOT): the family's winners at M=1 / M=16 (decode_chain.GV) and two more
CONFIGS = {1: ((16, 256, 4, 5, False), (8, 512, 4, 5, False), (32, 128, 4, 5, False)),
           16: ((32, 256, 4, 4, True), (16, 256, 1, 5, True), (64, 128, 4, 4, True))}
PRES = (1, 2, 4, 8)
MAX_PRE_BYTES_PER_THREAD = 512  # the pre-wait tile's share of a thread's registers (128 regs)


@triton.jit
def _row_dot(wf, x_ptr, R: tl.constexpr, M, K, k0, offs, k_ok):
    row = (R % M).to(tl.int64)
    xr = tl.load(x_ptr + row * K + k0 + offs, mask=k_ok, other=0.0)
    return tl.sum(wf * xr.to(tl.float32)[None, :], axis=1)


@triton.jit
def _fma(w, x_ptr, a0, a1, a2, a3, M, K, k0, offs, k_ok, MP: tl.constexpr):
    wf = w.to(tl.float32)
    a0 += _row_dot(wf, x_ptr, 0, M, K, k0, offs, k_ok)
    if MP > 1:
        a1 += _row_dot(wf, x_ptr, 1, M, K, k0, offs, k_ok)
    if MP > 2:
        a2 += _row_dot(wf, x_ptr, 2, M, K, k0, offs, k_ok)
        a3 += _row_dot(wf, x_ptr, 3, M, K, k0, offs, k_ok)
    return a0, a1, a2, a3


@triton.jit(do_not_specialize=("M",))  # M=1 as a constexpr would make R % M a plain int
def gvp_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BN: tl.constexpr, BK: tl.constexpr, PRE: tl.constexpr,
               MP: tl.constexpr, DOT: tl.constexpr, PDL: tl.constexpr, STAGES: tl.constexpr):
    """y[M, N] = x[M, K] @ w[N, K]^T; the first PRE x BK columns of the CTA's slab loaded before
    gdc_wait (with PDL), the rest streamed by a pipelined loop after it."""
    pid_n = tl.program_id(0)
    cols = pid_n * BN + tl.arange(0, BN)
    cols_in = (cols % N).to(tl.int64)
    rows = tl.arange(0, MP)
    row_ok = rows < M
    offs_k = tl.arange(0, BK)
    offs_p = tl.arange(0, PRE * BK)
    p_ok = offs_p < K
    w0 = tl.load(w_ptr + cols_in[:, None] * K + offs_p[None, :], mask=p_ok[None, :], other=0.0,
                 eviction_policy="evict_first")
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    w_ptrs = w_ptr + cols_in[:, None] * K + offs_k[None, :]
    k_tiles = tl.cdiv(K, BK)
    if DOT:
        x_ptrs = x_ptr + rows[:, None].to(tl.int64) * K + offs_k[None, :]
        acc = tl.zeros((MP, BN), dtype=tl.float32)
        for kt in tl.range(PRE, k_tiles, num_stages=STAGES):
            k_ok = offs_k[None, :] < K - kt * BK
            w = tl.load(w_ptrs + kt * BK, mask=k_ok, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs + kt * BK, mask=row_ok[:, None] & k_ok, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc)
        xp = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + offs_p[None, :], mask=row_ok[:, None] & p_ok[None, :],
                     other=0.0)
        acc = tl.dot(xp, tl.trans(w0), acc)
    else:
        a0 = tl.zeros((BN,), dtype=tl.float32)
        a1 = a0
        a2 = a0
        a3 = a0
        for kt in tl.range(PRE, k_tiles, num_stages=STAGES):
            kl = K - kt * BK
            w = tl.load(w_ptrs + kt * BK, mask=offs_k[None, :] < kl, other=0.0, eviction_policy="evict_first")
            a0, a1, a2, a3 = _fma(w, x_ptr, a0, a1, a2, a3, M, K, kt * BK, offs_k, offs_k < kl, MP)
        a0, a1, a2, a3 = _fma(w0, x_ptr, a0, a1, a2, a3, M, K, 0, offs_p, p_ok, MP)
        acc = tl.where(rows[:, None] == 0, a0[None, :], 0.0)
        if MP > 1:
            acc += tl.where(rows[:, None] == 1, a1[None, :], 0.0)
        if MP > 2:
            acc += tl.where(rows[:, None] == 2, a2[None, :], 0.0) + tl.where(rows[:, None] == 3, a3[None, :], 0.0)
    y_ptrs = y_ptr + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & (cols[None, :] < N))


def arm_id(cfg: tuple, pre: int, pdl: bool) -> str:
    bn, bk, warps, stages, dot = cfg
    return f"gvp{pre}_n{bn}x{bk}_w{warps}_s{stages}" + ("_mma" if dot else "") + ("_pdl" if pdl else "")


def fits(cfg: tuple, pre: int, k: int) -> bool:
    bn, bk, warps, _, _ = cfg
    return pre * bk <= k and bn * pre * bk * 2 / (32 * warps) <= MAX_PRE_BYTES_PER_THREAD


def launcher(cfg: tuple, pre: int, pdl: bool, m: int):
    bn, bk, warps, stages, dot = cfg
    mp = 16 if dot else (1 if m == 1 else 2 if m == 2 else 4)

    def call(x, w, y):
        n, k = w.shape
        kw = {"launch_pdl": True} if pdl else {}
        gvp_kernel[(triton.cdiv(n, bn),)](x, w, y, m, n, k, BN=bn, BK=bk, PRE=pre, MP=mp, DOT=dot, PDL=pdl,
                                          STAGES=stages, num_warps=warps, num_stages=stages, **kw)
        return y
    return call


def arms(m: int, k: int) -> list[tuple[str, tuple, int, bool]]:
    out = []
    for cfg in CONFIGS[m]:
        if m > 4 and not cfg[4]:
            continue
        out.append((arm_id(cfg, 1, False), cfg, 1, False))
        out += [(arm_id(cfg, p, True), cfg, p, True) for p in PRES if fits(cfg, p, k)]
    return out


def one(n: int, k: int, m: int) -> dict:
    import torch

    import decode_limit as dl
    import read_roofline as rr

    nbytes = n * k * 2
    copies = dl.copies_for(nbytes)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(copies)]
    x = (torch.rand(m, k, device="cuda") * 2 - 1).to(torch.bfloat16)
    ref = x.float() @ ws[0].float().T
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    row = {"N": n, "K": k, "M": m, "MB": round(nbytes / 1e6, 1), "copies": copies, "arms": {}}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (arm, thunk_for(w)): each weight copy's call made once, outside the timing
    timed = [("torch", lambda w: (lambda: torch.nn.functional.linear(x, w)))]
    timed += [("read:" + c.id, lambda w, cid=c.id: dl.read_call(cid, w, sms)) for c in rr.configs(quick=True) if c.pdl]
    for aid, cfg, pre, pdl in arms(m, k):
        fn = launcher(cfg, pre, pdl, m)
        try:
            got = fn(x, ws[0], out).float()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - reported per arm
            row["arms"][aid] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            continue
        err = ((got - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            row["arms"][aid] = {"error": f"wrong: relative error {err:.2e}"}
            continue
        timed.append((aid, lambda w, fn=fn: (lambda: fn(x, w, out))))
    decode_chain.time_arms(row, dict(timed), ws, nbytes)
    del ws
    torch.cuda.empty_cache()
    return row


def best(row: dict, pred) -> str | None:
    """The fastest arm's id among those `pred` admits, or None."""
    got = decode_chain.best(row, pred)
    return got[0] if got else None


KINDS = (("read _pdl", lambda a: a.startswith("read:")),
         ("gv (PRE 1, no PDL)", lambda a: a.startswith("gvp1_") and not a.endswith("_pdl")),
         ("gv _pdl (PRE 1)", lambda a: a.startswith("gvp1_") and a.endswith("_pdl")),
         ("gvp PRE 2-8 _pdl", lambda a: a.startswith("gvp") and not a.startswith("gvp1_") and a.endswith("_pdl")))


def table(rows: list[dict], m: int) -> str:
    return decode_chain.table(rows, m, KINDS)


LLAMA = {"q": (4096, 4096), "k": (1024, 4096), "v": (1024, 4096), "o": (4096, 4096),
         "gate": (14336, 4096), "up": (14336, 4096), "down": (4096, 14336)}
AFTER_GEMM = {"k", "v", "up"}  # the calls whose previous kernel is one of ours


def _pick(rows: list[dict], n: int, k: int, pred) -> str | None:
    for r in rows:
        if r["M"] == 1 and (r["N"], r["K"]) == (n, k):
            return best(r, pred)
    return None


def _parse(aid: str) -> tuple[tuple, int, bool]:
    head, rest = aid.split("_n", 1)
    pre = int(head[3:])
    bnbk, w, s, *tail = rest.split("_")
    bn, bk = (int(v) for v in bnbk.split("x"))
    return (bn, bk, int(w[1:]), int(s[1:]), "mma" in tail), pre, "pdl" in tail


# the shipped gemm table's M=1 picks at the Llama widths (session 34's rebuild) and their PDL twins
FAMILY_PICKS = {"q": "gv1_n16x256_w4_s5_lr", "k": "gv1_n8x512_w4_s5_lr", "v": "gv1_n8x512_w4_s5_lr",
                "o": "gv1_n16x256_w4_s5_lr", "gate": "gv1_n8x512_w4_s5_lr", "up": "gv1_n8x512_w4_s5_lr",
                "down": "gv1_n16x256_w4_s5_lr"}


def layer_chain(rows: list[dict], layers: int = 4, cache: int = 512, family: bool = False) -> dict:
    """Llama-3-8B decode layers at M=1 in one CUDA graph (cold: `layers` sets of weights), us a layer;
    with `family`, every GEMM through the GEMM family's launcher of FAMILY_PICKS (and `_pdl` twins)."""
    import torch
    import torch.nn.functional as F

    import decode_limit as dl

    if family:
        rows = [{"M": 1, "N": LLAMA[n][0], "K": LLAMA[n][1], "arms": {c: {"us": 1.0}, c + "_pdl": {"us": 1.0}}}
                for n, c in FAMILY_PICKS.items()]
    picks = {}
    for name, (n, k) in LLAMA.items():
        if family:
            picks[name] = (FAMILY_PICKS[name], FAMILY_PICKS[name] + "_pdl")
            continue
        nopdl = _pick(rows, n, k, lambda a: a.startswith("gvp") and not a.endswith("_pdl"))
        pdl = _pick(rows, n, k, lambda a: a.startswith("gvp") and a.endswith("_pdl"))
        if nopdl is None or pdl is None:
            return {"error": f"no measured arm for {name} {n}x{k}"}
        picks[name] = (nopdl, pdl)
    ws = [{name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for name, (n, k) in LLAMA.items()}
          for _ in range(layers)]
    kc = torch.randn(1, 8, cache, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn(1, 8, cache, 128, device="cuda", dtype=torch.bfloat16)
    g1 = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    outs = {name: torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for name, (n, _) in LLAMA.items()}

    def norm(h):
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype) * g1

    def forward(lin, x):
        for w in ws:
            h = norm(x)
            q, kk, v = lin("q", h, w), lin("k", h, w), lin("v", h, w)
            q = q.view(1, 32, 1, 128)
            kk = torch.cat([kc[:, :, 1:], kk.view(1, 8, 1, 128)], dim=2)
            v = torch.cat([vc[:, :, 1:], v.view(1, 8, 1, 128)], dim=2)
            a = F.scaled_dot_product_attention(q, kk.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
            x = x + lin("o", a.reshape(1, 4096), w)
            h = norm(x)
            x = x + lin("down", F.silu(lin("gate", h, w)) * lin("up", h, w), w)
        return x

    def lin_for(variant: str):
        fns = {}
        for name, (nopdl, pdl) in picks.items():
            use = pdl if variant == "pdl" or (variant == "pdl after ours" and name in AFTER_GEMM) else nopdl
            if family:  # the GEMM family's own launcher of a `gv` id
                from tunedb.families.gemm import FAMILY

                n, k = LLAMA[name]
                fn = FAMILY.launcher(FAMILY.parse_config(use), FAMILY.make_signature("gemm", "bf16", n, k))
                fns[name] = (lambda x, w, y, fn=fn: fn(x, w, None, y), use)
                continue
            cfg, pre, on = _parse(use)
            fns[name] = (launcher(cfg, pre, on, 1), use)

        def lin(name, h, w):
            return fns[name][0](h, w[name], torch.empty_like(outs[name]))
        return lin, {n: f[1] for n, f in fns.items()}

    x0 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    variants = {"torch": (lambda name, h, w: F.linear(h, w[name]), {})}
    for v in ("no pdl", "pdl", "pdl after ours"):
        variants[v] = lin_for(v)
    ref = forward(variants["torch"][0], x0).float()
    res = {"picks": {n: list(p) for n, p in picks.items()}, "us_per_layer": {}, "err": {}}
    for v, (lin, _) in variants.items():
        got = forward(lin, x0).float()
        res["err"][v] = ((got - ref).norm() / ref.norm()).item()
        res["us_per_layer"][v] = dl.graph_us(lambda i, lin=lin: forward(lin, x0), 1, 8) / layers
    t = res["us_per_layer"]["torch"]
    res["x_torch"] = {v: t / us for v, us in res["us_per_layer"].items()}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gv_prefetch.json")
    ap.add_argument("--quick", action="store_true", help="three weights, no layer chain")
    ap.add_argument("--family-chain", action="store_true",
                    help="only the layer chain, through the GEMM family's launchers (the table's picks and twins)")
    args = ap.parse_args()
    import torch

    t0 = time.time()
    if args.family_chain:
        chain = layer_chain([], family=True)
        print("layer chain (family launchers):", json.dumps(chain, indent=1))
        Path(args.out).write_text(json.dumps({"layer_chain_family": chain, "torch": torch.__version__}, indent=1))
        return
    rows = []
    for n, k in QUICK_SHAPES if args.quick else SHAPES:
        for m in (1, 16):
            rows.append(one(n, k, m))
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
            print(f"{n}x{k} M={m}: " + ", ".join(f"{a}={v.get('us', v.get('error'))}" for a, v in rows[-1]["arms"].items()
                                                 if not isinstance(v.get("us"), float) or True)[:900], flush=True)
    chain = {} if args.quick else layer_chain(rows)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "wall_s": round(time.time() - t0, 1),
           "timing": "back to back in one CUDA graph (decode_limit.graph_us), cold copies, median of 7 replays"}
    summary = {}
    for kind, pred in KINDS:
        shares = [r["arms"][best(r, pred)]["share"] for r in rows if r["M"] == 1 and r["MB"] >= 16 and best(r, pred)]
        summary[kind] = {"m1_share_min": min(shares) if shares else None,
                         "m1_share_median": statistics.median(shares) if shares else None}
    Path(args.out).write_text(json.dumps({"env": env, "summary": summary, "rows": rows, "layer_chain": chain}, indent=1))
    for m in (1, 16):
        print(table(rows, m) + "\n")
    print(json.dumps(summary, indent=1))
    print("layer chain:", json.dumps(chain, indent=1))
    print(env)


if __name__ == "__main__":
    main()
