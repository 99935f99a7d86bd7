"""Host time per eager call of one Linear, as a model issues it: nn.Linear against what optimize()
puts in its place when no table names the key (a sibling left as written: a TunedLinear marked
_as_written that asks its group whether to launch, then runs F.linear), and F.linear alone.

    PYTHONPATH=src python bench/linear_host_cost.py [--rows 1,16,512] [--calls 2000] [--rounds 9] [--pieces]

A small weight (256 x 256 bf16), so the GPU never sets the pace: each round times --calls calls
back to back with perf_counter (no synchronisation inside), the variants in shuffled order per
round; the table shows the median over rounds of us per call and the difference to nn.Linear.
--pieces adds the member's path taken apart (session 41 found the member +1.4-2.6 us a call over
nn.Linear on the device hosts while the same Python path is 0.3 us cheaper on a CPU host): its
forward called directly (no Module.__call__), a TunedLinear marked as written with no group
(the forward's preamble alone), the group's may_take alone, nn.Linear's forward directly, and the
two capture questions (the driver's, the current stream's raw handle) alone.
--group (session 42) times the three members of a q/k/v group called in turn, per call: as three
nn.Linear, left as written (the eager rule declines), and grouped eagerly (a group whose may_take
says yes to every call: one launch at the first call, the others read its outputs; what the eager
rule would cost if it took these calls).
Expected: about 10 s (20 s with --pieces, 30 s with both).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,512")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--pieces", action="store_true")
    ap.add_argument("--group", action="store_true",
                    help="also the three members called in turn: as nn.Linear, left as written, grouped eagerly "
                         "(a group that takes every call: one launch for the three)")
    ap.add_argument("--served", action="store_true",
                    help="also a Linear whose key the shipped table serves with a Triton config (fp16 512x2048, "
                         "gv1_n8x512_w4_s5_lr at 1-3 rows) against nn.Linear of the same weight: the Triton launch's host cost")
    ap.add_argument("--device", default="cuda", help="cpu runs the script's own check (the member exits at is_cuda)")
    args = ap.parse_args(argv)
    import torch
    from torch import nn

    from tunedb.families.gemm import siblings
    from tunedb.families.gemm.patching import TunedLinear

    torch.set_grad_enabled(False)
    dev, dt = args.device, torch.bfloat16
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    plain = [nn.Linear(256, 256).to(dev, dt) for _ in range(3)]
    members, group = _grouped(plain, TunedLinear, siblings)
    lin0, mem0 = plain[0], members[0]
    eager_members, eager_group = _grouped(plain, TunedLinear, siblings)
    eager_group.may_take = lambda x: True  # every call taken, as inside a capture (the eager rule declines it)
    alone = TunedLinear(plain[0])
    alone.__dict__["_as_written"] = True  # no _siblings: the forward's checks, then F.linear
    print(f"{torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}, torch {torch.__version__}; us per eager call (median of "
          f"{args.rounds} rounds of {args.calls})")
    names = ["F.linear", "nn.Linear", "as written"]
    if args.pieces:
        names += ["nn.Linear.forward", "member.forward", "no group", "may_take", "driver query", "stream query"]
    if args.group:  # per call of the three (their sum / 3), so the columns compare
        names += ["3 nn.Linear / 3", "3 as written / 3", "3 grouped / 3"]
    print(" ".join(f"{'rows':>5}" if i < 0 else f"{n:>17}" for i, n in enumerate([None] + names, -1))
          + f" {'as written - nn.Linear':>23}")
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, 256, device=dev, dtype=dt)
        variants = {"F.linear": lambda: torch.nn.functional.linear(x, lin0.weight, lin0.bias),
                    "nn.Linear": lambda: lin0(x), "as written": lambda: mem0(x)}
        if args.pieces:
            variants.update({"nn.Linear.forward": lambda: lin0.forward(x), "member.forward": lambda: mem0.forward(x),
                             "no group": lambda: alone(x)})
            # may_take is asked with CUDA tensors only (a CPU build cannot ask about capture)
            variants["may_take"] = (lambda: group.may_take(x)) if dev == "cuda" else (lambda: None)
            # the capture question two ways: the driver's (cudaStreamIsCapturing) and the current
            # stream's raw handle (0: the default stream, never capturing), what may_take asks first
            cap = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            variants["driver query"] = cap if dev == "cuda" and cap else (lambda: None)
            variants["stream query"] = (lambda: raw(0)) if dev == "cuda" and raw else (lambda: None)
        if args.group:
            p0, p1, p2 = plain
            m0, m1, m2 = members
            e0, e1, e2 = eager_members
            variants.update({"3 nn.Linear / 3": lambda: (p0(x), p1(x), p2(x)),
                             "3 as written / 3": lambda: (m0(x), m1(x), m2(x)),
                             "3 grouped / 3": lambda: (e0(x), e1(x), e2(x))})
        per = _rounds(variants, args.rounds, args.calls, sync, random.Random(rows))
        per = {k: [t / 3 for t in v] if k.startswith("3 ") else v for k, v in per.items()}
        med = {k: statistics.median(v) for k, v in per.items()}
        print(f"{rows:>5} " + " ".join(f"{med[n]:>17.2f}" for n in names)
              + f" {med['as written'] - med['nn.Linear']:>+23.2f}")
    if args.served and dev == "cuda":
        _served(args, torch, nn, TunedLinear)
    if args.group:
        print(f"the eager group launched {eager_group.launches} time(s) (0 on a CPU: it takes CUDA tensors only)")
    return 0


def _grouped(plain, tuned_cls, siblings):
    """TunedLinears of `plain` marked as written, in one q/k/v SiblingGroup: (members, group)."""
    members = [tuned_cls(lin) for lin in plain]
    group = siblings.SiblingGroup(members, ("q", "k", "v"), max_rows=16)
    for i, m in enumerate(members):
        m.__dict__["_as_written"] = True
        m.__dict__["_siblings"] = (group, i)
    return members, group


def _rounds(variants, rounds: int, calls: int, sync, rng=None) -> dict:
    """us per call of each variant, one value per round: `calls` calls back to back with no
    synchronisation inside (host time), the stream synchronised between variants; the order
    shuffled per round when an rng is given. Each variant runs once first (warm-up)."""
    for f in variants.values():
        f()
    sync()
    per = {k: [] for k in variants}
    for _ in range(rounds):
        order = list(variants)
        if rng is not None:
            rng.shuffle(order)
        for k in order:
            f = variants[k]
            t0 = time.perf_counter()
            for _ in range(calls):
                f()
            per[k].append((time.perf_counter() - t0) / calls * 1e6)
            sync()
    return per


def _served(args, torch, nn, tuned_cls) -> None:
    """nn.Linear against a TunedLinear of the same fp16 512x2048 weight, whose key the shipped sm90
    table serves with a Triton decode-lane config at 1-3 rows (the shipped tables alone: USER_DB off)."""
    import tunedb
    from tunedb import settings
    from tunedb.runtime import selector

    with settings.override(USER_DB="off"):
        selector.reload()
        lin = nn.Linear(2048, 512, bias=False).to("cuda", torch.float16)
        tl = tuned_cls(lin)
        x = torch.randn(1, 2048, device="cuda", dtype=torch.float16)
        torch.testing.assert_close(tl(x), lin(x), rtol=2e-2, atol=2e-2)
        variants = {"F.linear": lambda: torch.nn.functional.linear(x, lin.weight), "nn.Linear": lambda: lin(x),
                    "TunedLinear (Triton)": lambda: tl(x)}
        per = _rounds(variants, args.rounds, args.calls, torch.cuda.synchronize)
        report = tunedb.tuning_report()
    print("served key, 1 row, fp16 512x2048 (us per eager call): " + ", ".join(
        f"{k} {statistics.median(v):.2f}" for k, v in per.items()))
    print(f"  {str(report)[:400]}")


if __name__ == "__main__":
    sys.exit(main())
