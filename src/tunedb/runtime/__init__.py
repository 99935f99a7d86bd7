"""tunedb at run time: the tuned torch ops, model patching, autotune(), prewarm and the report.

Importing this package registers nothing; ``tunedb.runtime.ops`` registers the ``tunedb::``
custom ops on first import (``import tunedb`` never does).

    ops.py            torch.library ops tunedb::gemm / tunedb::gemm_act, fake kernels, autograd
    launch_table.py   per (epoch, shape) memo of launchers bound once per config
    patching.py       optimize(model): nn.Linear (+ activation) -> TunedLinear
    autotune_cache.py the autotune cache file (versions 1-3), bucketed at-or-above lookup
    autotuner.py      autotune(): measure uncovered shapes, publish winners to the user tier
    prewarm.py        prewarm(model, ...): measure must-tune points before capture; strict mode
    confirm.py        confirm(model, ...): Triton picks timed inside the captured model vs torch
    report.py         tuning_report(): per-family, per-model tier counts
"""
