"""What Dynamo's guards cost a compiled forward of a tuned model: the guard check of the forward's
first frame (the frame holding the guards on every submodule), timed alone, for the plain model,
its tunedb.optimize() copy and a second plain copy (an A/A row), all with bench/private_code.py's
code objects except the first, in one process.

    PYTHONPATH=src:bench python bench/guard_cost.py [--layers 8] [--device cuda] [--backend inductor]

A tuned layer's forward reads a few attributes a plain nn.Linear does not (its activation, its
sibling group, whether it was left as written); each read is a guard Dynamo checks at every
compiled call. This prints the number of guards of each model (Dynamo's guard log) and the
median of repeated checks (microseconds), so the per-forward host cost of those reads is a
measured number rather than a guess from the nograph bench's profile. Tiny layer widths: the
guards depend on the module tree, not on the sizes."""
from __future__ import annotations

import argparse
import copy
import logging
import statistics
import sys
import timeit


def _guard_lines(call) -> list[str]:
    """Dynamo's guard log of the compile `call` runs: one guard per line, ids and addresses masked
    (two models' guards compare as text)."""
    import re

    import torch

    lines: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    log = logging.getLogger("torch._dynamo.guards")
    handler = Grab()
    torch._logging.set_logs(guards=True)
    log.addHandler(handler)
    try:
        call()
    finally:
        log.removeHandler(handler)
        torch._logging.set_logs()
    out = []
    for line in "\n".join(lines).splitlines():
        if "+- " in line and "+- GuardManager" not in line:
            guard = line.split("+- ", 1)[1].split("  #")[0]
            out.append(re.sub(r"0x[0-9a-f]+|\d{6,}", "#", guard))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--diff", action="store_true", help="print the guards the tuned model has and the copy has not")
    a = ap.parse_args(argv)
    import torch
    from private_code import private_code
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from transformers import LlamaConfig, LlamaModel

    import tunedb

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=a.layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    plain = LlamaModel(cfg).to(a.device, torch.bfloat16).eval()
    tuned = tunedb.optimize(copy.deepcopy(plain), inplace=False)
    twin = copy.deepcopy(plain)
    private_code(tuned)
    private_code(twin)
    ids = torch.randint(0, 128, (1, 1), device=a.device)
    torch.set_grad_enabled(False)
    rows, guard_lists = [], {}
    for name, model in (("plain", plain), ("tunedb", tuned), ("plain (copy)", twin)):
        torch._dynamo.reset()
        compiled = torch.compile(model.forward, backend=a.backend)
        guard_lists[name] = _guard_lines(lambda compiled=compiled: compiled(input_ids=ids))
        guards = len(guard_lists[name])
        fn = model.forward.__func__
        entries = _debug_get_cache_entry_list(fn.__code__)
        if not entries:
            print(f"{name}: no cache entry on {fn.__code__.co_name}", file=sys.stderr)
            continue
        manager = entries[0].guard_manager
        frame = {"args": (model,), "kwargs": {"input_ids": ids}}
        frame.update(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        if not manager.check(frame):  # a transformers whose wrapper binds self (5.17): the arguments as keywords only
            frame = {**frame, "args": (), "self": model}
        if not manager.check(frame):
            print(f"{name}: the guard check fails on the frame's locals: "
                  f"{manager.check_verbose(frame).verbose_code_parts[:2]}", file=sys.stderr)
            continue
        n = 2000
        times = [timeit.timeit(lambda m=manager, f=frame: m.check(f), number=n) / n * 1e6 for _ in range(a.repeats)]
        rows.append((name, guards, statistics.median(times), min(times)))
    print(f"torch {torch.__version__}, {a.layers} layers, backend {a.backend}, device {a.device}")
    print(f"{'model':<14}{'guards':>8}{'check us (median)':>20}{'(min)':>8}")
    for name, guards, med, lo in rows:
        print(f"{name:<14}{guards:>8}{med:>20.2f}{lo:>8.2f}")
    if a.diff and "tunedb" in guard_lists and "plain (copy)" in guard_lists:
        from collections import Counter

        more = Counter(guard_lists["tunedb"]) - Counter(guard_lists["plain (copy)"])
        fewer = Counter(guard_lists["plain (copy)"]) - Counter(guard_lists["tunedb"])
        layers = "L['args'][0]._modules['layers']._modules"
        for sign, rows_ in (("+", more), ("-", fewer)):
            for guard, n in sorted(rows_.items()):
                print(f"{sign}{n} {guard.replace(layers, 'LAYERS')[:240]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
