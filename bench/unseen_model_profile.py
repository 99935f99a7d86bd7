"""Where an optimize()d model's eager host time goes on keys the tables never measured: per-call
host microseconds of one Linear (nn.Linear vs TunedLinear, each key shape of bench/unseen_model.py's
decoder) and cProfile's top functions over eager forwards of the optimized decoder.

    PYTHONPATH=src python bench/unseen_model_profile.py

Host time per call: perf_counter around blocks of calls, the stream synchronised every 32 calls
(bench/op_host_cost.timed), median over blocks.
"""
from __future__ import annotations

import copy
import cProfile
import io
import pstats
import statistics
import time

import torch
import unseen_decoder as um
from op_host_cost import timed


def main() -> None:
    import tunedb
    from tunedb import settings
    from tunedb.runtime import selector

    with settings.override(USER_DB="off"), torch.no_grad():
        selector.reload()
        plain = um.build(1)
        tuned = tunedb.optimize(copy.deepcopy(plain))
        x = torch.randn(1, 1, um.WIDTH, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(1, 1, um.FFN, device="cuda", dtype=torch.bfloat16)
        print("| module | plain us | tunedb us | tunedb type |")
        print("|---|---|---|---|")
        for name in ("q", "k", "o", "mlp.gate", "mlp.down"):
            p, t = plain[0].get_submodule(name), tuned[0].get_submodule(name)
            inp = h if name == "mlp.down" else x
            for f in (p, t):
                for _ in range(20):
                    f(inp)
            hp = statistics.median(timed(lambda: p(inp), 2000))
            ht = statistics.median(timed(lambda: t(inp), 2000))
            print(f"| {name} | {hp:.2f} | {ht:.2f} | {type(t).__name__} act={getattr(t, 'act', '-')} |")
        gemm_only = tunedb.optimize(copy.deepcopy(plain), families=["gemm"])
        variants = {"plain": plain, "optimize()": tuned, "optimize(families=['gemm'])": gemm_only}
        print("\n| variant | host us / forward | wall us / forward |")
        print("|---|---|---|")
        for name, model in variants.items():
            for _ in range(30):
                model(x)
            host = statistics.median(timed(lambda: model(x), 600))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(300):
                model(x)
            torch.cuda.synchronize()
            print(f"| {name} | {host:.1f} | {(time.perf_counter() - t0) / 300 * 1e6:.1f} |")
        print(f"bmm hooks on the optimized model: {dict(tuned._forward_pre_hooks)}")
        for _ in range(20):
            tuned(x)
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for i in range(300):
            tuned(x)
            if i % 16 == 15:
                torch.cuda.synchronize()
        pr.disable()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
        print(buf.getvalue())
        from tunedb.runtime import launch_table

        for key, bound in list(launch_table._calls.items())[:12]:
            print(key[:2], tuple(key[2]), bound.config.id, bound.tier, "direct" if bound.direct is not None else "call",
                  type(bound.call).__name__, getattr(bound.call, "__qualname__", ""))


if __name__ == "__main__":
    main()
