"""tunedb at run time: selection, the launch table, the generic call path, optimize(), autotune(),
prewarm, confirm and the report. A family's own ops and patching live in its package
(families/gemm/ops.py, families/gemm/patching.py) and are reached through its hooks.

Importing this package registers nothing (``import tunedb`` never does); a family's ops are
registered on first use of its ops module (dispatch.ensure_ops runs its register_ops hook).

    selector.py       user > system > cost model > default, memoised per (epoch, shape), counted
    serving.py        the serving-key walk and the model tier's candidates (selector and oracle)
    launch_table.py   per (epoch, shape) memo of launchers bound once per config (GEMM's ops)
    dispatch.py       the run-time call path for any family: call key -> resolution -> launch
    patching.py       optimize(model): every family's patches
    autotune_cache.py the autotune cache file (versions 1-3), bucketed at-or-above lookup
    autotuner.py      autotune(): measure uncovered shapes, publish winners to the user tier
    prewarm.py        prewarm(model, ...): measure must-tune points before capture; strict mode
    confirm.py        confirm(model, ...): picks timed inside the captured model vs the fallback
    report.py         tuning_report(): per-family, per-model tier counts
"""
