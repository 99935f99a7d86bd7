"""Worked example of the cutoff recipe (issue 21): a batched receding-horizon controller.

    PYTHONPATH=src python bench/cutoff_mpc.py --out cutoff_mpc.json [--png cutoff_mpc.png]
        [--device cuda|cpu] [--quick] [--stat mean|p99|max] [--tol 0.02] [--config PATH]

A batch of linear plants x+ = A x + B u + w (A: random lightly damped oscillators, B random)
tracks a drifting reference with an MPC of horizon T (cost sum |x_t - r_t|_Q^2 + |u_t|_R^2).
Each control step solves the dual of the QP: the Schur complement S lambda = b is SPD and block
tridiagonal (D_0 = Q^-1 + B R^-1 B^T, D_t = D_0 + A Q^-1 A^T, L_t = -A Q^-1, R_t = L_{t+1}^T;
b_0 = r_1 - A x_0, b_t = r_{t+1} - A r_t), stored once as the [L|D|R] strip. The first input
u_0 = R^-1 B^T lambda_0 is applied, the disturbance w arrives, and the next solve warm-starts
from the last lambda (the loop holds setpoints: at rest the last plan is the next one; a
shifted plan's tail would be wrong even at rest). The disturbance level drifts (slowly through
calm and gusty spells, seeded, identical in every run). The switching signal is the caller's estimate of the
warm start's error (the relative change of the right-hand side, which the disturbance and the
state's recovery drive): a calm step leaves the warm start nearly right (few PCG iterations), a
gust spoils it (many); the direct solver's cost is flat.

The run: probe (direct, iterative) -> fit (the chosen statistic; band; center) -> persist
(the user's configuration, or --config) -> a comparison run -> a second probe and fit (is its
cutoff inside the first band?). The comparison run is ONE control loop in which every step's
system is solved by direct, iterative and auto (the persisted decision, read back) in turn, the
order rotating per step and the GPU idle before each solve (a synchronize outside the timed
region, as the signal's host read does in a probe); the loop goes on from auto's solution. The
goals are judged on it: separately run probes drift (session 10 C on the H200: auto's probe ran
the same direct solves as the first probe at 0.66 ms for its first 100 steps, then 0.71 ms, and
the second probe's direct solves stayed at 0.72 ms: a clock step between runs, not auto's own
work, which is one float comparison per solve, Decision.policy_for, on the host, untimed
before the launch), and a drift of a few percent is the size of the 2% goal. The solvers are the
default kernels="auto": on the GPU the fused Triton solvers (one kernel for direct; two launches
for PCG, whose loop leaves on the device per system: check_every is ignored there, so the
default is None). Also timed, for scale: the direct solver composed from plain torch.linalg ops
(kernels="torch"). Prints a table (mean, p99, max per policy), checks the issue's goals, writes
JSON (--out) and a PNG (--png, default beside --out) of per-solve time against the signal for
both policies with the cutoff and its band.

Why this problem (n 12, T 32, batch 512, fp32, PCG tol 1e-4, cap 200), from the measured fused
cells (bench/results/s10_C, cutoff_solvers, CUDA graphs, fp32): n 16 (n 12 pads to the same
16 x 16 tiles) at T 30, batch 256: direct 582 us, PCG 269 us at 20 iterations, so about 13 us
per iteration (x 32/30 at T 32: 14 us); 512 systems are still one wave for both kernels (direct:
one program per system; PCG: 4 programs per SM, 528 slots), so the times carry over: direct about
0.62 ms. In the loop each solve also pays its launches from an idle GPU (the signal's host read):
the s10_C traces show direct 0.64-0.68 ms flat and PCG 0.17 ms at zero iterations (signal under
the tolerance), so PCG costs about 0.17 + 0.014 k ms for k iterations and breaks even at about
(0.65 - 0.17) / 0.014 = 34 iterations. Calm steps (disturbance 1e-5, signal below 1e-3) need
0-20 iterations: 0.17-0.45 ms, iterative 30-75% faster; gusts (disturbance near 1, signal near
1) need 80-105: 1.3-1.65 ms, direct 2-2.5x faster. The 500-step loop spends about half its steps
on each side (two calm and two gusty spells). Predicted per policy: direct mean about 0.66 ms, p99 about 0.71;
iterative mean about 0.8, p99 about 1.6; auto (iterative below the cutoff, about 48% of steps)
mean about 0.51, p99 about 0.71 (the gust solves, which it runs direct): better than both on the
mean, within 2% of direct on the p99. Refitting the session 10 C traces with the mean gives
exactly that (cutoff 4.4e-3, band [1.5e-3, 1.3e-2]; the second probe's cutoff 3.9e-3).

The statistic is the mean (throughput; --stat). The p99 is the wrong fit target here: it is set
by the gust solves, which every good policy runs direct, so it is flat (within 2%) from no
iterative solve at all up to the crossover; the fit's band is then open below and its center
falls under every observed signal (session 10 C: cutoff 1.9e-7, auto ran direct on every
solve). Fitting the mean puts the cutoff at the crossover, and the p99 follows.

Expected run time: H200 about 15-30 s (6 runs of the 500-step loop, one of them solving each
step three times; the composed torch.linalg run the slowest; Triton compiles at first call);
--device cpu --quick under a minute.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

CONFIGS = {  # batch, state n, inputs m, horizon T, control steps
    "full": dict(batch=512, n=12, m=4, horizon=32, steps=500),
    "quick": dict(batch=8, n=4, m=2, horizon=8, steps=60),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON results path")
    p.add_argument("--png", default=None, help="plot path (default: --out with .png)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="small configuration (CPU test of the flow)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp64"))
    p.add_argument("--stat", default="mean", choices=("mean", "p99", "max"))
    p.add_argument("--tol", type=float, default=0.02, help="band tolerance (relative)")
    p.add_argument("--solve-tol", type=float, default=None, help="PCG relative residual (default 1e-4 fp32, 1e-8 fp64)")
    p.add_argument("--max-iter", type=int, default=200)
    p.add_argument("--check-every", type=int, default=None,
                   help="composed PCG only: host check every k iterations (the fused PCG exits on the device)")
    p.add_argument("--steps", type=int, default=None, help="control steps per run")
    p.add_argument("--config", default=None, help="decision file (default: the user's configuration)")
    p.add_argument("--allow-busy", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


class Plant:
    """The batch of plants, the MPC's strip, and the seeded disturbance schedule."""

    def __init__(self, batch, n, m, horizon, steps, dtype, device, seed):
        import torch

        g = torch.Generator().manual_seed(seed)
        f64 = torch.float64
        theta = 0.05 + 0.25 * torch.rand(batch, n // 2, generator=g, dtype=f64)
        a = torch.zeros(batch, n, n, dtype=f64)
        for k in range(n // 2):  # lightly damped rotations, a little coupling
            c, s = torch.cos(theta[:, k]) * 0.9, torch.sin(theta[:, k]) * 0.9
            i = 2 * k
            a[:, i, i], a[:, i, i + 1], a[:, i + 1, i], a[:, i + 1, i + 1] = c, -s, s, c
        a += 0.02 * torch.randn(batch, n, n, generator=g, dtype=f64)
        b = torch.randn(batch, n, m, generator=g, dtype=f64) / math.sqrt(n)
        q, r = 1.0, 0.1
        qi = torch.eye(n, dtype=f64) / q
        d0 = qi + b @ b.mT / r
        diag = d0.unsqueeze(1).repeat(1, horizon, 1, 1)
        diag[:, 1:] += (a @ a.mT / q).unsqueeze(1)
        low = (-a / q).unsqueeze(1).repeat(1, horizon - 1, 1, 1)
        from tunedb.cutoff import layout

        self.strip = layout.from_blocks(diag, low).to(device=device, dtype=dtype)
        self.a, self.bu = a.to(device=device, dtype=dtype), (b / r).to(device=device, dtype=dtype)
        self.b = b.to(device=device, dtype=dtype)
        self.batch, self.n, self.horizon, self.steps = batch, n, horizon, steps
        self.dtype, self.device = dtype, device
        phase = 2 * math.pi * torch.rand(batch, n, generator=g, dtype=f64)
        self.phase, self.omega = phase.to(device=device, dtype=dtype), 0.0  # setpoints
        # the disturbance level drifts through calm (1e-5) and gusty (1) spells, two cycles a run,
        # longer calm than gusts
        k = torch.arange(steps, dtype=f64)
        level = -5.0 + 5.0 * (0.5 - 0.5 * torch.cos(4 * math.pi * k / steps)) ** 2 + 0.4 * torch.randn(steps, generator=g, dtype=f64)
        self.levels = [float(10 ** min(0.0, max(-5.5, v))) for v in level.tolist()]
        self.noise = torch.randn(steps, batch, n, generator=g, dtype=f64).to(device=device, dtype=dtype)
        self.x0 = torch.randn(batch, n, generator=g, dtype=f64).to(device=device, dtype=dtype)
        self.x0 = self.settle(150)

    def settle(self, steps):
        """The closed loop's rest state: `steps` undisturbed steps from x0 (the loop then starts
        at rest, so calm steps really leave the last plan right)."""
        from tunedb.cutoff import solvers

        x = self.x0
        for k in range(steps):
            lam = solvers.direct(self.strip, self.rhs(k, x), kernels="torch")[0]
            x = self.step(x, lam, 0.0, None)
        return x

    def step(self, x, lam, level, noise):
        u = (self.bu.mT @ lam[:, 0].unsqueeze(-1)).squeeze(-1)
        x = (self.a @ x.unsqueeze(-1)).squeeze(-1) + (self.b @ u.unsqueeze(-1)).squeeze(-1)
        return x if noise is None else x + level * noise

    def reference(self, k):
        import torch

        t = torch.arange(k, k + self.horizon + 1, device=self.device, dtype=self.dtype)
        return torch.sin(self.omega * t[None, :, None] + self.phase[:, None, :])  # [batch, T+1, n]

    def rhs(self, k, x):
        ref = self.reference(k)
        ar = (self.a.unsqueeze(1) @ ref.unsqueeze(-1)).squeeze(-1)  # A r_t
        b = ref[:, 1:] - ar[:, :-1]
        b[:, 0] = ref[:, 1] - (self.a @ x.unsqueeze(-1)).squeeze(-1)
        return b

    def workload(self, solver, steps=None):
        """The control loop: one solve per step, warm-started from the last solution. The signal
        is the caller's estimate of the warm start's error, max over the batch of
        ||b_k - b_{k-1}|| / ||b_k|| (the last lambda solved b_{k-1}, so this IS its relative
        residual here; one host read per step, outside the timed solve)."""
        x, lam, b_prev = self.x0.clone(), None, None
        for k in range(self.steps if steps is None else steps):
            b = self.rhs(k, x)
            change = 1.0 if b_prev is None else float(
                ((b - b_prev).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1)).max())
            if not math.isfinite(change):  # max(1e-12, nan) is 1e-12: a diverged loop would hide
                raise RuntimeError(f"control step {k}: the right-hand side is not finite (signal {change}); "
                                   "the last solve diverged")
            signal = max(1e-12, change)
            lam = solver(self.strip, b, lam, signal=signal)
            b_prev = b
            x = self.step(x, lam, self.levels[k], self.noise[k])


class Interleaved:
    """The comparison run's solver: each step's system solved by every recorder in turn (the
    order rotating per step, the GPU idle before each solve: a synchronize outside the timed
    region, as a probe's signal read does), so drift between runs falls on every policy alike.
    The loop goes on from `follow`'s solution."""

    def __init__(self, recorders, follow, cuda):
        self.recorders, self.follow, self.cuda, self.k = list(recorders), follow, cuda, 0

    def __call__(self, strip, b, x0=None, *, signal):
        import torch

        out, n = {}, len(self.recorders)
        for i in range(n):
            rec = self.recorders[(self.k + i) % n]
            if self.cuda:
                torch.cuda.synchronize()
            out[rec.policy] = rec(strip, b, x0, signal=signal)
        self.k += 1
        return out[self.follow]


_PLANTS = {}


def workload(solver):
    """The example's loop for `tunedb cutoff probe --workload bench/cutoff_mpc.py:workload`: the
    full configuration in fp32 on the GPU when there is one, else the quick one on the CPU (the
    device must match the probe's --device)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in _PLANTS:
        cfg = CONFIGS["full" if device == "cuda" else "quick"]
        _PLANTS[device] = Plant(**cfg, dtype=torch.float32, device=device, seed=0)
    _PLANTS[device].workload(solver)


def summarize(trace):
    from tunedb.cutoff import fitting as fit

    t = trace.times_ms
    return {"mean_ms": fit.stat_of(t, "mean"), "p99_ms": fit.stat_of(t, "p99"), "max_ms": fit.stat_of(t, "max"),
            "solves": len(t)}


def plot(path, probe1, fit1, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for pol, color in (("direct", "tab:blue"), ("iterative", "tab:orange")):
        tr = probe1.traces[pol]
        ax.scatter(tr.signals, tr.times_ms, s=6, alpha=0.6, color=color, label=pol)
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()  # an open band (one policy everywhere) is drawn to the plot's edge
    ax.axvspan(max(fit1.band[0], lo), min(fit1.band[1], hi), color="green", alpha=0.12, label="band")
    ax.set_xlim(lo, hi)
    ax.axvline(fit1.cutoff, color="green", lw=1.5, label=f"cutoff {fit1.cutoff:.3g}")
    ax.set_xlabel("switching signal (warm-start error estimate)")
    ax.set_ylabel("solve time (ms)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    import torch

    from tunedb.cutoff import fitting as fitmod
    from tunedb.cutoff import probing as probemod
    from tunedb.cutoff import store

    if args.device == "cuda" and not torch.cuda.is_available():
        print("cutoff_mpc: no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    cfg = dict(CONFIGS["quick" if args.quick else "full"])
    if args.steps:
        cfg["steps"] = args.steps
    dtype = torch.float32 if args.dtype == "fp32" else torch.float64
    plant = Plant(**cfg, dtype=dtype, device=args.device, seed=args.seed)
    problem = f"mpc|{store.problem_class(plant.strip)}"
    solve_tol = args.solve_tol or (1e-4 if args.dtype == "fp32" else 1e-8)
    kw = dict(tol=solve_tol, max_iter=args.max_iter, check_every=args.check_every)
    t0 = time.perf_counter()
    for pol in ("direct", "iterative"):  # warm-up: compiles, first-call resolution
        plant.workload(probemod.Recorder(pol, args.device, **kw), steps=20)
    common = dict(problem=problem, device=args.device, allow_busy=args.allow_busy, **kw)
    p1 = probemod.probe(plant.workload, policies=("direct", "iterative"), **common)
    f1 = fitmod.fit(p1, statistic=args.stat, tolerance=args.tol, scale="log")
    decision = store.persist(f1, p1, path=args.config)
    persisted = store.lookup(problem, p1.device, args.config)  # what linsys="auto" reads back
    recs = [probemod.Recorder(pol, args.device, persisted if pol == "auto" else None, **kw)
            for pol in ("direct", "iterative", "auto")]
    plant.workload(Interleaved(recs, "auto", args.device == "cuda"))
    pa = probemod.Probe(problem, p1.device, p1.timer, {r.policy: r.trace(3) for r in recs}, p1.provenance)
    p2 = probemod.probe(plant.workload, policies=("direct", "iterative"), **common)
    f2 = fitmod.fit(p2, statistic=args.stat, tolerance=args.tol, scale="log")
    pt = probemod.probe(plant.workload, policies=("direct",), kernels="torch", **common)
    wall = time.perf_counter() - t0

    rows = {"direct": summarize(pa.traces["direct"]), "iterative": summarize(pa.traces["iterative"]),
            "auto": summarize(pa.traces["auto"]), "direct(torch.linalg)": summarize(pt.traces["direct"])}
    separate = {f"{pol} (probe {i})": summarize(p.traces[pol]) for i, p in ((1, p1), (2, p2))
                for pol in ("direct", "iterative")}
    auto_share = sum(1 for s in pa.traces["auto"].signals if persisted.policy_for(s) == "iterative")
    rows["auto"]["iterative_share"] = auto_share / max(len(pa.traces["auto"].signals), 1)
    print(f"cutoff_mpc on {p1.device} ({args.dtype}, batch {cfg['batch']}, n {cfg['n']}, T {cfg['horizon']}, "
          f"{cfg['steps']} steps), statistic {args.stat}, tolerance {args.tol:.0%}")
    print("one interleaved run (the goals are judged on it):")
    print(f"{'policy':<22}{'mean ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for name, r in rows.items():
        print(f"{name:<22}{r['mean_ms']:>10.4f}{r['p99_ms']:>10.4f}{r['max_ms']:>10.4f}")
    print("the separately run probes (the fits' input; drift between runs shows here):")
    for name, r in separate.items():
        print(f"{name:<22}{r['mean_ms']:>10.4f}{r['p99_ms']:>10.4f}{r['max_ms']:>10.4f}")
    best = {s: min(rows["direct"][s], rows["iterative"][s]) for s in ("mean_ms", "p99_ms")}
    goals = {
        "auto_within_2pct_mean": rows["auto"]["mean_ms"] <= 1.02 * best["mean_ms"],
        "auto_within_2pct_p99": rows["auto"]["p99_ms"] <= 1.02 * best["p99_ms"],
        "auto_beats_direct_on_one": any(rows["auto"][s] < rows["direct"][s] for s in best),
        "auto_beats_iterative_on_one": any(rows["auto"][s] < rows["iterative"][s] for s in best),
        "second_cutoff_in_first_band": fitmod.within_band(f2.cutoff, f1.band),
    }
    print(f"fit 1: cutoff {f1.cutoff:.4g} band [{f1.band[0]:.4g}, {f1.band[1]:.4g}] ({f1.pairing} pairing); "
          f"fit 2: cutoff {f2.cutoff:.4g} band [{f2.band[0]:.4g}, {f2.band[1]:.4g}]")
    print(f"auto ran iterative on {rows['auto']['iterative_share']:.0%} of solves; "
          f"direct(fused) vs direct(torch.linalg), eager: {rows['direct(torch.linalg)']['mean_ms'] / rows['direct']['mean_ms']:.2f}x on the mean")
    for g, ok in goals.items():
        print(f"  goal {g}: {'PASS' if ok else 'FAIL'}")
    print(f"decision persisted to {args.config or store.config_path()}; wall {wall:.1f} s")
    out = Path(args.out)
    png = Path(args.png) if args.png else out.with_suffix(".png")
    plot(png, p1, f1, f"{problem} on {p1.device}: {args.stat} cutoff")
    doc = {"config": cfg, "args": vars(args), "rows": rows, "rows_separate_probes": separate, "goals": goals,
           "fit1": f1.to_json(), "fit2": f2.to_json(), "decision": decision.to_json(), "wall_s": wall, "png": str(png),
           "probes": {"first": p1.to_json(), "interleaved": pa.to_json(), "second": p2.to_json(), "torch": pt.to_json()}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
