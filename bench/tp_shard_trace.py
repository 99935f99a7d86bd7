"""Where a served layer's eager excess goes in a tensor-parallel shard's decode step
(bench/tp_shard_model.py): session 43 call 1 measured the shard's step 7.5% slower than plain
eagerly with only its four served q_proj layers swapped, while one served call costs +1.3 us over
nn.Linear in a loop of its own (bench/linear_host_cost.py --served).

    PYTHONPATH=src:bench python bench/tp_shard_trace.py [--tp 4] [--batch 1]

Three variants of the shard (plain; tunedb.optimize() with TUNEDB_SIBLINGS=0, so only the served
q_proj layers are swapped; the same with those layers running F.linear): (1) per-forward wall
times, paired rounds; (2) the host time inside each q_proj call, timed in place (perf_counter_ns
around the module's call, the wrapper's own cost the same in every variant); (3) torch.profiler's
CPU-side table over 30 eager forwards (CUDA runtime and driver calls included: a synchronising
call or an allocation would show there). Expected: about 30 s.
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import time

import torch
from tp_shard_model import WIDTH, build


def _timed_calls(module, sink):
    call = module.forward

    def forward(x):
        t0 = time.perf_counter_ns()
        y = call(x)
        sink.append(time.perf_counter_ns() - t0)
        return y

    module.forward = forward


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    import tunedb
    from tunedb import settings
    from tunedb.runtime import selector

    with settings.override(USER_DB="off", SIBLINGS="0"), torch.no_grad():
        selector.reload()
        plain = build(4, a.tp)
        served = tunedb.optimize(copy.deepcopy(plain))
        as_linear = tunedb.optimize(copy.deepcopy(plain))
        for m in as_linear.modules():
            if type(m).__name__ == "TunedLinear":
                m.__dict__["_as_written"] = True
        models = {"plain": plain, "served": served, "served as F.linear": as_linear}
        print("swapped:", {k: sorted({type(m).__name__ for m in v.modules()} - {"Sequential", "ShardBlock"})
                           for k, v in models.items()})
        x = torch.randn(a.batch, 1, WIDTH, device="cuda", dtype=torch.bfloat16)
        for m in models.values():
            for _ in range(20):
                m(x)
        per = {k: [] for k in models}
        rng = random.Random(0)
        for _ in range(9):
            plan = list(models)
            rng.shuffle(plan)
            for k in plan:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    models[k](x)
                torch.cuda.synchronize()
                per[k].append((time.perf_counter() - t0) / a.calls * 1e6)
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, tp={a.tp}, batch {a.batch}")
        for k, v in per.items():
            print(f"  {k}: {statistics.median(v):.1f} us per eager forward")
        sinks = {k: [] for k in models}
        for k, m in models.items():
            for blk in m:
                _timed_calls(blk.q_proj, sinks[k])
        for _ in range(3):
            for k, m in models.items():
                for _ in range(a.calls // 2):
                    m(x)
                torch.cuda.synchronize()
        for k, v in sinks.items():
            v = v[len(v) // 3:]
            print(f"  q_proj host time in place, {k}: median {statistics.median(v) / 1e3:.2f} us, "
                  f"p90 {sorted(v)[int(0.9 * len(v))] / 1e3:.2f} us over {len(v)} calls")
        from torch.profiler import ProfilerActivity, profile

        for k, m in models.items():
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(30):
                    m(x)
                torch.cuda.synchronize()
            print(f"\n== {k}: torch.profiler, 30 eager forwards, by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=48))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
